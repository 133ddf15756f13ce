"""Train a policy by multi-turn RL on CUDA kernel tasks (kevin_jax.train.run with absl flags).

    python launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_one_gpu
    python launch/train.py --config=configs/kevin32b.py --workdir=/ckpt/kevin32b \
        --config.model.hf_checkpoint=/ckpt/QwQ-32B --config.reward.gamma=0.8

Any config field can be overridden with --config.<section>.<field>=<value>. Re-running with the same workdir resumes.
Multi-host: start one process per host with --config.mesh.coordinator_address=host0:1234
--config.mesh.num_processes=N --config.mesh.process_id=i (or let SLURM / Open MPI provide them).
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
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, TensorBoard, trajectories.",
                               required=True)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    logging.getLogger("absl").setLevel(logging.WARNING)   # orbax's per-save chatter; our own lines stay INFO
    # GPU placement goes into the environment before anything imports jax.
    from cuda_eval.api import visible_gpu_count
    from kevin_jax.placement import NoGpuError, place_run
    place_run(config, visible_gpu_count())

    from kevin_jax import train
    from kevin_jax.host_memory import EXIT_STATUS, HostMemoryError
    try:
        train.run(config, _WORKDIR.value)
    except NoGpuError as e:
        logging.error("%s", e)
        sys.exit(2)
    except HostMemoryError as e:      # logged with its numbers when it was raised
        logging.error("stopped: %s", e)
        sys.exit(EXIT_STATUS)


if __name__ == "__main__":
    run_config.launch(main)
