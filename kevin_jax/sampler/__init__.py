"""The JAX sampler: paged KV cache, continuous batching, prefix sharing, temperature / top-k / top-p sampling.

Entry points: `SamplerPolicy` (Contract 2), `SamplerEngine` (lower level: results with policy log-probs and stats),
`SamplerConfig` (the `sampler` config section).
"""
from kevin_jax.sampler.config import SamplerConfig
from kevin_jax.sampler.engine import GenerateStats, SampleResult, SamplerEngine
from kevin_jax.sampler.policy import SamplerPolicy, StopStringCheck

__all__ = ["GenerateStats", "SampleResult", "SamplerConfig", "SamplerEngine", "SamplerPolicy", "StopStringCheck"]
