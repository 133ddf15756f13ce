"""One GPU, nothing to download: a Qwen2.5-0.5B-shaped policy with the built-in tokenizer on the built-in tasks.

The randomly initialised policy is first taught the answer format by a short supervised warm start on the shipped
warm-start corpus (warm_start.corpus="builtin": correct, wrong and non-compiling answers per built-in task, plus
refinement turns after compile-error / wrong-output feedback), so that from step 1 it writes a mix of good and bad
CUDA kernels that cuda_eval compiles, runs, checks and times on the same GPU (JAX capped at 50% of the GPU's memory,
the rest for cuda_eval's workers). Per step: 4 tasks x 8 trajectories x 4 turns, 2 updates.

Command (the README's main command):
  python launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_one_gpu

What to expect (measured on an H200, 2026-11-21, docs/LOG.md): start-up and the warm start's compile ~10 s, then
~1.3 s per warm-start step with the answer NLL falling from 12.0 (0.72 after 150 steps, which proved too few: 9-25%
of first answers had a code block and none compiled into a correct kernel, so every advantage was zero; hence 400
steps here; with the corpus (90 training examples, mean 2.3k tokens, longest 6k) a step packs longer rows: measured
3.6 s per step on an H200, NLL 12.0 -> 0.53 after 80 steps, so the 400 steps take ~24 min before the first RL step;
docs/LOG.md, session 5; measured before session 9's fix, since which the warm start uses cuDNN flash attention
as the update does: faster, not yet re-measured). To warm-start once and start several RL runs from it, run
launch/sft.py with this config and pass its output as --config.model.hf_checkpoint (README, "Warm start / SFT");
configs/warm_start_demo.py does the same with an 80M policy.
Then one line per step, "step k/10: score ..., correct ..., sampling ~20-45 s, evaluation ..., update ...,
MFU update ..%"; the first step is slower by JAX compiles and cold nvcc builds (~10 s per
distinct kernel on 16 cores, cached afterwards). TensorBoard: <workdir>/tensorboard (~90 scalars per step).
"""
from configs import common


def get_config():
    c = common.base()
    c.total_steps = 10
    c.model.shape = "qwen2.5_0.5b"
    c.tokenizer.path = ""                     # built-in tokenizer (8192 ids; the 0.5B shape's embedding is larger)
    c.env.num_turns = 4
    c.env.num_trajectories = 8
    c.env.max_prompt_tokens = 6144
    c.env.max_response_tokens = 2048
    c.sampler.max_slots = 32
    c.sampler.max_seq_len = 8192
    c.sampler.kv_cache_fraction = 0.3
    c.rl.tasks_per_step = 4
    c.rl.micro_batch_tokens = 32768
    c.rl.pack = False                         # right-padded rows: cuDNN flash attention in the update
    c.optim.learning_rate = 1e-5
    c.gpu.jax_memory_fraction = 0.5
    c.warm_start.steps = 400                # 150 left NLL 0.72 and no parseable kernels (docs/LOG.md)
    c.warm_start.learning_rate = 3e-4
    c.warm_start.corpus = "builtin"           # mixed-quality, multi-turn examples (kevin_jax/sft.py)
    c.holdout.every_steps = 5
    c.holdout.num_trajectories = 4
    c.ckpt.every_steps = 5
    return c
