"""Kevin-32B's recipe (arXiv 2507.11948): QwQ-32B trained by multi-turn GRPO on KernelBench levels 1-2.

180 training / 20 held-out tasks (10% of each level, seeded split written to <workdir>/split.json); per step 8 tasks
x 16 trajectories x 4 turns, each turn's return the gamma = 0.4 discounted sum of its own and later scores
S = 0.3 * correct + speedup * correct, advantages normalised over the 64 turn-samples of a task; 2 gradient steps per
batch (PPO-clip with clip-higher 0.2 / 0.28, Dr. GRPO constant-length normalisation, no KL); AdamW lr 2e-6 constant
after 3% warm-up, gradients clipped to global norm 0.05; responses up to 16k tokens, 22k from step 30;
temperature 0.9.

Command (one node of 8 H200s; JAX and cuda_eval share the GPUs, JAX capped at 85% of each):
  python launch/train.py --config=configs/kevin32b.py --workdir=/ckpt/kevin32b \\
      --config.model.hf_checkpoint=/ckpt/QwQ-32B --config.tasks.kernelbench_dir=/data/KernelBench
(or --config.tasks.parquet=<the Hugging Face export>; with neither, the built-in tasks). 8 H100s lack the memory:
the train step's plan at 16k tokens per sequence needs 88 GB per GPU (docs/LOG.md, "MFU after the remat/log-prob
fixes").

What to expect: not measured yet (never run at this scale): wall time, correctness and speedup curves. A console line
per step (score, correctness, sampling / evaluation / update time); in TensorBoard watch rollout/turn{0..3}/
correct_rate and mean_speedup (should rise over the first tens of steps, later turns above earlier ones),
rollout/not_okay_ratio (near 0; a rise is Kevin's early sign of collapse) and update0/logprob_mismatch_abs (small).
Held-out evaluation every 10 steps. Kill it at any point and re-run the same command to resume.
"""
from configs import common


def get_config():
    c = common.base()
    c.total_steps = 100
    c.response_schedule = "30:22528"
    c.model.shape = ""                      # the policy comes from --config.model.hf_checkpoint=<QwQ-32B dir>
    c.tokenizer.path = "model"
    c.tasks.levels = (1, 2)
    c.tasks.holdout_fraction = 0.1          # 100 tasks per level -> 90 + 90 train, 10 + 10 held out
    c.env.num_turns = 4
    c.env.num_trajectories = 16
    c.env.max_prompt_tokens = 16384
    c.env.max_response_tokens = 16384
    c.sampler.temperature = 0.9
    c.sampler.max_slots = 128               # every trajectory of a round decodes at once
    c.sampler.max_seq_len = 40960           # QwQ's context; >= prompt budget + 22k responses
    c.sampler.kv_cache_fraction = 0.3
    c.rl.tasks_per_step = 8
    c.rl.updates_per_batch = 2
    # One sample per right-padded row: the update's attention is then cuDNN flash (causal); packed rows would use
    # the blockwise attention over the whole row. Rows are padded to a power of two (16k, 32k) or the 40k context.
    c.rl.pack = False
    c.rl.micro_batch_tokens = 8 * 40960     # one row per GPU per micro-batch
    c.rl.logprob_chunk = 512
    c.mesh.fsdp = -1                        # FSDP over the node's 8 GPUs (fp32 master weights + Adam: ~65 GB each)
    c.gpu.jax_memory_fraction = 0.85
    c.holdout.every_steps = 10
    c.holdout.num_trajectories = 4
    c.ckpt.every_steps = 1
    c.ckpt.max_to_keep = 2
    return c
