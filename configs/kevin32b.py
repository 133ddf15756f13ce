"""Kevin-32B's recipe (arXiv 2507.11948): QwQ-32B trained by multi-turn GRPO on KernelBench levels 1-2.

180 training / 20 held-out tasks (10% of each level, seeded split written to <workdir>/split.json); per step 8 tasks
x 16 trajectories x 4 turns, each turn's return the gamma = 0.4 discounted sum of its own and later scores
S = 0.3 * correct + speedup * correct, advantages normalised over the 64 turn-samples of a task; 2 gradient steps per
batch (PPO-clip with clip-higher 0.2 / 0.28, Dr. GRPO constant-length normalisation, no KL); AdamW lr 2e-6 constant
after 3% warm-up, gradients clipped to global norm 0.05; responses up to 16k tokens, 22k from step 30;
temperature 0.9.

Command (one node; JAX and cuda_eval share its GPUs):
  python launch/train.py --config=configs/kevin32b.py --workdir=/ckpt/kevin32b \\
      --config.model.hf_checkpoint=/ckpt/QwQ-32B --config.tasks.kernelbench_dir=/data/KernelBench
(or --config.tasks.parquet=<the Hugging Face export>; with neither, the built-in tasks). Evaluating a checkpoint a
user brings (Kevin-32B's public float32 weights, or any Qwen2 HF directory; its config.json gives the architecture):
  python launch/eval.py --config=configs/kevin32b.py --checkpoint=/ckpt/Kevin-32B --out=/ckpt/kevin32b-eval \\
      --trajectories=16 --turns=8 --config.tasks.kernelbench_dir=/data/KernelBench
The node's layout is chosen
from the GPUs nvidia-smi lists (how many, how much memory each: kevin_jax/hardware.py), or named after the file name:
--config=configs/kevin32b.py:h100x4 (h100x4, h100x8, h200x4, h200x8; 80 GB cards count as H100, 141 GB as H200).

Which nodes fit (the memory plan: deviceless XLA:GPU compiles of the trainer's two programs, the micro-batch gradient
step and the optimiser step, per GPU; docs/LOG.md, "the memory plan with the optimizer state in host memory"). The
gradient step holds the weights, the gradient sum, one micro-batch's gradient and its activations (remat=full, one
row per GPU: the sample padded to 16k, 32k or 40k tokens; two rows of 8k count as 16k); the JAX pool
(gpu.jax_memory_fraction of HBM) must hold its peak, and between updates the sampler's KV cache may use what the
state on the GPU leaves of the pool; cuda_eval has the rest of each GPU.
  layout  optimiser state  gradient sum  peak GB at 16k / 22k / 32k / 40k tokens  pool GB  KV room GB  cuda_eval GB
  h200x8  host RAM         float32       52.5 / 57.8 / 67.3 / 73.9                120      112         21
  h100x8  host RAM         bfloat16      44.1 / 49.4 / 59.5 / 66.7                72       64          8
  h200x4  host RAM         float32       87.0 / 92.6 / 102.2 / 110.2              120      103         21
  h100x4  host RAM         bfloat16      70.7 / 76.5 / 85.8 / 93.8 (12k: 66.7)    72       56          8
(Compiled for the H100; the H200 target adds 1.1-1.6 GB in the two cases checked.) The state on the GPUs instead
(optim.offload=none, 8 x H200): 103 / 108.5 / 118.2 / 126.2 GB, over the pool at 40k rows, so every layout keeps
the float32 master weights and AdamW moments in host RAM, the first moment in bf16 (optim.mu_dtype: 328 GB, in
pinned pools of 336 GiB on 4 GPUs, 344 on 8, sized by kevin_jax/placement.py's model of XLA's allocator; streamed
through the GPUs once per update, a few seconds). Host memory by part (GiB; the trainer's 40 measured on 4 GPUs):
  node             pools  trainer  evaluator (GPUs, spares each, builds)  checkpoint  kernel + floor  left
  4 GPUs, 503 GiB  336    40       40.2 (4, 1, 6 builds of 4.3)           7.5         15.1            64
  8 GPUs, 560 GiB  344    40       69.6 (8, 2, 8 builds of 4.3)           7.5         16.8            82
h100x4 cannot hold Kevin's rows: its layout caps them at 12,288 tokens (env.max_prompt_tokens=4096,
env.max_response_tokens=8192 throughout; a departure from the recipe, logged at start). The others run the recipe as
published. Checkpoints need a volume of 328 GB x (ckpt.max_to_keep + 1) (--config.ckpt.dir; the trainer checks the
free space at start): a 4-GPU node's 235 GB local disk holds none.

What to expect, measured with random weights (docs/LOG.md, "Kevin-32B's first full-size updates" and the entries it
cites): load 12-16 s, the host state built in ~130 s; on 4 x H200 (h200x4) two capped RL steps ran with both updates
each: 6.5 s of gradients per update of 32k tokens (24% MFU), 4.8-5.1 s of host optimiser step per update, 91 GB of
HBM per GPU at the peak, 493 of 503 GiB of host memory in use (10.8 GiB available at the least); decode at B = 64
reaches 59-61% of the bandwidth roofline (4 x H200 / 4 x H100), prefill 13k tok/s (4 x H100). The h100x4 layout's
full-depth update has not run. One full step, projected from those rates (512 samples of ~3k prompt + ~6k response
tokens; arithmetic in docs/LOG.md, "the host budget recalibrated"): ~3 h on 4 x H100 or 4 x H200, bound by the
evaluator's builds (512 of them, one at a time beside float32 moments' pools of 440 GiB: ~150 min; 6 at a time
beside the bf16 first moment's 336 GiB, as the layouts now run but no GPU has yet: ~21 min), the two updates
~34 min at the measured 24% MFU and decoding ~17-30 min; ~33 min on 8 x H200 (decoding ~8 min and 8 builds at once
~16 min side by side, then the updates ~17 min), bound by the updates. The plan written before these runs (~1.5 h on
4 x H200, bound by the updates) assumed longer samples (~4k + 12k tokens), 40% MFU and no limit on builds.

A console line per step (score, correctness, sampling / evaluation / update / optimizer / checkpoint time, peak HBM,
host RSS); in TensorBoard watch rollout/turn{0..3}/correct_rate and mean_speedup (should rise over the first tens of
steps, later turns above earlier ones), rollout/not_okay_ratio (near 0; a rise is Kevin's early sign of collapse)
and update0/logprob_mismatch_abs (small). Held-out evaluation every 10 steps. Kill it at any point and rerun the
same command to resume.
"""
import dataclasses
import logging

from configs import common
from kevin_jax import hardware

log = logging.getLogger("configs.kevin32b")


@dataclasses.dataclass(frozen=True)
class Layout:
    gpus: int
    hbm_gb: int                 # per GPU
    offload: str                # optim.offload
    grad_dtype: str             # optim.grad_dtype
    jax_memory_fraction: float
    max_row_tokens: int = 0     # 0 = the recipe's (prompt 16k + response 22k, QwQ's 40k context)
    eval_spares: int = 2        # eval.spare_workers per GPU
    eval_builds: int = 8        # eval.compile_workers
    ckpt_concurrent_gb: int = 8  # ckpt.concurrent_gb: a checkpoint's bytes in host memory at once


# The evaluator shares the host with the optimiser state's pinned pools (336 GiB on 4 GPUs, 344 on 8, with the first
# moment in bf16): kevin_jax/placement.py counts them, the trainer, the evaluator's processes, the kernel's share and
# the floor the trainer stops at against the host's RAM, and refuses what does not fit. Builds bound a full step
# unless enough run at once to hide evaluation under sampling: 512 builds of ~15 s take ~21 min 6 at a time (the
# 4-GPU nodes' ~17-30 min of sampling), ~16 min 8 at a time (8-GPU nodes); each build holds up to 4.3 GiB with its
# phases side by side. Every GPU runs candidates' kernels. A 4-GPU node of 503 GiB keeps 64 GiB beyond this layout
# (another build per 4.3 GiB), an 8-GPU node of 560 GiB 82.
LAYOUTS = {
    "h200x8": Layout(8, 141, "pinned_host", "float32", 0.85),
    "h100x8": Layout(8, 80, "pinned_host", "bfloat16", 0.90),
    "h200x4": Layout(4, 141, "pinned_host", "float32", 0.85, eval_spares=1, eval_builds=6),
    "h100x4": Layout(4, 80, "pinned_host", "bfloat16", 0.90, max_row_tokens=12288, eval_spares=1, eval_builds=6),
}


def get_config(layout: str = "auto"):
    # "auto": the layout of the GPUs nvidia-smi lists (the paper's 8 x H200 where there is none)
    name = (hardware.detect_layout(LAYOUTS, config="configs/kevin32b.py", without_gpu="h200x8")
            if layout in ("", "auto") else layout)
    if name not in LAYOUTS:
        raise ValueError(f"configs/kevin32b.py:{layout}: unknown layout; known: auto, {', '.join(LAYOUTS)}")
    node = LAYOUTS[name]
    c = common.base()                       # the recipe; below, what it leaves to this file and the node
    c.response_schedule = "30:22528"        # responses up to 16k tokens, 22k from step 30
    c.tokenizer.path = "model"              # QwQ-32B's own tokenizer files
    # One sample per right-padded row: the update's attention is then cuDNN flash (causal); packed rows would use
    # the blockwise attention over the whole row (the full T x T grid, no flash kernel). Each micro-batch has its own
    # row length (its longest sample rounded up to 1k: ~6% padding at a 3-20k length mix, 16 shapes to compile,
    # instead of ~64% with one power-of-two row for the whole batch; benchmarks/update_mfu.py), one row per GPU from
    # 16k up (two of 8k, ...).
    c.rl.pack = False
    c.rl.row_len_step = 1024
    c.rl.micro_batch_tokens = node.gpus * (node.max_row_tokens or 16384)
    c.rl.logprob_chunk = 512
    c.optim.offload = node.offload
    c.optim.grad_dtype = node.grad_dtype
    c.optim.mu_dtype = "bfloat16"           # 2 bytes a parameter of host memory less (the drift: OptimConfig)
    c.gpu.jax_memory_fraction = node.jax_memory_fraction
    c.eval.spare_workers = node.eval_spares
    c.eval.compile_workers = node.eval_builds
    c.ckpt.concurrent_gb = node.ckpt_concurrent_gb
    c.eval.compile_pch_at_start = True      # before the optimiser state fills the host, not beside a build later
    if node.max_row_tokens:
        c.env.max_prompt_tokens = 4096
        c.env.max_response_tokens = node.max_row_tokens - c.env.max_prompt_tokens
        c.response_schedule = ""
        c.sampler.max_seq_len = node.max_row_tokens
    c.holdout.every_steps = 10
    c.ckpt.max_to_keep = 2
    log.info("configs/kevin32b.py: layout %s (%s): optimiser state %s, gradient sum in %s, JAX pool %.0f%% of each "
             "GPU%s", name, "named" if name == layout else "detected",
             "in host memory" if node.offload != "none" else "on the GPUs", node.grad_dtype,
             100 * node.jax_memory_fraction,
             f"; rows capped at {node.max_row_tokens} tokens (prompts {c.env.max_prompt_tokens}, responses "
             f"{c.env.max_response_tokens}: the recipe's do not fit)" if node.max_row_tokens else "")
    return c
