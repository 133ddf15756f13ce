"""Supervised fine-tuning of the policy (kevin_jax.policy_init.run_sft with absl flags): the run config's model, tokenizer and
prompts, its warm_start section's optimiser settings and data, written as an HF checkpoint directory.

    python launch/sft.py --config=configs/one_gpu.py --workdir=workdirs/sft_one_gpu               # shipped corpus
    python launch/sft.py --config=configs/one_gpu.py --workdir=workdirs/sft_traces \
        --config.warm_start.corpus=/data/traces.jsonl --config.warm_start.steps=1000

Data: --config.warm_start.corpus = "builtin" (kevin_jax/data/warm_start_corpus.jsonl) or a JSONL of corpus records,
{"prompt": ..., "response": ...} or {"messages": [...]} (kevin_jax/sft.py). RL then starts from the result:
    python launch/train.py --config=configs/one_gpu.py --workdir=workdirs/rl --config.model.shape= \
        --config.model.hf_checkpoint=workdirs/sft_one_gpu --config.warm_start.steps=0
"""
import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)      # configs/*.py import configs.common

from kevin_jax import run_config  # noqa: E402  (no jax: the GPU placement is set before JAX starts)

_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(REPO_ROOT, "configs", "one_gpu.py"),
                                          "Run config (an ml_collections config file).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (new or empty): the HF checkpoint.", required=True)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    logging.getLogger("absl").setLevel(logging.WARNING)
    # GPU placement goes into the environment before anything imports jax.
    from cuda_eval.api import visible_gpu_count
    from kevin_jax.placement import GpuConfig, apply_gpu_placement
    apply_gpu_placement(GpuConfig(**config.gpu), config.eval.devices, visible_gpu_count())

    from kevin_jax import policy_init, sft
    try:
        policy_init.run_sft(config, _WORKDIR.value)
    except (sft.SFTDataError, FileExistsError) as e:
        logging.error("%s", e)
        sys.exit(2)


if __name__ == "__main__":
    run_config.launch(main)
