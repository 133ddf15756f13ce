"""The `rl` and `optim` config sections: the policy update (kevin_jax.rl.loss, rl.batch) and its optimiser
(kevin_jax.rl.state). Importable without jax, like every config section (configs/*.py build the run config before
JAX starts)."""
from __future__ import annotations

import dataclasses

LOSS_AGGREGATIONS = ("constant_length", "token_mean", "sequence_mean")
OLD_LOGPROBS = ("sampler", "trainer")
OFFLOAD_MODES = ("none", "pinned_host")          # kevin_jax.rl.offload
GRAD_DTYPE_NAMES = ("float32", "bfloat16")       # kevin_jax.rl.state.GRAD_DTYPES
MU_DTYPE_NAMES = ("float32", "bfloat16")         # optim.mu_dtype (kevin_jax.rl.state.MU_DTYPES)
MOMENT_BYTES = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass
class RLConfig:
    """The policy update (config section `rl`).

    tasks_per_step: tasks drawn per RL step (Kevin: 8); each gets env.num_trajectories trajectories.
    updates_per_batch: gradient steps per batch of rollouts (Kevin: 2; the first on-policy, the rest off-policy).
    clip_eps_low, clip_eps_high: the PPO ratio is clipped to [1 - eps_low, 1 + eps_high] (clip-higher: 0.2 / 0.28).
    loss_aggregation: how token losses become the batch loss: "constant_length" (Dr. GRPO, Kevin: sum over tokens /
      (samples * constant_length)), "token_mean" (sum / all model tokens of the batch), "sequence_mean" (mean over
      each sample's tokens, then over samples). (How a turn's return combines later scores is
      reward.return_aggregation.)
    constant_length: the constant of loss_aggregation="constant_length"; 0 = the largest max_response_tokens of the run.
    kl_coef: weight of the k3 KL estimate to the reference policy (the initial parameters); 0 = off (Kevin), and then
      no reference copy is kept.
    old_logprobs: "sampler" or "trainer" (kevin_jax.rl.loss says what each means).
    tis_cap: truncated importance-sampling cap for old_logprobs="trainer"; 0 = off.
    skip_zero_advantage: leave samples with advantage 0 out of the update (with kl_coef 0 they add nothing to the
      loss or gradient: pure savings; they still count in loss_aggregation's denominators).
    micro_batch_tokens: tokens (rows x row length) per micro-batch; gradients are accumulated over micro-batches.
    pack: pack several samples per row (segment ids); False = one sample per right-padded row (cuDNN attention).
    row_len: tokens per row; 0 = automatic: a power of two >= the longest sample of the batch (at least
      min_row_len), so a run compiles the update for a handful of shapes. A fixed row_len (>= sampler.max_seq_len)
      means one shape for the whole run and less padding than powers of two at long lengths (Kevin's 40k context).
    row_len_step: with pack=False, > 0 gives every micro-batch its own row length: samples sorted by length are cut
      into micro-batches in that order, each with rows as long as its longest sample rounded up to a multiple of
      row_len_step (kevin_jax.rl.batch, "bucketed rows"), so that a few long samples pad only their own
      micro-batch; 0 = one row length for the whole batch (row_len, or the power of two of its longest sample).
    min_row_len: shortest automatic row length.
    logprob_chunk: positions per logits chunk in the log-prob computation (memory ~ rows * chunk * vocab * 4 B).
    compile_only_score: without a GPU (compile-only verdicts: nothing runs, correctness is unknown) the reward is
      replaced by this score for a kernel that compiled, so that the CPU loop has a learning signal. Every metric of
      such a run is tagged compile_only/. Ignored with a GPU.
    replay: a benchmark mode that is not training (kevin_jax.env.replay): "" = off; "builtin" = the sampler ignores
      its stop tokens (every response runs to full length) and the evaluator judges, in place of each sampled answer,
      a real answer of its task (the shipped solutions and the warm-start corpus: correct, wrong and non-compiling
      kernels), so that the rewards, advantages and gradients are not zero. Built-in tasks only. Every log line says
      [replay], every metric is under replay/.
    """
    tasks_per_step: int = 8
    updates_per_batch: int = 2
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    loss_aggregation: str = "constant_length"
    constant_length: int = 0
    kl_coef: float = 0.0
    old_logprobs: str = "sampler"
    tis_cap: float = 0.0
    skip_zero_advantage: bool = True
    micro_batch_tokens: int = 65536
    pack: bool = True
    row_len: int = 0
    row_len_step: int = 0
    min_row_len: int = 256
    logprob_chunk: int = 1024
    compile_only_score: float = 0.3
    replay: str = ""

    def __post_init__(self):
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"rl.loss_aggregation must be one of {LOSS_AGGREGATIONS}, got {self.loss_aggregation!r}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"rl.old_logprobs must be one of {OLD_LOGPROBS}, got {self.old_logprobs!r}")
        if self.tis_cap and self.old_logprobs != "trainer":
            raise ValueError("rl.tis_cap corrects the trainer's old log-probs towards the sampler's: it needs "
                             "rl.old_logprobs='trainer' (with 'sampler' the ratio already uses the sampler's)")
        for name in ("tasks_per_step", "updates_per_batch", "micro_batch_tokens", "min_row_len", "logprob_chunk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"rl.{name} must be positive, got {getattr(self, name)}")
        if not (0 <= self.clip_eps_low < 1 and self.clip_eps_high >= 0):
            raise ValueError(f"rl.clip_eps_low must be in [0, 1) and clip_eps_high >= 0, got {self.clip_eps_low}, "
                             f"{self.clip_eps_high}")
        if self.kl_coef < 0 or self.tis_cap < 0 or self.constant_length < 0 or self.row_len < 0:
            raise ValueError("rl.kl_coef, rl.tis_cap, rl.constant_length and rl.row_len must be >= 0")
        if self.replay not in ("", "builtin"):
            raise ValueError(f"rl.replay must be '' (off) or 'builtin', got {self.replay!r}")
        if self.row_len_step < 0:
            raise ValueError(f"rl.row_len_step must be >= 0 (0 = one row length per batch), got {self.row_len_step}")
        if self.row_len_step and (self.pack or self.row_len):
            raise ValueError("rl.row_len_step (a row length per micro-batch, one sample per row) needs rl.pack=False "
                             "and rl.row_len=0 (a fixed row length for the whole run)")

    @property
    def skips_zero_advantage(self) -> bool:
        return self.skip_zero_advantage and self.kl_coef == 0


@dataclasses.dataclass
class OptimConfig:
    """The optimiser (config section `optim`). Kevin: AdamW, lr 2e-6 constant after a 3% linear warm-up, gradients
    clipped to global norm 0.05.

    learning_rate: peak (= constant) learning rate.
    warmup_fraction: share of all optimiser updates spent warming up linearly from 0.
    b1, b2, eps: Adam moments.
    weight_decay: decoupled weight decay, applied to matrices only (not norms or biases).
    grad_clip_norm: clip gradients to this global norm (0 = no clipping).
    offload: where the float32 master weights and AdamW moments live. "none": on the GPUs, next to the weights
      (which are then the float32 master). "pinned_host": in host RAM (JAX's pinned_host memory), streamed through
      the GPU one layer at a time by the update; the GPUs keep the weights in the compute dtype (model.dtype).
      kevin_jax.rl.offload; docs/ARCHITECTURE.md says why this mechanism.
    grad_dtype: dtype of the gradient sum over micro-batches on the GPUs: "float32", or "bfloat16" (half the
      memory, for nodes where float32 gradients do not fit: each micro-batch's gradient is added in bf16, relative
      rounding ~2^-9 per addition; needs offload, whose update reads the sum in float32).
    mu_dtype: dtype AdamW stores its first moment in (optax's mu_dtype): "float32", or "bfloat16" (2 bytes a
      parameter less; the step's arithmetic stays float32, only the stored EMA is rounded, and its error stays
      within ~b1 / (1 - b1) roundings of bf16, ~3.5% of the moment: tests/kevin_jax/rl/test_moment_dtype.py). The
      second moment stays float32 (with b2 = 0.999 a bf16 EMA cannot move: 1 - b2 is under bf16's rounding).
    """
    learning_rate: float = 2e-6
    warmup_fraction: float = 0.03
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip_norm: float = 0.05
    offload: str = "none"
    grad_dtype: str = "float32"
    mu_dtype: str = "float32"

    def __post_init__(self):
        if self.learning_rate <= 0:
            raise ValueError(f"optim.learning_rate must be positive, got {self.learning_rate}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"optim.warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.weight_decay < 0 or self.grad_clip_norm < 0:
            raise ValueError("optim.weight_decay and optim.grad_clip_norm must be >= 0")
        if self.offload not in OFFLOAD_MODES:
            raise ValueError(f"optim.offload must be one of {OFFLOAD_MODES}, got {self.offload!r}")
        if self.grad_dtype not in GRAD_DTYPE_NAMES:
            raise ValueError(f"optim.grad_dtype must be one of {GRAD_DTYPE_NAMES}, got {self.grad_dtype!r}")
        if self.mu_dtype not in MU_DTYPE_NAMES:
            raise ValueError(f"optim.mu_dtype must be one of {MU_DTYPE_NAMES}, got {self.mu_dtype!r}")
        if self.grad_dtype == "bfloat16" and self.offload == "none":
            raise ValueError("optim.grad_dtype='bfloat16' needs optim.offload='pinned_host' (its update reads the bf16 "
                             "gradient sum in float32 one layer at a time; the on-device optax update would clip and "
                             "apply it in bf16)")

    def state_bytes_per_param(self) -> int:
        """Bytes of optimiser state per parameter: the float32 master weights (with offload; the weights themselves
        without), AdamW's first moment in mu_dtype and its float32 second moment (kevin_jax.placement sizes the
        pinned-host pools from it)."""
        return 4 + MOMENT_BYTES[self.mu_dtype] + 4
