"""kevin_jax.sampler.pages: reference counts, the prefix cache and its LRU eviction; and the pure-JAX paged attention
against a dense reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.model.shapes import named_config
from kevin_jax.sampler import kv_cache
from kevin_jax.sampler.pages import OutOfPages, PageAllocator, prefix_hashes


def test_allocate_release_and_exhaustion():
    alloc = PageAllocator(num_pages=5, page_size=4)
    pages = alloc.allocate(4)
    assert sorted(pages) == [1, 2, 3, 4] and alloc.available == 0     # page 0 is scratch, never handed out
    with pytest.raises(OutOfPages, match="need 1 KV pages, 0 available"):
        alloc.allocate(1)
    alloc.release(pages[:2])
    assert alloc.available == 2 and alloc.in_use == 2
    with pytest.raises(RuntimeError, match="released more often"):
        alloc.release(pages[:1])


def test_prefix_pages_are_shared_then_cached_then_evicted():
    alloc = PageAllocator(num_pages=6, page_size=2)
    tokens = [5, 6, 7, 8, 9]
    digests = prefix_hashes(tokens, 2, 2)
    assert prefix_hashes([5, 6, 7, 9], 2, 2)[0] == digests[0] != prefix_hashes([5, 6, 7, 9], 2, 2)[1]
    assert prefix_hashes([6, 5, 7, 8], 2, 2)[1] != digests[1], "a page's digest must depend on everything before it"
    owner = alloc.allocate(3)
    alloc.register(owner[0], digests[0], phase=1)
    alloc.register(owner[1], digests[1], phase=1)
    assert alloc.lookup(digests) == owner[:2] and alloc.ready_phase(owner[0]) == 1
    alloc.share(owner[:2])
    assert alloc.refcount(owner[0]) == 2 and alloc.cost(owner[:2], 1) == 1
    alloc.release(owner)                       # the owner finishes: shared pages stay referenced by the follower
    assert alloc.refcount(owner[0]) == 1 and alloc.refcount(owner[2]) == 0
    alloc.release(owner[:2])                   # the follower finishes: cached, unreferenced, still found
    assert alloc.available == 5 and alloc.lookup(digests) == owner[:2]
    assert alloc.cost(owner[:2], 0) == 2       # reviving cached pages takes them out of `available`
    alloc.start_round()
    assert alloc.ready_phase(owner[0]) == 0
    alloc.allocate(4)                          # 3 free pages, then the least recently released cached page
    assert alloc.lookup(digests) == [], "the evicted first page must break the whole chain"


def test_prefix_sharing_off_never_matches():
    alloc = PageAllocator(num_pages=4, page_size=2, prefix_sharing=False)
    digest = prefix_hashes([1, 2], 2, 1)
    page = alloc.allocate(1)[0]
    alloc.register(page, digest[0], phase=1)
    assert alloc.lookup(digest) == []


def test_xla_paged_attention_matches_dense_causal_attention():
    config = named_config("tiny")
    geometry = kv_cache.make_geometry(config, pages_per_layer=40, page_size=4, max_seq_len=64)
    rng = np.random.default_rng(0)
    batch, length, layer = 2, 5, 1
    shape = kv_cache.pool_shape(geometry)
    pool = kv_cache.KVPool(jnp.asarray(rng.normal(size=shape), jnp.float32),
                           jnp.asarray(rng.normal(size=shape), jnp.float32))
    kv_lengths = np.array([23, 9])
    tables = np.zeros((batch, geometry.table_width), np.int32)
    tables[0, :6] = rng.permutation(np.arange(1, 40))[:6]
    tables[1, :3] = rng.permutation(np.arange(1, 40))[:3]
    q_positions = kv_lengths[:, None] - length + np.arange(length)[None]        # the last `length` tokens
    q = jnp.asarray(rng.normal(size=(batch, length, config.num_attention_heads, config.head_dim)), jnp.float32)
    out = kv_cache.paged_attention_xla(q, pool, jnp.int32(layer), jnp.asarray(tables), jnp.asarray(q_positions),
                                       jnp.asarray(kv_lengths, jnp.int32), geometry,
                                       precision=jax.lax.Precision.HIGHEST)
    groups = config.num_attention_heads // config.num_key_value_heads
    for b in range(batch):
        rows = layer * geometry.pages_per_layer + tables[b, :-(-kv_lengths[b] // 4)]
        k = np.asarray(pool.k)[:, rows].reshape(config.num_key_value_heads, -1, config.head_dim)[:, :kv_lengths[b]]
        v = np.asarray(pool.v)[:, rows].reshape(config.num_key_value_heads, -1, config.head_dim)[:, :kv_lengths[b]]
        k, v = np.repeat(k, groups, axis=0), np.repeat(v, groups, axis=0)             # [Hq, S, D]
        logits = np.einsum("thd,hsd->hts", np.asarray(q[b]), k) / np.sqrt(config.head_dim)
        logits = np.where(np.arange(kv_lengths[b])[None, None] <= q_positions[b][None, :, None], logits, -np.inf)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        np.testing.assert_allclose(np.asarray(out[b]), np.einsum("hts,hsd->thd", probs, v), atol=1e-5)


# ----------------------------------------------------------------------------------------------- the pool plan
def test_pool_plan_rules_in_order():
    page_bytes = 1000
    common = dict(worst_case_tokens=64 * 100, page_size=16, page_bytes_per_device=page_bytes)
    worst = kv_cache.pages_for(64 * 100, 16) + 1
    assert kv_cache.plan_pool(**common).pages_per_layer == worst                      # CPU: the dense worst case
    assert kv_cache.plan_pool(**common, num_pages=7, kv_cache_gb=1.0).pages_per_layer == 7
    assert kv_cache.plan_pool(**common, kv_cache_gb=50e-6).pages_per_layer == 50
    assert kv_cache.plan_pool(**common, kv_cache_gb=1.0).pages_per_layer == worst      # capped
    plan = kv_cache.plan_pool(**common, fraction=0.5, limit_bytes=200_000, in_use_bytes=50_000,
                              weight_copy_bytes=60_000, workspace=10_000)
    assert plan.pages_per_layer == (200_000 - 50_000 - 60_000 - 10_000) // 2 // page_bytes == 40
    assert plan.bytes_per_device == 40 * page_bytes and plan.tokens == 39 * 16
    assert "kv_cache_fraction=0.5" in plan.rule and "weight copy" in plan.rule
    # no limit reported (CPU): the fraction does not apply
    assert kv_cache.plan_pool(**common, fraction=0.5).pages_per_layer == worst


def test_pool_plan_without_memory_left_says_why():
    with pytest.raises(ValueError, match="no device memory left for the KV pool.*weight copy 60.0.*kv_cache_gb"):
        kv_cache.plan_pool(worst_case_tokens=1 << 20, page_size=16, page_bytes_per_device=1 << 20, fraction=0.9,
                           limit_bytes=100e9, in_use_bytes=30e9, weight_copy_bytes=60e9, workspace=10e9)


def test_qwq_32b_plan_on_four_h100s():
    """QwQ-32B, 4-way tensor parallel, JAX capped at 85% of an H100 (80 GiB), the trainer's bf16 parameters (FSDP)
    resident: the sampler's copy is a quarter of the model, a KV token costs 64 KiB per GPU, and 90% of the rest holds
    about 30 sequences of 16k at once (the 128 slots then share the pool: admission by free pages)."""
    from kevin_jax.sampler import layout

    config = named_config("qwq_32b")
    copy = layout.copy_bytes_per_device(config, jnp.bfloat16, 4)
    assert copy == pytest.approx(65.53e9 / 4, rel=1e-3)
    geometry = kv_cache.make_geometry(config, pages_per_layer=2, page_size=16, max_seq_len=40960)
    assert geometry.bytes_per_token(jnp.bfloat16) == 256 * 1024
    workspace = kv_cache.workspace_bytes(config, prefill_tokens=8192, slots=128, tensor=4)
    assert 1.5e9 < workspace < 4e9
    plan = kv_cache.plan_pool(worst_case_tokens=128 * 40960, page_size=16, page_bytes_per_device=16 * 64 * 1024,
                              fraction=0.9, limit_bytes=int(0.85 * 80 * 2**30), in_use_bytes=copy,
                              weight_copy_bytes=copy, workspace=workspace)
    assert 25 < plan.tokens / 16384 < 35
    assert "sequences of 16k" in plan.describe(128, 40960, "4-way tensor parallel")
