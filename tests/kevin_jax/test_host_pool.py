"""The pinned-host pool that holds an offloaded optimiser state (kevin_jax.placement): its cap must hold each GPU's
share of the state as XLA's allocator places it. XLA's pinned-host pools are TF's BFC allocator with growth: it
takes regions of doubling size from the host (2 MiB, 4 MiB, ..., up to the cap), a buffer never spans two regions,
and a free chunk is split only when the rest is worth keeping; so regions end part-empty and the pool needs more than
the state. `bfc_growth_model` is a model of that policy (best fit over free chunks, TF's split rule), not XLA itself:
the cap it justifies is checked on a GPU by the full-size run."""
import random

import pytest

from kevin_jax import placement
from kevin_jax.model import shapes

GiB = 1 << 30
MIN_ALLOCATION = 256                # tsl BFCAllocator kMinAllocationSize
MAX_INTERNAL_FRAGMENTATION = 128 << 20


def bfc_growth_model(sizes: list[int], limit: int) -> bool:
    """Whether buffers of `sizes` (allocated in this order, none freed) fit a growing BFC pool capped at `limit`."""
    free: list[int] = []
    total, region = 0, 2 << 20
    for size in sizes:
        need = -(-size // MIN_ALLOCATION) * MIN_ALLOCATION
        fits = [c for c in free if c >= need]
        if not fits:
            available = limit - total
            if need > available:
                return False
            grew = False
            while need > region:
                region *= 2
                grew = True
            got = min(region, available)
            total += got
            free.append(got)
            if not grew:
                region *= 2
            fits = [got]
        chunk = min(fits)
        free.remove(chunk)
        if chunk >= 2 * need or chunk - need >= MAX_INTERNAL_FRAGMENTATION:
            free.append(chunk - need)
    return True


def state_leaves(config: shapes.Qwen2Config, shards: int) -> list[int]:
    """Bytes per GPU of one float32 copy of the parameters (master, or one moment), leaf by leaf in the state's
    order: matrices sharded `shards` ways, biases and norm scales replicated."""
    h, d, layers = config.hidden_size, config.head_dim, config.num_hidden_layers
    q, kv, i = config.num_attention_heads * d, config.num_key_value_heads * d, config.intermediate_size
    stacked = [layers * n * 4 // shards for n in (h * q, h * kv, h * kv, q * h, h * i, h * i, i * h)]
    replicated = [layers * n * 4 for n in (q, kv, kv, h, h)]
    tables = [config.vocab_size * h * 4 // shards] * (1 if config.tie_word_embeddings else 2)
    return tables[:1] + [h * 4] + stacked + replicated + tables[1:]


@pytest.mark.parametrize("gpus", [4, 8])
def test_the_pool_holds_qwq_32b_state_as_the_allocator_places_it(gpus):
    qwq = shapes.named_config("qwq_32b")
    leaves = state_leaves(qwq, gpus)
    # the model's leaves are the whole model: the same bytes as the parameter count says (replicated ones aside)
    assert sum(leaves) == pytest.approx(qwq.param_count() * 4 / gpus, rel=0.001)
    pool = placement.host_pool_gib(qwq.param_count(), gpus) * GiB
    rng = random.Random(0)
    orders = [leaves * 3] + [[x for _ in range(3) for x in rng.sample(leaves, len(leaves))] for _ in range(30)]
    assert all(bfc_growth_model(order, pool) for order in orders)
    # and the slack is needed: the bare share (+4 GiB) does not hold it
    bare = (-(-3 * sum(leaves) // GiB) + placement.HOST_POOL_EXTRA_GIB) * GiB
    assert not bfc_growth_model(leaves * 3, bare)


def test_the_model_is_tfs_growth_policy():
    # a 3 MiB buffer takes a region of 4 MiB (doubled from 2 MiB to fit it) whole: its 1 MiB rest is not split off
    # (less than the buffer, under 128 MiB), so two such buffers need 4 + 3 MiB of the host, not 6
    assert bfc_growth_model([3 << 20, 3 << 20], 7 << 20)
    assert not bfc_growth_model([3 << 20, 3 << 20], 6 << 20)
    # a free tail is reused: 1 MiB buffers fill the 2 MiB region before another is taken
    assert bfc_growth_model([1 << 20, 1 << 20], 2 << 20)


@pytest.mark.parametrize("gpus,largest_first,trees_order", [(4, 98, 103), (8, 49, 52)])
def test_largest_first_leaves_the_pool_the_most_room(gpus, largest_first, trees_order):
    """kevin_jax.rl.offload.init_state makes the host buffers largest first: by this model QwQ-32B's state then needs
    the least pool (GiB per GPU), room under the cap for the update."""
    qwq = shapes.named_config("qwq_32b")
    leaves = state_leaves(qwq, gpus)

    def least_pool(order):
        return next(cap for cap in range(1, 400) if bfc_growth_model(order, cap * GiB))
    assert least_pool(sorted(leaves * 3, reverse=True)) == largest_first
    assert least_pool(leaves * 3) == trees_order
    assert largest_first < trees_order < placement.host_pool_gib(qwq.param_count(), gpus)
