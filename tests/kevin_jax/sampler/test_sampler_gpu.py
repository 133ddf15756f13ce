"""The sampler on a GPU: the Pallas paged-attention kernel compiled for real (not interpret mode) against the pure-JAX
path, at head_dim 128 like the real models, in fp32 and bf16; and tensor-parallel over 2 or 4 GPUs. Skipped without a
GPU."""
import jax
import numpy as np
import pytest
from flax import nnx

from kevin_jax.model import qwen2
from kevin_jax.model.shapes import named_config
from kevin_jax.sampler import SamplerConfig, SamplerPolicy

pytestmark = pytest.mark.gpu

# Real head_dim and GQA ratio of qwen2.5_7b (7 query heads per KV head), tiny width and depth.
CONFIG = named_config("tiny").replace(vocab_size=1024, hidden_size=256, num_attention_heads=14, num_key_value_heads=2,
                                      head_dim=128, num_hidden_layers=3)
BASE = SamplerConfig(temperature=0.0, max_slots=8, max_seq_len=1024, page_size=16, decode_steps=32,
                     prefill_chunk=256, attention="xla")


def _model(dtype):
    options = qwen2.ModelOptions(dtype=dtype, param_dtype="float32", remat="none",
                                 matmul_precision="highest" if dtype == "float32" else "default")
    return qwen2.Qwen2ForCausalLM(CONFIG, options, rngs=nnx.Rngs(0))


def _prompts(count=12):
    rng = np.random.default_rng(0)
    return [rng.integers(0, CONFIG.vocab_size, int(n)).tolist() for n in rng.integers(20, 700, count)]


def test_auto_selects_the_compiled_pallas_kernel():
    policy = SamplerPolicy(_model("bfloat16"), BASE.replace(attention="auto"))
    assert policy.engine.decode_impl == "pallas", policy.engine.decode_impl_reason


def test_pallas_matches_xla_fp32():
    """fp32 weights and activations; the kernel's dots run in TF32, so log-probs agree to ~1e-3, tokens exactly."""
    model, prompts = _model("float32"), _prompts()
    xla = SamplerPolicy(model, BASE).sample(prompts, 96, seed=0)
    pallas = SamplerPolicy(model, BASE.replace(attention="pallas")).sample(prompts, 96, seed=0)
    for a, b in zip(xla, pallas):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-3)


def test_pallas_matches_xla_bf16_sampling():
    """bf16, T=0.9: the two attention paths may round differently, so compare each sequence up to its first differing
    token; almost all tokens must agree and the log-probs of agreeing tokens stay within bf16 noise."""
    model, prompts = _model("bfloat16"), _prompts()
    config = BASE.replace(temperature=0.9)
    xla = SamplerPolicy(model, config).sample(prompts, 96, seed=1)
    pallas = SamplerPolicy(model, config.replace(attention="pallas")).sample(prompts, 96, seed=1)
    agreed, worst = 0, 0.0
    for a, b in zip(xla, pallas):
        same = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), len(a.tokens))
        agreed += same
        if same:
            worst = max(worst, float(np.max(np.abs(np.subtract(a.logprobs[:same], b.logprobs[:same])))))
    assert agreed >= 0.8 * sum(len(a.tokens) for a in xla), f"only {agreed} tokens agree"
    assert worst <= 0.1, f"log-probs of agreeing tokens differ by {worst}"
    assert jax.default_backend() == "gpu"


def test_tensor_parallel_pallas_matches_one_gpu():
    """2 or 4 GPUs (skipped on fewer than 2): the trainer's FSDP layout in, the sampler's tensor-parallel copy and
    the compiled Pallas kernel under shard_map; fp32, greedy: the same tokens as on one GPU."""
    from kevin_jax import parallel

    gpus = jax.devices("gpu")
    if len(gpus) < 2:
        pytest.skip("needs 2 or more GPUs")
    n = 4 if len(gpus) >= 4 else 2
    config = CONFIG.replace(num_attention_heads=16, num_key_value_heads=8)
    options = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="none", matmul_precision="highest")
    model = qwen2.Qwen2ForCausalLM(config, options, rngs=nnx.Rngs(0))
    prompts = _prompts(8)
    sampler_config = BASE.replace(attention="pallas")
    one = SamplerPolicy(model, sampler_config).sample(prompts, 64, seed=0)
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=-1), devices=gpus[:n])
    graphdef, state = nnx.split(model)
    sharded = nnx.merge(graphdef, jax.device_put(state, qwen2.param_shardings(state, mesh)))
    policy = SamplerPolicy(sharded, sampler_config)
    assert dict(policy.engine.mesh.shape)["tensor"] == n and policy.engine.decode_impl == "pallas"
    for a, b in zip(one, policy.sample(prompts, 64, seed=0)):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-3)
