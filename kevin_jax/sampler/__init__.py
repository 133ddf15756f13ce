"""The JAX sampler: paged KV cache, continuous batching, prefix sharing, temperature / top-k / top-p sampling.

Entry points: `SamplerPolicy` (Contract 2), `SamplerEngine` (lower level: results with policy log-probs and stats;
`SamplerStream`: requests joining one continuous batch),
`SamplerConfig` (the `sampler` config section). The engine and the policy load on first use: the config section must
import without jax (configs/*.py are read before JAX starts).
"""
from kevin_jax.sampler.config import SamplerConfig

__all__ = ["GenerateStats", "SampleResult", "SamplerConfig", "SamplerEngine", "SamplerPolicy", "SamplerStream",
           "StopStringCheck"]


def __getattr__(name: str):
    if name in ("GenerateStats", "SampleResult", "SamplerEngine", "SamplerStream"):
        from kevin_jax.sampler import engine
        return getattr(engine, name)
    if name in ("SamplerPolicy", "StopStringCheck"):
        from kevin_jax.sampler import policy
        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
