"""Train state and update (kevin_jax.rl.state): the gradient of a batch does not depend on how it is split into
micro-batches, packed, or spread over (8 fake CPU) devices; the optimiser follows Kevin's schedule."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from kevin_jax import parallel
from kevin_jax.model import qwen2, shapes
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl import loss as rl_loss
from kevin_jax.rl import state as rl_state

OPTIONS = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="full", attention="xla")


def _samples(seed=0, n=7):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p, r = int(rng.integers(3, 40)), int(rng.integers(1, 30))
        out.append(rl_batch.Sample(rng.integers(10, 8000, size=p).tolist(), rng.integers(10, 8000, size=r).tolist(),
                                   (-rng.uniform(5, 12, size=r)).tolist(), float(rng.normal())))
    w = rl_loss.aggregation_weights([len(s.response_tokens) for s in out], "constant_length", 64)
    for s, wi in zip(out, w):
        s.weight = float(wi)
    return out


_MODEL = {}


def _model(mesh):
    """The tiny model, initialised once and re-sharded onto `mesh` (initialisation compiles; it is slow on CI)."""
    if "base" not in _MODEL:
        single = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
        _MODEL["base"] = nnx.split(qwen2.init_sharded(shapes.named_config("tiny"), OPTIONS, single, seed=3))
    graphdef, params = _MODEL["base"]
    # a copy: device_put onto the same sharding may alias the cached arrays, which a donating update would delete
    params = jax.tree.map(jnp.copy, jax.device_put(params, qwen2.param_shardings(params, mesh)))
    return graphdef, params


def _grads(mesh, config: rl_loss.RLConfig, samples, first=True):
    graphdef, params = _model(mesh)
    tx = optax.adamw(1e-3)
    updater = rl_state.Updater(graphdef, tx, optax.constant_schedule(1e-3), config, mesh, temperature=0.9)
    divisor = mesh.shape["data"] * mesh.shape["fsdp"]
    mbs, layout = rl_batch.micro_batches(samples, config, row_divisor=divisor)
    grads, stats, _ = updater.gradients(params, [updater.device_batch(mb) for mb in mbs], first=first)
    return jax.tree.map(np.asarray, grads), stats, layout


@pytest.fixture(scope="module")
def reference():
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    return _grads(mesh, rl_loss.RLConfig(micro_batch_tokens=1 << 16, min_row_len=64), _samples())


def _assert_same(a, b):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a[0])[0], jax.tree.leaves(b[0])):
        np.testing.assert_allclose(y, x, rtol=2e-4, atol=2e-7, err_msg=parallel.path_name(path))
    for key in ("loss", "tokens", "ratio_clip_fraction", "entropy", "logprob_mismatch_abs"):
        np.testing.assert_allclose(b[1][key], a[1][key], rtol=1e-4, err_msg=key)


def test_reference_gradient_is_not_trivial(reference):
    grads, stats, layout = reference
    assert layout.num_micro == 1
    assert stats["tokens"] == sum(len(s.response_tokens) for s in _samples())
    assert optax.global_norm(grads) > 0
    # first update on-policy against the sampler's made-up log-probs: far from 1, so some clipping happens
    assert stats["ratio_clip_fraction"] > 0


def test_micro_batches_give_the_same_gradient(reference):
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    got = _grads(mesh, rl_loss.RLConfig(micro_batch_tokens=64, min_row_len=64), _samples())
    assert got[2].num_micro >= 3
    _assert_same(reference, got)


def test_unpacked_rows_give_the_same_gradient(reference):
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    got = _grads(mesh, rl_loss.RLConfig(micro_batch_tokens=256, min_row_len=64, pack=False), _samples())
    assert got[2].num_rows == len(_samples())
    _assert_same(reference, got)


def test_bucketed_rows_give_the_same_gradient(reference):
    """A row length per micro-batch (rl.row_len_step): micro-batches of different shapes, one sample per row."""
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    got = _grads(mesh, rl_loss.RLConfig(micro_batch_tokens=96, min_row_len=16, pack=False, row_len_step=16),
                 _samples())
    assert len({length for _, length in got[2].shapes}) >= 2
    _assert_same(reference, got)


def test_bucketed_rows_on_eight_devices_give_the_same_gradient(reference):
    mesh = parallel.make_mesh(parallel.ParallelConfig(data=2, fsdp=2, tensor=2), devices=jax.devices()[:8])
    got = _grads(mesh, rl_loss.RLConfig(micro_batch_tokens=256, min_row_len=16, pack=False, row_len_step=32),
                 _samples())
    assert all(rows % 4 == 0 for rows, _ in got[2].shapes) and got[2].num_micro >= 2
    _assert_same(reference, got)


def test_eight_devices_give_the_same_gradient(reference):
    assert len(jax.devices()) >= 8, "conftest should provide 8 fake CPU devices"
    mesh = parallel.make_mesh(parallel.ParallelConfig(data=2, fsdp=2, tensor=2), devices=jax.devices()[:8])
    got = _grads(mesh, rl_loss.RLConfig(micro_batch_tokens=128, min_row_len=64), _samples())
    assert got[2].rows_per_micro % 4 == 0
    _assert_same(reference, got)


def test_learning_rate_schedule_warms_up_then_stays_constant():
    cfg = rl_state.OptimConfig(learning_rate=2e-6, warmup_fraction=0.03)
    schedule = rl_state.learning_rate_schedule(cfg, total_updates=200)     # 6 warm-up updates
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(float(schedule(3)), 1e-6, rtol=1e-6)
    np.testing.assert_allclose([float(schedule(s)) for s in (6, 7, 150, 199)], 2e-6, rtol=1e-6)
    no_warmup = rl_state.learning_rate_schedule(rl_state.OptimConfig(warmup_fraction=0.0), 10)
    assert float(no_warmup(0)) == 2e-6


LR, EPS = 1e-2, 1e-3


def _first_update(grad_clip_norm: float):
    """One update of the tiny model with Adam's eps (1e-3) above every gradient entry: its first step, -lr * g /
    (|g| + eps) per parameter, then depends on the scale of g. With Kevin's eps = 1e-8 it is ~ -lr * sign(g), the
    same whatever the clipping, so a test of it could not fail without clipping."""
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    cfg = rl_loss.RLConfig(micro_batch_tokens=4096, min_row_len=64)
    ocfg = rl_state.OptimConfig(learning_rate=LR, warmup_fraction=0.0, grad_clip_norm=grad_clip_norm,
                                weight_decay=0.0, eps=EPS)
    graphdef, params = _model(mesh)
    tx = rl_state.make_optimizer(ocfg, total_updates=10)
    updater = rl_state.Updater(graphdef, tx, rl_state.learning_rate_schedule(ocfg, 10), cfg, mesh, 0.9)
    state = rl_state.init_state(params, tx)
    before = jax.tree.map(np.array, state["params"])
    mbs, _ = rl_batch.micro_batches(_samples(), cfg)
    batches = [updater.device_batch(mb) for mb in mbs]
    grads = jax.tree.map(np.array, updater.gradients(state["params"], batches, first=True)[0])
    state, stats, trainer_lp = updater.update(state, batches, first=True)
    return before, grads, state, stats, trainer_lp, mbs


def _assert_adam_first_step(before, after, grads):
    """after == before - lr * g / (|g| + eps) (Adam's bias-corrected first step), to a few float32 ulps."""
    for (path, p0), p1, g in zip(jax.tree_util.tree_flatten_with_path(before)[0], jax.tree.leaves(after),
                                 jax.tree.leaves(grads)):
        expected = -LR * g.astype(np.float64) / (np.abs(g) + EPS)
        ulps = 4 * float(np.spacing(np.float32(np.abs(p0).max())))
        np.testing.assert_allclose(np.asarray(p1, np.float64) - p0, expected, rtol=1e-3, atol=ulps,
                                   err_msg=parallel.path_name(path))


def test_update_clips_the_gradient_and_counts_updates():
    before, grads, state, stats, trainer_lp, mbs = _first_update(grad_clip_norm=0.05)
    raw_norm = float(optax.global_norm(grads))
    assert int(state["updates"]) == 1
    np.testing.assert_allclose(stats["grad_norm"], raw_norm, rtol=1e-5)
    assert raw_norm > 0.5                       # 10x the clip norm: clipping changes the step below 10-fold
    assert stats["learning_rate"] == pytest.approx(LR)
    deltas = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).max(), state["params"], before)
    assert 0 < max(jax.tree.leaves(deltas)) <= LR * 1.001        # an Adam step is bounded by lr
    # the step is Adam's on the clipped gradient (global norm 0.05), not on the raw one
    _assert_adam_first_step(before, state["params"], jax.tree.map(lambda g: g * (0.05 / raw_norm), grads))
    assert trainer_lp[0].shape == mbs[0]["tokens"].shape


def test_without_clipping_the_update_follows_the_raw_gradient():
    """The control of the test above (same model, batch and optimiser, grad_clip_norm=0): the step is Adam's on the
    raw gradient, which differs from the clipped one's by the clip factor."""
    before, grads, state, *_ = _first_update(grad_clip_norm=0.0)
    _assert_adam_first_step(before, state["params"], grads)


def test_kl_to_an_identical_reference_is_zero_and_leaves_the_gradient_unchanged(reference):
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    config = rl_loss.RLConfig(micro_batch_tokens=1 << 16, min_row_len=64, kl_coef=0.5)
    graphdef, params = _model(mesh)
    updater = rl_state.Updater(graphdef, optax.adamw(1e-3), optax.constant_schedule(1e-3), config, mesh, 0.9)
    mbs, _ = rl_batch.micro_batches(_samples(), config)
    batches = [updater.device_batch(mb) for mb in mbs]
    for mb in batches:
        mb["ref_logprobs"] = updater.logprobs(params, mb)     # the reference policy = the current one
    grads, stats, _ = updater.gradients(params, batches, first=True)
    assert abs(stats["kl_ref"]) < 1e-6
    _assert_same(reference, (jax.tree.map(np.asarray, grads), stats))
