"""ModelOptions: how the model runs (config section `model`, with run_config.ModelSource). Importable without jax,
like every config section (configs/*.py build the run config before JAX starts); the dtypes and precision it names
are resolved on first use."""
from __future__ import annotations

import dataclasses

DTYPE_NAMES = ("float32", "bfloat16", "float16")
# kevin_jax.model.qwen2.REMAT_POLICIES holds the jax policy of each name.
REMAT_POLICY_NAMES = ("none", "full", "dots", "dots_no_batch", "dots_attn", "qkv_attn", "attn_out")
ATTENTION_IMPLS = ("auto", "cudnn", "xla", "chunked")


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """How the model runs (none of this changes the checkpoint).

    Attributes:
      dtype: compute dtype of activations and matmuls ("bfloat16" for training, "float32" for parity tests).
      param_dtype: storage dtype of parameters ("float32" master weights, or "bfloat16" to halve their memory).
      remat: rematerialisation policy of the scanned layer body: one of REMAT_POLICY_NAMES (kevin_jax.model.qwen2
        says what each saves).
      attention: "auto" (cuDNN flash on GPU for right-padded bf16/fp16 batches; otherwise XLA up to 4096 tokens and
        "chunked" beyond), "cudnn", "xla" (materialises [B, H, T, T] scores), or "chunked" (pure-JAX blockwise
        attention over query chunks, O(T * attention_chunk) memory; runs anywhere, e.g. packed batches on GPU,
        long sequences on CPU, AOT memory plans).
      attention_chunk: query-chunk length of the "chunked" attention.
      matmul_precision: "default" or "highest" (full fp32 matmuls on GPU, for parity checks).
      scan_layers: True runs the decoder layers with jax.lax.scan (one compiled layer body: compile time independent
        of depth); False unrolls them into a Python loop. Unrolled, the activations saved for the backward pass are
        separate buffers instead of slices of [num_layers, ...] stacks that the scan zero-fills and copies into (on an
        H200 that traffic is ~5% of a qwen2.5-1.5B training step), at the price of compile time growing with depth.
    """
    dtype: str = "bfloat16"
    param_dtype: str = "float32"
    remat: str = "full"
    attention: str = "auto"
    attention_chunk: int = 512
    matmul_precision: str = "default"
    scan_layers: bool = True

    def __post_init__(self):
        for name, allowed in (("dtype", DTYPE_NAMES), ("param_dtype", DTYPE_NAMES), ("remat", REMAT_POLICY_NAMES),
                              ("attention", ATTENTION_IMPLS), ("matmul_precision", ("default", "highest"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ModelOptions.{name}={getattr(self, name)!r}; choose one of {sorted(allowed)}")
        if self.attention_chunk <= 0:
            raise ValueError(f"ModelOptions.attention_chunk must be positive, got {self.attention_chunk}")

    @property
    def compute_dtype(self):
        import jax.numpy as jnp
        return getattr(jnp, self.dtype)          # jnp.bfloat16, ...

    @property
    def storage_dtype(self):
        import jax.numpy as jnp
        return getattr(jnp, self.param_dtype)

    @property
    def precision(self):
        import jax
        return jax.lax.Precision.HIGHEST if self.matmul_precision == "highest" else None
