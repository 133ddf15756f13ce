"""The pinned-host pool that holds an offloaded optimiser state (kevin_jax.placement): its cap must hold each GPU's
share of the state as XLA's allocator places it. XLA's pinned-host pools are TF's BFC allocator with growth: it
takes regions of doubling size from the host (2 MiB, 4 MiB, ..., up to the cap), a buffer never spans two regions,
and a free chunk is split only when the rest is worth keeping; so regions end part-empty and the pool needs more than
the state. `placement.pool_fits` is a model of that policy (best fit over free chunks, TF's split rule), not XLA
itself: the cap it sizes is checked on a GPU by the full-size run."""
import random

import pytest

from kevin_jax import placement
from kevin_jax.model import shapes

GiB = 1 << 30


@pytest.mark.parametrize("gpus", [4, 8])
@pytest.mark.parametrize("mu_bytes", [4, 2])
def test_the_pool_holds_qwq_32b_state_as_the_allocator_places_it(gpus, mu_bytes):
    qwq = shapes.named_config("qwq_32b")
    buffers = placement.state_buffers(qwq, gpus, mu_bytes)
    state = [n for n, _ in buffers]
    update = [n for n, rest in buffers if rest]
    # the buffers are the whole state: the bytes the parameter count says (replicated ones aside)
    assert sum(state) == pytest.approx(qwq.param_count() * (8 + mu_bytes) / gpus, rel=0.001)
    pool = placement.host_pool_gib(qwq, gpus, mu_bytes)
    # orders other than the ones the cap was sized with (a restore's order is orbax's): all fit, the update's new
    # buffers after them
    rng = random.Random(1)
    orders = [sorted(state, reverse=True), state] + [rng.sample(state, len(state)) for _ in range(30)]
    assert all(placement.pool_fits(order + update, pool * GiB) for order in orders)
    # and no larger than the model needs: within 3 GiB of what these other orders need at worst
    worst = max(placement.least_pool_gib(order + update) for order in orders)
    assert worst + placement.HOST_POOL_EXTRA_GIB <= pool <= worst + placement.HOST_POOL_EXTRA_GIB + 3, (pool, worst)


def test_the_model_is_tfs_growth_policy():
    # a 3 MiB buffer takes a region of 4 MiB (doubled from 2 MiB to fit it) whole: its 1 MiB rest is not split off
    # (less than the buffer, under 128 MiB), so two such buffers need 4 + 3 MiB of the host, not 6
    assert placement.pool_fits([3 << 20, 3 << 20], 7 << 20)
    assert not placement.pool_fits([3 << 20, 3 << 20], 6 << 20)
    # a free tail is reused: 1 MiB buffers fill the 2 MiB region before another is taken
    assert placement.pool_fits([1 << 20, 1 << 20], 2 << 20)
    assert placement.least_pool_gib([3 << 30]) == 3 and placement.least_pool_gib([1 << 30, 1 << 30]) == 2


@pytest.mark.parametrize("gpus,mu_bytes,largest_first,trees_order", [(4, 4, 98, 103), (8, 4, 49, 52),
                                                                     (4, 2, 77, 78)])
def test_largest_first_leaves_the_pool_the_most_room(gpus, mu_bytes, largest_first, trees_order):
    """kevin_jax.rl.offload.init_state makes the host buffers largest first: by this model QwQ-32B's state then needs
    the least pool (GiB per GPU). The cap holds a restore's order too, and the update's new buffers beside it."""
    qwq = shapes.named_config("qwq_32b")
    state = [n for n, _ in placement.state_buffers(qwq, gpus, mu_bytes)]
    assert placement.least_pool_gib(sorted(state, reverse=True)) == largest_first
    assert placement.least_pool_gib(state) == trees_order
    assert largest_first <= trees_order < placement.host_pool_gib(qwq, gpus, mu_bytes)


def test_a_bf16_first_moment_and_the_model_free_the_host():
    """QwQ-32B on 4 GPUs: the caps were 110 GiB per GPU (the share x 1.18 + 1); by the model 107 with a float32
    first moment and 84 with a bf16 one: 104 GiB of a 503 GiB host freed on 4 GPUs."""
    qwq = shapes.named_config("qwq_32b")
    assert placement.host_pool_gib(qwq, 4, 4) == 107 and placement.host_pool_gib(qwq, 4, 2) == 84
    assert placement.host_pool_gib(qwq, 8, 2) == 43
