"""The optimiser state in host memory (kevin_jax.rl.offload): N updates of the tiny model with the master weights and
AdamW moments in pinned_host memory equal N on-device optax updates at float32 tolerance (clipping active, weight
decay, warm-up schedule, FSDP over fake CPU devices); the device copy of the weights is the exact cast of the master;
an offloaded state round-trips through the checkpoint straight into host memory."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import parallel
from kevin_jax.evaluation import policy_source
from kevin_jax.model import qwen2, shapes
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl import loss as rl_loss
from kevin_jax.rl import offload
from kevin_jax.rl import state as rl_state

F32 = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="none", attention="xla")
BF16 = qwen2.ModelOptions(dtype="bfloat16", param_dtype="float32", remat="none", attention="xla")
RL = rl_loss.RLConfig(micro_batch_tokens=4096, min_row_len=64)
# A large learning rate and a small clip norm: every update moves every parameter and clipping is active; warm-up
# gives the optax state its second step count (the schedule's).
OPTIM = rl_state.OptimConfig(learning_rate=3e-3, warmup_fraction=0.25, weight_decay=0.1, grad_clip_norm=0.05)
STEPS = 4
# float32 tolerance: the two paths run the same optax arithmetic in differently fused programs (an ulp or two).
RTOL, ATOL = 2e-6, 1e-8

pytestmark = pytest.mark.skipif(not offload.host_kind_available(), reason="backend without a pinned_host memory")


def _samples(seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(6):
        p, r = int(rng.integers(3, 40)), int(rng.integers(1, 30))
        out.append(rl_batch.Sample(rng.integers(10, 8000, size=p).tolist(), rng.integers(10, 8000, size=r).tolist(),
                                   (-rng.uniform(5, 12, size=r)).tolist(), float(rng.normal())))
    w = rl_loss.aggregation_weights([len(s.response_tokens) for s in out], "constant_length", 64)
    for s, wi in zip(out, w):
        s.weight = float(wi)
    return out


def _mesh(fsdp=2):
    """FSDP over 2 devices (the fake CPU devices; a one-GPU machine runs it on its GPU, with real transfers)."""
    fsdp = min(fsdp, len(jax.devices()))
    return parallel.make_mesh(parallel.ParallelConfig(fsdp=fsdp), devices=jax.devices()[:fsdp])


def _run(options, optim, mesh, steps=STEPS):
    """(final state, per-step stats) of `steps` policy-gradient updates of the tiny model (seeded init)."""
    model = qwen2.init_sharded(shapes.named_config("tiny"), options, mesh, seed=5)
    graphdef, params = nnx.split(model)
    tx = rl_state.make_optimizer(optim, total_updates=8)
    host = rl_state.host_offload(optim, 8, options.compute_dtype)
    updater = rl_state.Updater(graphdef, tx, rl_state.learning_rate_schedule(optim, 8), RL, mesh, 0.9,
                               offload=host, grad_dtype=rl_state.GRAD_DTYPES[optim.grad_dtype])
    state = rl_state.init_state(params, tx, host)
    del params
    history = []
    for step in range(steps):
        mbs, _ = rl_batch.micro_batches(_samples(step), RL, row_divisor=mesh.shape["fsdp"])
        state, stats, _ = updater.update(state, [updater.device_batch(mb) for mb in mbs], first=step % 2 == 0)
        history.append(stats)
    return state, history


def _leaves(tree):
    return [(parallel.path_name(p), np.asarray(x)) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def assert_trees_close(actual, expected, rtol=RTOL, atol=ATOL):
    a, e = _leaves(actual), _leaves(expected)
    assert [n for n, _ in a] == [n for n, _ in e]
    for (name, x), (_, y) in zip(a, e):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def runs():
    mesh = _mesh()
    on_device = _run(F32, OPTIM, mesh)
    offloaded = _run(F32, rl_state.OptimConfig(**{**OPTIM.__dict__, "offload": "pinned_host"}), mesh)
    return on_device, offloaded


def test_offloaded_updates_equal_the_on_device_optax_updates(runs):
    (ref, ref_stats), (off, off_stats) = runs
    assert int(off["updates"]) == int(ref["updates"]) == STEPS
    # the master weights follow the on-device float32 weights, and the device copy is the master (fp32 compute)
    assert_trees_close(off["master"], ref["params"])
    assert_trees_close(off["params"], off["master"], rtol=0, atol=0)
    # the moments and the step counts too
    for name in ("mu", "nu"):
        assert_trees_close(optax.tree_utils.tree_get(off["opt_state"], name),
                           optax.tree_utils.tree_get(ref["opt_state"], name))
    counts = [int(c) for _, c in optax.tree_utils.tree_get_all_with_path(off["opt_state"], "count")]
    assert counts == [int(c) for _, c in optax.tree_utils.tree_get_all_with_path(ref["opt_state"], "count")]
    assert len(counts) == 2 and set(counts) == {STEPS}
    for a, b in zip(off_stats, ref_stats):
        assert a["grad_norm"] > OPTIM.grad_clip_norm        # clipping was active
        for key in ("grad_norm", "update_norm", "learning_rate", "loss"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, err_msg=key)


def test_the_offloaded_state_lives_in_host_memory(runs):
    _, (off, _) = runs
    kinds = lambda tree: {x.sharding.memory_kind for x in jax.tree.leaves(tree)}
    assert kinds(off["master"]) == {"pinned_host"}
    assert kinds(optax.tree_utils.tree_get(off["opt_state"], "mu")) == {"pinned_host"}
    assert kinds(optax.tree_utils.tree_get(off["opt_state"], "nu")) == {"pinned_host"}
    assert kinds(off["params"]) == {"device"}
    # still sharded like the parameters (each device's shard in its host's memory)
    specs = {x.sharding.spec for x in jax.tree.leaves(off["master"])}
    assert any("fsdp" in str(s) for s in specs)
    used = offload.state_bytes(off)
    assert used["pinned_host"] > 2 * used["device"]


def test_bf16_weights_on_the_device_are_the_exact_cast_of_the_master():
    mesh = _mesh()
    optim = rl_state.OptimConfig(**{**OPTIM.__dict__, "offload": "pinned_host", "grad_dtype": "bfloat16"})
    state, stats = _run(BF16, optim, mesh, steps=2)
    for (name, p), (_, m) in zip(_leaves(state["params"]), _leaves(state["master"])):
        assert p.dtype == jnp.bfloat16 and m.dtype == np.float32, name
        np.testing.assert_array_equal(p, m.astype(jnp.bfloat16), err_msg=name)
    start = nnx.split(qwen2.init_sharded(shapes.named_config("tiny"), BF16, mesh, seed=5))[1]
    moved = [np.abs(m - np.asarray(s)).max() for (_, m), s in zip(_leaves(state["master"]), jax.tree.leaves(start))]
    assert min(moved) > 0 and all(np.isfinite(s["grad_norm"]) for s in stats)


def test_weight_decay_skips_biases_and_norm_scales_of_the_stacked_layers():
    graphdef, params = nnx.split(qwen2.abstract_model(shapes.named_config("tiny"), F32))
    mask = {parallel.path_name(p): m for p, m in jax.tree_util.tree_flatten_with_path(rl_state.decay_mask(params))[0]}
    assert mask["layers/attn/q_proj/kernel"] and mask["layers/mlp/down_proj/kernel"]
    assert mask["embed_tokens/embedding"] and mask["lm_head/kernel"]
    assert not mask["layers/attn/q_proj/bias"] and not mask["layers/input_norm/scale"]
    assert not mask["final_norm/scale"]


def test_offloaded_state_checkpoints_and_restores_into_host_memory(tmp_path, runs):
    _, (off, _) = runs
    mesh = _mesh()
    optim = rl_state.OptimConfig(**{**OPTIM.__dict__, "offload": "pinned_host"})
    tx = rl_state.make_optimizer(optim, total_updates=8)
    ckpt = ckpt_lib.Checkpointer(tmp_path / "ck", ckpt_lib.CheckpointConfig(async_save=False))
    ckpt.save(1, offload.checkpoint_view(off), {"step": 1})
    abstract_params = nnx.split(qwen2.abstract_model(shapes.named_config("tiny"), F32))[1]
    shardings = qwen2.param_shardings(abstract_params, mesh)
    abstract_params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params,
                                   shardings)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    target = offload.checkpoint_view(offload.abstract_state(abstract_params, tx, jnp.float32, replicated))
    restored, meta = ckpt.restore(1, target)
    assert meta == {"step": 1} and "params" not in restored and ckpt.state_keys(1) == {"master", "opt_state",
                                                                                         "updates"}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(restored["master"])} == {"pinned_host"}
    state = offload.restore_params(restored, jnp.float32)
    assert_trees_close(state, off, rtol=0, atol=0)
    # launch/eval.py's policy from an offloaded run's checkpoint: the float32 master, onto the devices
    weights = policy_source._restore_params(ckpt, 1, abstract_params, None, mesh)
    ckpt.close()
    assert {x.sharding.memory_kind for x in jax.tree.leaves(weights)} == {"device"}
    assert_trees_close(weights, off["master"], rtol=0, atol=0)


def test_bad_offload_settings_are_clear_errors():
    with pytest.raises(ValueError, match="optim.offload must be one of"):
        rl_state.OptimConfig(offload="cpu")
    with pytest.raises(ValueError, match="grad_dtype='bfloat16' needs optim.offload"):
        rl_state.OptimConfig(grad_dtype="bfloat16")
    with pytest.raises(ValueError, match="optim.grad_dtype must be one of"):
        rl_state.OptimConfig(grad_dtype="float16", offload="pinned_host")


def test_the_host_buffers_are_made_largest_first(monkeypatch):
    """XLA's pinned pool grows by regions of doubling size and a buffer never spans two: init_state makes the master
    weights and both moments largest first (tests/kevin_jax/test_host_pool.py: QwQ-32B then needs 98 GiB of pool per
    GPU on 4 GPUs, 103 in the trees' order). The order in which host buffers were made, with the same state."""
    mesh = _mesh()
    model = qwen2.init_sharded(shapes.named_config("tiny"), F32, mesh, seed=5)
    _, params = nnx.split(model)
    optim = rl_state.OptimConfig(**{**OPTIM.__dict__, "offload": "pinned_host"})
    tx = rl_state.make_optimizer(optim, total_updates=8)
    made = []
    for name in ("_to_host", "_zeros"):
        real = getattr(offload, name)

        def recording(*args, real=real):
            x = real(*args)
            if x.sharding.memory_kind == "pinned_host":
                made.append(x.addressable_shards[0].data.nbytes)
            return x
        monkeypatch.setattr(offload, name, recording)
    state = rl_state.init_state(params, tx, rl_state.host_offload(optim, 8, F32.compute_dtype))
    n_leaves = len(jax.tree.leaves(params))
    assert len(made) == 3 * n_leaves and len(set(made)) > 2
    assert made == sorted(made, reverse=True)
    # and the state is the one the trees' order made: master = params, moments zero
    for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(state["master"])):
        np.testing.assert_array_equal(np.asarray(p, np.float32), np.asarray(m))
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(optax.tree_utils.tree_get(state["opt_state"], "mu")))
