"""The sampler on sharded parameters (8 fake CPU devices, tests/conftest.py): same tokens as on one device, no copy
of the parameters, KV pool split over the tensor axis."""
import jax
import numpy as np
import pytest
from flax import nnx

from kevin_jax import parallel
from kevin_jax.model import qwen2
from kevin_jax.model.shapes import named_config
from kevin_jax.sampler import SamplerConfig, SamplerPolicy

FP32 = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="none", attention="xla",
                          matmul_precision="highest")
CONFIG = named_config("tiny").replace(vocab_size=256)
BASE = SamplerConfig(temperature=0.9, max_slots=4, max_seq_len=64, page_size=4, decode_steps=8, prefill_chunk=16,
                     prefill_tokens=64, attention="xla")


def _cpu_mesh(**axes):
    """8 fake CPU devices (also on a GPU machine, where jax.devices() is the one GPU)."""
    return parallel.make_mesh(parallel.ParallelConfig(**axes), devices=jax.devices("cpu"))


def _sharded(model, mesh):
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.device_put(state, qwen2.param_shardings(state, mesh)))


@pytest.fixture(scope="module")
def models():
    model = qwen2.Qwen2ForCausalLM(CONFIG, FP32, rngs=nnx.Rngs(0))
    prompts = [np.random.default_rng(i).integers(0, 256, n).tolist() for i, n in enumerate([5, 11, 18, 7, 9])]
    return model, prompts


@pytest.mark.parametrize("mesh_kw", [dict(data=1, fsdp=4, tensor=2), dict(data=2, fsdp=4, tensor=1)],
                         ids=["fsdp4_tensor2", "data2_fsdp4"])
def test_sharded_policy_samples_the_same_tokens(models, mesh_kw):
    model, prompts = models
    reference = SamplerPolicy(model, BASE).sample(prompts, 12, seed=4)
    mesh = _cpu_mesh(**mesh_kw)
    sharded_model = _sharded(model, mesh)
    policy = SamplerPolicy(sharded_model, BASE)
    assert policy.engine.mesh is mesh or dict(policy.engine.mesh.shape) == dict(mesh.shape)
    expected_axis = "tensor" if mesh_kw["tensor"] > 1 else None
    assert policy.engine.tensor_axis == expected_axis
    results = policy.sample(prompts, 12, seed=4)
    for a, b in zip(reference, results):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    pool = policy.engine.pool()
    assert (tuple(pool.k.sharding.spec) + (None,))[0] == expected_axis
    # The policy reads the model's own arrays: no copy was made.
    kernel = sharded_model.layers.mlp.up_proj.kernel[...]
    assert nnx.split(policy.model)[1]["layers"]["mlp"]["up_proj"]["kernel"][...] is kernel


def test_sharded_pallas_decode_in_interpret_mode(models):
    model, prompts = models
    config = BASE.replace(max_slots=2, decode_steps=4)
    reference = SamplerPolicy(model, config).sample(prompts[:2], 5, seed=1)
    mesh = _cpu_mesh(data=1, fsdp=4, tensor=2)
    policy = SamplerPolicy(_sharded(model, mesh), config.replace(attention="pallas"))
    results = policy.sample(prompts[:2], 5, seed=1)
    for a, b in zip(reference, results):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_tensor_axis_must_divide_kv_heads(models):
    model, _ = models
    mesh = _cpu_mesh(data=1, fsdp=2, tensor=4)
    with pytest.raises(ValueError, match="does not divide num_key_value_heads=2"):
        SamplerPolicy(model, BASE, mesh=mesh)
