"""Mesh, partition rules and sharded forward/backward on 8 fake CPU devices (tests/conftest.py sets XLA_FLAGS)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from kevin_jax import parallel
from kevin_jax.model import qwen2
from kevin_jax.model.shapes import named_config

CONFIG = named_config("tiny").replace(vocab_size=512, num_attention_heads=4, num_key_value_heads=2)
OPTIONS = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="full", attention="xla")
MESHES = [dict(data=8, fsdp=1, tensor=1), dict(data=1, fsdp=8, tensor=1), dict(data=2, fsdp=2, tensor=2),
          dict(data=1, fsdp=4, tensor=2)]


def _batch(batch=8, length=16, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CONFIG.vocab_size, (batch, length)).astype(np.int32)
    lengths = rng.integers(length // 2, length + 1, batch)
    segments = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    return tokens, segments, np.roll(tokens, -1, 1)


def _loss_and_grads(graphdef, state, tokens, segments, targets):
    def loss(params):
        model = nnx.merge(graphdef, params)
        lp = model.token_logprobs(tokens, None, segments, targets, chunk_size=8)
        return -jnp.sum(lp) / jnp.sum(segments), lp

    (value, logprobs), grads = jax.value_and_grad(loss, has_aux=True)(state)
    return value, logprobs, grads


def test_mesh_shapes_and_errors():
    assert parallel.mesh_shape(parallel.ParallelConfig(data=2, fsdp=-1, tensor=2), 8) == (2, 2, 2)
    assert parallel.mesh_shape(parallel.ParallelConfig(), 8) == (1, 8, 1)
    with pytest.raises(ValueError, match="not a multiple"):
        parallel.mesh_shape(parallel.ParallelConfig(tensor=3), 8)
    with pytest.raises(ValueError, match="8 are available"):
        parallel.mesh_shape(parallel.ParallelConfig(data=2, fsdp=2, tensor=1), 8)
    with pytest.raises(ValueError, match="at most one"):
        parallel.mesh_shape(parallel.ParallelConfig(data=-1, fsdp=-1), 8)
    mesh = parallel.make_mesh(parallel.ParallelConfig(data=2, fsdp=2, tensor=2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}


def test_partition_rules_cover_every_parameter():
    state = nnx.state(qwen2.abstract_model(named_config("qwq_32b"), OPTIONS))
    axes = jax.tree_util.tree_leaves(qwen2.param_logical_axes(state), is_leaf=lambda x: isinstance(x, tuple))
    leaves = jax.tree_util.tree_leaves(state)
    assert len(axes) == len(leaves) == 15
    for a, leaf in zip(axes, leaves):
        assert len(a) == len(leaf.shape)
    mesh = parallel.make_mesh(parallel.ParallelConfig(data=1, fsdp=4, tensor=2))
    shardings = qwen2.param_shardings(state, mesh)
    q = shardings["layers"]["attn"]["q_proj"]["kernel"]
    q = getattr(q, "value", q)
    assert q.spec == P(None, "fsdp", "tensor", None)


def test_indivisible_mesh_names_the_dimension():
    state = nnx.state(qwen2.abstract_model(CONFIG, OPTIONS))
    mesh = jax.make_mesh((1, 1, 8), parallel.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with pytest.raises(ValueError, match=r"tensor of size 8 does not divide num_attention_heads=4"):
        qwen2.param_shardings(state, mesh)
    mesh4 = jax.make_mesh((2, 1, 4), parallel.MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with pytest.raises(ValueError, match=r"tensor of size 4 does not divide num_key_value_heads=2"):
        qwen2.param_shardings(state, mesh4)
    # The per-parameter check names the parameter when only a sub-tree is sharded.
    with pytest.raises(ValueError, match=r"layers/attn/k_proj/kernel: dimension 2 \(kv_heads=2\)"):
        qwen2.param_shardings({"layers": {"attn": {"k_proj": {"kernel": state["layers"]["attn"]["k_proj"]["kernel"]}}}},
                              mesh4)
    with pytest.raises(ValueError, match="batch size 6"):
        parallel.check_batch_divisible(6, parallel.make_mesh(parallel.ParallelConfig(data=8, fsdp=1)))


@pytest.fixture(scope="module")
def reference():
    model = qwen2.Qwen2ForCausalLM(CONFIG, OPTIONS, rngs=nnx.Rngs(1))
    graphdef, state = nnx.split(model)
    tokens, segments, targets = _batch()
    value, logprobs, grads = jax.jit(functools.partial(_loss_and_grads, graphdef))(state, tokens, segments, targets)
    return graphdef, state, (tokens, segments, targets), (value, logprobs, grads)


@pytest.mark.parametrize("mesh_kw", MESHES, ids=lambda m: "x".join(f"{k}{v}" for k, v in m.items()))
def test_sharded_forward_and_grads_match_single_device(reference, mesh_kw):
    graphdef, state, batch, (ref_value, ref_logprobs, ref_grads) = reference
    mesh = parallel.make_mesh(parallel.ParallelConfig(**mesh_kw))
    param_shardings = qwen2.param_shardings(state, mesh)
    sharded_state = jax.device_put(state, param_shardings)
    data_sharding = parallel.batch_sharding(mesh)
    batch = [jax.device_put(jnp.asarray(x), data_sharding) for x in batch]
    with parallel.activation_sharding(mesh):
        step = jax.jit(functools.partial(_loss_and_grads, graphdef),
                       out_shardings=(None, data_sharding, param_shardings))
        value, logprobs, grads = step(sharded_state, *batch)
    assert logprobs.sharding.spec == data_sharding.spec
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(logprobs), np.asarray(ref_logprobs), atol=1e-5, rtol=0)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5, rtol=1e-4)


def test_init_sharded_never_materialises_a_full_copy():
    mesh = parallel.make_mesh(parallel.ParallelConfig(data=1, fsdp=4, tensor=2))
    model = qwen2.init_sharded(CONFIG, OPTIONS, mesh, seed=0)
    mlp = model.layers.mlp.gate_proj.kernel[...]
    assert mlp.shape == (CONFIG.num_hidden_layers, CONFIG.hidden_size, CONFIG.intermediate_size)
    shard_shapes = {s.data.shape for s in mlp.addressable_shards}
    assert shard_shapes == {(CONFIG.num_hidden_layers, CONFIG.hidden_size // 4, CONFIG.intermediate_size // 2)}


def test_constrain_is_noop_without_context_and_drops_indivisible_axes():
    x = jnp.ones((1, 4, 8))
    assert parallel.constrain(x, ("batch", "seq", "act_embed")) is x
    mesh = parallel.make_mesh(parallel.ParallelConfig(data=8, fsdp=1))
    with parallel.activation_sharding(mesh):
        y = jax.jit(lambda v: parallel.constrain(v, ("batch", "seq", "act_embed")))(x)   # batch 1 on 8 devices
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_initialize_distributed_single_process_is_noop(monkeypatch):
    for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    assert parallel.initialize_distributed(parallel.ParallelConfig()) is False
    with pytest.raises(ValueError, match="coordinator_address"):
        parallel.initialize_distributed(parallel.ParallelConfig(num_processes=2))
