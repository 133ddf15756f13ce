"""The sampler on sharded parameters (fake CPU devices, tests/conftest.py): the trainer's FSDP-sharded parameters are
copied into the sampler's tensor-parallel layout (kevin_jax.sampler.layout) and sampling gives the same tokens and
log-probs as on one device, on meshes of 1, 2, 4 and 8 devices."""
import logging

import jax
import numpy as np
import pytest
from flax import nnx

from kevin_jax import parallel
from kevin_jax.model import qwen2
from kevin_jax.model.shapes import named_config
from kevin_jax.sampler import SamplerConfig, SamplerEngine, SamplerPolicy, layout
from kevin_jax.sampler.engine import params_of

FP32 = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="none", attention="xla",
                          matmul_precision="highest")
CONFIG = named_config("tiny").replace(vocab_size=256)                  # 2 KV heads
# QwQ-32B's head layout in miniature: 8 KV heads (tensor parallelism over 1, 2, 4 or 8 devices), 2 query heads each.
CONFIG_8KV = CONFIG.replace(num_attention_heads=16, num_key_value_heads=8, head_dim=8)
BASE = SamplerConfig(temperature=0.9, max_slots=4, max_seq_len=64, page_size=4, decode_steps=8, prefill_chunk=16,
                     prefill_tokens=64, attention="xla")
GREEDY = BASE.replace(temperature=0.0)
TOL = 1e-5


def _cpu_mesh(devices=8, **axes):
    """Fake CPU devices (also on a GPU machine, where jax.devices() is the GPU)."""
    return parallel.make_mesh(parallel.ParallelConfig(**axes), devices=jax.devices("cpu")[:devices])


def _sharded(model, mesh):
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.device_put(state, qwen2.param_shardings(state, mesh)))


def _prompts(vocab=256):
    return [np.random.default_rng(i).integers(0, vocab, n).tolist() for i, n in enumerate([5, 11, 18, 7, 9])]


@pytest.fixture(scope="module")
def model():
    return qwen2.Qwen2ForCausalLM(CONFIG, FP32, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def model_8kv():
    return qwen2.Qwen2ForCausalLM(CONFIG_8KV, FP32, rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def reference_8kv(model_8kv):
    """One device, no mesh: greedy and T=0.9 results."""
    return {name: SamplerPolicy(model_8kv, config).sample(_prompts(), 12, seed=4)
            for name, config in (("greedy", GREEDY), ("sampled", BASE))}


def _assert_same(reference, results):
    for a, b in zip(reference, results):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=TOL)
        np.testing.assert_allclose(a.policy_logprobs, b.policy_logprobs, atol=TOL)


# Under tensor parallelism: a pool that holds one full sequence and 6 more pages for 4 slots, so that every run also
# admits by free pages and preempts (recomputing the preempted sequence's cache later): the tokens must not change.
SMALL_POOL = GREEDY.replace(num_pages=1 + 16 + 6)


def test_a_one_device_mesh_is_no_mesh(model_8kv):
    assert layout.sampling_mesh(_cpu_mesh(1, fsdp=-1), CONFIG_8KV) is None
    assert SamplerEngine(_sharded(model_8kv, _cpu_mesh(1, fsdp=-1)), GREEDY).mesh is None


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_tensor_parallel_from_fsdp_params_matches_one_device(model_8kv, reference_8kv, devices):
    """The trainer's layout (FSDP over every device) in, tensor parallelism over every device while sampling."""
    trainer_mesh = _cpu_mesh(devices, fsdp=-1)
    sharded = _sharded(model_8kv, trainer_mesh)
    runs = [("greedy", SMALL_POOL)] + ([("sampled", BASE)] if devices == 4 else [])
    for name, config in runs:
        policy = SamplerPolicy(sharded, config)
        assert dict(policy.engine.mesh.shape) == {"data": 1, "fsdp": 1, "tensor": devices}
        assert policy.engine.tensor_axis == "tensor"
        assert list(policy.engine.mesh.devices.flat) == list(trainer_mesh.devices.flat)
        _assert_same(reference_8kv[name], policy.sample(_prompts(), 12, seed=4))
        if config is SMALL_POOL:
            assert policy.last_stats.preemptions > 0
    # The policy read the trainer's arrays and left them as they were (no donation, no copy kept).
    kernel = sharded.layers.mlp.up_proj.kernel[...]
    assert nnx.split(policy.model)[1]["layers"]["mlp"]["up_proj"]["kernel"][...] is kernel
    assert not kernel.is_deleted()
    np.testing.assert_array_equal(np.asarray(kernel), np.asarray(model_8kv.layers.mlp.up_proj.kernel[...]))


def test_weight_copy_and_pool_are_split_by_heads(model_8kv):
    mesh = _cpu_mesh(4, fsdp=-1)
    engine = SamplerEngine(_sharded(model_8kv, mesh), GREEDY)
    weights = engine.weights(params_of(_sharded(model_8kv, mesh)))
    assert len(weights.layers) == CONFIG_8KV.num_hidden_layers and not weights.stacked
    q = weights.layers[0]["attn"]["q_proj"]["kernel"][...]
    assert q.dtype == np.float32 and tuple(q.sharding.spec)[1] == "tensor"
    assert {shard.data.shape for shard in q.addressable_shards} == {(64, 16 // 4, 8)}
    down = weights.layers[1]["mlp"]["down_proj"]["kernel"][...]
    assert down.addressable_shards[0].data.shape == (CONFIG_8KV.intermediate_size // 4, 64)
    assert weights.head.addressable_shards[0].data.shape == (256 // 4, 64)
    assert layout.bytes_per_device(weights) == engine.weight_copy_bytes
    pool = engine.pool()
    assert tuple(pool.k.sharding.spec)[0] == "tensor" and pool.k.addressable_shards[0].data.shape[0] == 8 // 4


def test_mixed_trainer_mesh_and_replicas(model, model_8kv, reference_8kv):
    """fsdp=2 x tensor=2 in the trainer -> tensor=4 while sampling; 2 KV heads on 8 devices -> tensor=2 x 4
    replicas (the slots split over the replicas)."""
    policy = SamplerPolicy(_sharded(model_8kv, _cpu_mesh(4, fsdp=2, tensor=2)), SMALL_POOL)
    assert dict(policy.engine.mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 4}
    _assert_same(reference_8kv["greedy"], policy.sample(_prompts(), 12, seed=4))

    reference = SamplerPolicy(model, BASE).sample(_prompts(), 12, seed=4)
    policy = SamplerPolicy(_sharded(model, _cpu_mesh(8, data=2, fsdp=4)), BASE)
    assert dict(policy.engine.mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    _assert_same(reference, policy.sample(_prompts(), 12, seed=4))


def test_scan_layer_loop(model_8kv, reference_8kv):
    """layer_loop="scan": on one device the parameters are read in place (no copy); under tensor parallelism a
    stacked copy in the sampling layout."""
    config = SMALL_POOL.replace(layer_loop="scan")
    one = SamplerEngine(model_8kv, config)
    assert one.weight_copy_bytes == 0
    assert one.weights(params_of(model_8kv)).layers["mlp"]["up_proj"]["kernel"][...] is \
        model_8kv.layers.mlp.up_proj.kernel[...]
    sharded = _sharded(model_8kv, _cpu_mesh(4, fsdp=-1))
    policy = SamplerPolicy(sharded, config)
    assert policy.engine.weight_copy_bytes > 0
    assert policy.engine.weights(params_of(sharded)).stacked
    _assert_same(reference_8kv["greedy"], policy.sample(_prompts(), 12, seed=4))


def test_sharded_pallas_decode_in_interpret_mode(model_8kv, reference_8kv):
    config = BASE.replace(max_slots=2, decode_steps=4)
    reference = SamplerPolicy(model_8kv, config).sample(_prompts()[:2], 5, seed=1)
    policy = SamplerPolicy(_sharded(model_8kv, _cpu_mesh(4, fsdp=-1)), config.replace(attention="pallas"))
    _assert_same(reference, policy.sample(_prompts()[:2], 5, seed=1))


def test_tensor_parallel_size_errors_and_automatic_choice(model):
    assert layout.tensor_parallel_size(CONFIG_8KV, 8) == 8
    assert layout.tensor_parallel_size(CONFIG, 8) == 2
    assert layout.tensor_parallel_size(named_config("qwq_32b"), 4) == 4
    assert layout.tensor_parallel_size(named_config("qwq_32b"), 8) == 8
    mesh = _cpu_mesh(8, fsdp=-1)
    with pytest.raises(ValueError, match="does not divide the model's .*num_key_value_heads"):
        SamplerPolicy(model, BASE.replace(tensor_parallel=4), mesh=mesh)
    with pytest.raises(ValueError, match="tensor_parallel=3 does not divide the 8 devices"):
        SamplerPolicy(model, BASE.replace(tensor_parallel=3), mesh=mesh)


def test_start_up_logs_the_pool_plan(model_8kv, caplog):
    with caplog.at_level(logging.INFO, logger="kevin_jax.sampler.engine"):
        SamplerEngine(_sharded(model_8kv, _cpu_mesh(4, fsdp=-1)), GREEDY.replace(num_pages=40))
    line = next(r.getMessage() for r in caplog.records if "KV pool:" in r.getMessage())
    assert "40 pages x 4 tokens" in line and "4-way tensor parallel" in line and "sequences of 16k" in line
    assert "weight copy per generate call" in line
