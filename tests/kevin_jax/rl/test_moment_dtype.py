"""AdamW's first moment stored in bf16 (optim.mu_dtype="bfloat16", configs/kevin32b.py): the tiny model trained N
updates at Kevin's optimiser settings (lr 2e-6 after a 3% warm-up, clip 0.05, weight decay 0.01; the state in host
memory and bf16 compute, as the 32B run) with a bf16 first moment stays within a bound of the float32 moment's run.

The bound. optax computes each step in float32 from the stored moment and rounds only what it stores, so the stored
first moment m_t = b1 * round(m_{t-1}) + (1 - b1) * g_t carries an error that each step adds at most one bf16
rounding of the moment to (unit roundoff u = 2^-8) and multiplies by b1: at most u * b1 / (1 - b1) = 3.5% of the
moment, in the worst case of every rounding the same way. The Adam direction is the moment over sqrt(nu), so each
update is off by at most that fraction of itself, and the weights after N updates differ by at most 3.5% of the
path the float32 run's weights took (the sum over updates of the norm of each). The gradients of the two runs
differ only through weights that differ by that much less than one update (second order: not counted). A choice
that breaks it: a float8 (e4m3, u = 2^-4) first moment, whose bound would be 56%, lands above 3.5%
(test_a_coarser_moment_breaks_the_bound), so the test can fail.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import tree_utils as otu
import pytest
from flax import nnx

from kevin_jax import parallel
from kevin_jax.model import qwen2, shapes
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl import loss as rl_loss
from kevin_jax.rl import offload
from kevin_jax.rl import state as rl_state

BF16 = qwen2.ModelOptions(dtype="bfloat16", param_dtype="float32", remat="none", attention="xla")
# one row length, two rows a micro-batch: one shape, so the gradient step compiles once for all runs
RL = rl_loss.RLConfig(micro_batch_tokens=256, row_len=128)
UPDATES = 20
KEVIN = rl_state.OptimConfig(offload="pinned_host")           # the defaults are Kevin's: lr 2e-6, clip 0.05, ...
BOUND = KEVIN.b1 / (1 - KEVIN.b1) * 2.0 ** -8                # 3.5%: the module docstring

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


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


@pytest.fixture(scope="module")
def setup():
    """(mesh, the tiny model's graph and initial weights, 4 batches, an Updater whose gradient step every run
    shares)."""
    fsdp = min(2, len(jax.devices()))
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=fsdp), devices=jax.devices()[:fsdp])
    graphdef, params = nnx.split(qwen2.init_sharded(shapes.named_config("tiny"), BF16, mesh, seed=5))
    tx = rl_state.make_optimizer(KEVIN, UPDATES)
    gradients = rl_state.Updater(graphdef, tx, rl_state.learning_rate_schedule(KEVIN, UPDATES), RL, mesh, 0.9,
                                 offload=rl_state.host_offload(KEVIN, UPDATES, BF16.compute_dtype))
    batches = [[gradients.device_batch(mb) for mb in rl_batch.micro_batches(_samples(i), RL, row_divisor=fsdp)[0]]
               for i in range(4)]
    return mesh, graphdef, params, batches, gradients


def _train(setup, optim: rl_state.OptimConfig):
    """(the master weights after each update, flat, starting with the initial ones; the final state) of UPDATES
    policy-gradient updates of the tiny model from the same initial weights (the batches recur every 4 updates, so
    the moments build up), each update's gradients at the run's own current weights."""
    mesh, graphdef, params, batches, gradients = setup
    tx = rl_state.make_optimizer(optim, UPDATES)
    host = rl_state.host_offload(optim, UPDATES, BF16.compute_dtype)
    updater = rl_state.Updater(graphdef, tx, rl_state.learning_rate_schedule(optim, UPDATES), RL, mesh, 0.9,
                               offload=host)
    state = rl_state.init_state(jax.tree.map(jnp.copy, params), tx, host)
    path = [_flat(state["master"])]
    for step in range(UPDATES):
        grads, _, _ = gradients.gradients(state["params"], batches[step % 4], first=True)
        state, stats = updater.apply(state, grads)
        assert np.isfinite(float(stats["grad_norm"])) and float(stats["grad_norm"]) > 0
        path.append(_flat(state["master"]))
    return path, state


@pytest.fixture(scope="module")
def float32_run(setup):
    return _train(setup, KEVIN)


def _drift(setup, float32_run, optim):
    """How far apart the final weights of a run with `optim` and the float32 run are, over the float32 run's
    path (the sum of its updates' norms)."""
    path, _ = float32_run
    steps = np.linalg.norm(np.diff(np.stack(path), axis=0), axis=1)
    assert (steps[1:] > 0).all()                    # every update moved the weights (the first: lr 0, warm-up)
    other, state = _train(setup, optim)
    return np.linalg.norm(other[-1] - path[-1]) / steps.sum(), state


def test_a_bf16_first_moment_stays_within_the_bound(setup, float32_run):
    drift, state = _drift(setup, float32_run, rl_state.OptimConfig(**{**KEVIN.__dict__, "mu_dtype": "bfloat16"}))
    print(f"bf16 first moment: weights {drift:.2e} of the float32 run's path apart after {UPDATES} updates "
          f"(bound {BOUND:.2e})")
    assert drift <= BOUND
    # and it is stored as bf16, in host memory, beside a float32 second moment (what placement counts: 10 bytes)
    mu = jax.tree.leaves(optax.tree_utils.tree_get(state["opt_state"], "mu"))
    nu = jax.tree.leaves(optax.tree_utils.tree_get(state["opt_state"], "nu"))
    assert {x.dtype for x in mu} == {jnp.dtype(jnp.bfloat16)} and {x.dtype for x in nu} == {jnp.dtype(jnp.float32)}
    assert {x.sharding.memory_kind for x in mu} == {"pinned_host"}
    assert rl_state.OptimConfig(mu_dtype="bfloat16").state_bytes_per_param() == 10
    assert KEVIN.state_bytes_per_param() == 12


def test_a_coarser_moment_breaks_the_bound(setup, float32_run, monkeypatch):
    """The bound can fail: a first moment stored through float8 (e4m3: 3 bits of mantissa; optax cannot compute in
    float8, so the run's AdamW rounds its stored moment through it) drifts past it."""
    real = rl_state._adamw

    def coarse_adamw(*args, **kwargs):
        tx = real(*args, **kwargs)

        def update(grads, state, params=None):
            updates, state = tx.update(grads, state, params)
            mu = jax.tree.map(lambda m: m.astype(jnp.float8_e4m3fn).astype(m.dtype), otu.tree_get(state, "mu"))
            return updates, otu.tree_set(state, mu=mu)
        return optax.GradientTransformation(tx.init, update)
    monkeypatch.setattr(rl_state, "_adamw", coarse_adamw)
    drift, _ = _drift(setup, float32_run, KEVIN)
    print(f"first moment through float8: {drift:.2e} of the path (bound {BOUND:.2e})")
    assert drift > BOUND


def test_a_bad_moment_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="optim.mu_dtype must be one of"):
        rl_state.OptimConfig(mu_dtype="float16")
