"""One GPU, nothing to download: a Qwen2.5-0.5B-shaped policy with the built-in tokenizer on the 17 built-in tasks.

A 400-step supervised warm start on the shipped corpus (warm_start.corpus="builtin": correct, wrong and
non-compiling answers, and refinement turns) teaches the random policy the answer format; then 10 RL steps of 4 tasks
x 8 trajectories x 4 turns, 2 updates each, every kernel compiled, checked and timed by cuda_eval on the same GPU
(JAX capped at 50% of its memory, the rest for cuda_eval's workers).

Command (the README's main command; one H100 or H200):
  python launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_one_gpu

What to expect on one H100 with 16 cores (docs/LOG.md, "length-bucketed warm-start batches: measured"): the warm
start takes 3.4 minutes (0.36-0.48 s/step on length-bucketed batches, 35% padding; "warm_start step k/400: answer NLL
..." lines), then per RL step a "round r (group g/2): ..., generate ..s, evaluate ..s, .. correct" line per turn of
each pipeline group (the step's tasks in two groups, one evaluated while the other samples), an "episode of step k"
line and "step k/10: score ..., correct ..., speedup ..x, fast_1 .., ..., episode ..s (.. x max), update ..s, MFU
update ..%". The first RL step takes 4.4 minutes (episode 233 s with cold JAX compiles and nvcc builds, 1.10 x
max(sampling, evaluation), update 31 s), so it completes 7.85 minutes after the start (first step: score 0.88,
correct 0.69; with random warm-start batches 8.9 minutes, score 1.10, correct 0.73). The whole 10-step run: not
measured yet. 150 warm-start steps were too few: no correct kernel, every advantage zero (docs/LOG.md, "a start-up
bug found and fixed"). To warm-start once for several RL runs, run launch/sft.py with
this config (README, "Warm start once, several RL runs").
"""
from configs import common


def get_config():
    c = common.base()
    c.total_steps = 10
    c.model.shape = "qwen2.5_0.5b"
    c.env.num_trajectories = 8
    c.env.max_prompt_tokens = 6144
    c.env.max_response_tokens = 2048
    c.sampler.max_slots = 32
    c.sampler.max_seq_len = 8192
    c.rl.tasks_per_step = 4
    c.rl.micro_batch_tokens = 32768
    c.rl.pack = False                         # right-padded rows: cuDNN flash attention in the update
    c.optim.learning_rate = 1e-5
    c.gpu.jax_memory_fraction = 0.5
    c.warm_start.steps = 400                # 150 left NLL 0.72 and no parseable kernels (docs/LOG.md)
    c.warm_start.learning_rate = 3e-4
    c.warm_start.length_buckets = 8           # batches of similar length: 35% padding instead of 58% (docs/LOG.md)
    c.warm_start.corpus = "builtin"           # mixed-quality, multi-turn examples (kevin_jax/sft.py)
    c.holdout.every_steps = 5
    c.ckpt.every_steps = 5
    return c
