"""The whole RL loop on a CPU (CI): a tiny random policy, compile-only verdicts.

No GPU is needed: cuda_eval compiles every kernel with nvcc but runs nothing ("compile_only"), so a kernel's score is
rl.compile_only_score if it compiled, and every metric is tagged compile_only/. A supervised warm start on one
built-in solution (LeakyReLU, for every prompt) first teaches the 2-layer policy to write that kernel, so the
sampled answers are near-copies of it: some compile, some do not, and the advantages are not all zero. Then 3 steps
of 2 tasks x 2 trajectories x 2 turns.

Command (any CPU; nvcc on PATH):
  python launch/train.py --config=configs/tiny_cpu.py --workdir=/tmp/kevin_tiny

What to expect: "warm_start step k/160: answer NLL ..." lines, then "[compile-only] step k/3: score ..., compiled ..."
lines; kill it and re-run the same command: it resumes. Wall time on the shared 2-core dev box (busy with other jobs,
docs/LOG.md, "configs/tiny_cpu.py end to end on the dev box"): 13 minutes, of which the warm start 9.5 (answer NLL
9.0 -> 0.001) and the 3 steps 3.7 (the first with JAX compiles and cold nvcc builds); score 0.150, compiled 0.50.
"""
from configs import common


def get_config():
    c = common.base()
    c.total_steps = 3
    c.model.shape = "tiny"
    c.model.dtype = "float32"                 # bf16 matmuls are slow on CPUs
    c.model.attention = "xla"
    c.model.remat = "none"                    # memory is no concern at this size; recomputation is
    c.env.num_turns = 2
    c.env.num_trajectories = 2
    c.env.max_prompt_tokens = 3072
    c.env.one_shot = False                    # ~400 tokens shorter prompts: half the compute per sample
    c.env.max_response_tokens = 512
    c.sampler.max_slots = 8
    c.sampler.temperature = 0.5               # near the warm-started answer, with some variety
    c.sampler.max_seq_len = 4096
    c.sampler.kv_cache_fraction = 0.0
    c.sampler.prefill_tokens = 4096
    c.sampler.attention = "xla"
    c.eval.mode = "compile_only"
    c.eval.compile_workers = 2
    c.rl.tasks_per_step = 2
    c.rl.micro_batch_tokens = 16384
    c.rl.min_row_len = 1024
    c.rl.logprob_chunk = 512
    c.optim.learning_rate = 1e-4
    c.optim.warmup_fraction = 0.0
    c.warm_start.steps = 160
    c.warm_start.learning_rate = 1e-2
    c.warm_start.batch_size = 2
    c.warm_start.solution_tasks = "L1/1_LeakyReLU"
    c.warm_start.answer_every_prompt = True
    c.holdout.at_end = False
    c.holdout.num_trajectories = 1
    c.ckpt.max_to_keep = 2
    return c
