"""The paged KV cache on device: pool layout, writes, and attention over pages (Pallas on GPU, pure JAX anywhere).

Layout. One pool per K and V, shaped [kv_heads, num_layers * pages_per_layer, page_size, head_dim]: layer l's page p
lives at row l * pages_per_layer + p. This is the layout of jax.experimental.pallas.ops.gpu.paged_attention, so the
whole pool goes to the kernel unchanged (no per-layer slice is ever copied) and a layer is picked by offsetting the
page table. Page 0 of every layer is scratch: empty slots and padding tokens write there and nothing reads it as data.

Why the pool is threaded through the layer loop as one carried buffer (not a per-layer scanned slice): a scan's
per-layer outputs are a new stacked array, i.e. a copy of the whole cache on every decode step. As a carry, the
per-token writes are in-place scatters.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kevin_jax.model.shapes import Qwen2Config


# Finite, so that a query row whose keys are all masked gives no NaN.
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# Pages per block of the pure-JAX attention loop; page tables are padded to a multiple of it.
_TABLE_MULTIPLE = 16


class KVPool(NamedTuple):
    k: jax.Array   # [kv_heads, num_layers * pages_per_layer, page_size, head_dim]
    v: jax.Array


@dataclasses.dataclass(frozen=True)
class PoolGeometry:
    """Static shape facts of the pool and page tables."""
    num_layers: int
    pages_per_layer: int        # including the scratch page 0
    page_size: int
    kv_heads: int
    q_heads: int
    head_dim: int
    table_width: int            # page-table columns per sequence (max_seq_len rounded up to whole blocks)

    def bytes_per_token(self, dtype) -> int:
        """K + V bytes one token occupies across all layers."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * jnp.dtype(dtype).itemsize

    def pool_bytes(self, dtype) -> int:
        return self.bytes_per_token(dtype) * self.pages_per_layer * self.page_size


def table_width_for(max_seq_len: int, page_size: int) -> int:
    pages = -(-max_seq_len // page_size)
    return -(-pages // _TABLE_MULTIPLE) * _TABLE_MULTIPLE


def make_geometry(model: Qwen2Config, *, pages_per_layer: int, page_size: int, max_seq_len: int) -> PoolGeometry:
    return PoolGeometry(num_layers=model.num_hidden_layers, pages_per_layer=pages_per_layer, page_size=page_size,
                        kv_heads=model.num_key_value_heads, q_heads=model.num_attention_heads,
                        head_dim=model.head_dim, table_width=table_width_for(max_seq_len, page_size))


def pool_shape(geometry: PoolGeometry) -> tuple[int, int, int, int]:
    g = geometry
    return (g.kv_heads, g.num_layers * g.pages_per_layer, g.page_size, g.head_dim)


def init_pool(geometry: PoolGeometry, dtype, sharding=None) -> KVPool:
    """A zeroed pool, created directly with its sharding (zeros: scratch reads must stay finite)."""
    shape = pool_shape(geometry)

    @functools.partial(jax.jit, out_shardings=None if sharding is None else (sharding, sharding))
    def create():
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    return KVPool(*create())


def write_kv(pool: KVPool, layer: jax.Array, k: jax.Array, v: jax.Array, pages: jax.Array,
             offsets: jax.Array, geometry: PoolGeometry) -> KVPool:
    """Stores k, v [B, T, Hkv, D] at (pages[b, t], offsets[b, t]) of `layer` (an in-place scatter in a carry)."""
    rows = layer * geometry.pages_per_layer + pages                             # [B, T]
    new_k = pool.k.at[:, rows, offsets].set(jnp.moveaxis(k, 2, 0).astype(pool.k.dtype))
    new_v = pool.v.at[:, rows, offsets].set(jnp.moveaxis(v, 2, 0).astype(pool.v.dtype))
    return KVPool(new_k, new_v)


def paged_attention_xla(q: jax.Array, pool: KVPool, layer: jax.Array, tables: jax.Array, q_positions: jax.Array,
                        kv_lengths: jax.Array, geometry: PoolGeometry, *, precision=None) -> jax.Array:
    """Causal attention of q [B, T, Hq, D] (absolute positions q_positions [B, T]) over each row's pages.

    Keys are the first kv_lengths[b] tokens of row b's pages (tables [B, W], layer-0 page ids); query t sees key j
    iff j <= q_positions[b, t]. Online softmax over blocks of _TABLE_MULTIPLE pages, looping only up to the longest
    row's length: memory O(B * T * block), and decode reads pages up to the longest live sequence (not the table).
    """
    batch, length, q_heads, head_dim = q.shape
    kv_heads, page = geometry.kv_heads, geometry.page_size
    groups = q_heads // kv_heads
    block_pages = _TABLE_MULTIPLE
    block = block_pages * page
    scale = head_dim ** -0.5
    qg = q.reshape(batch, length, kv_heads, groups, head_dim)
    layer_rows = layer * geometry.pages_per_layer
    num_blocks = (jnp.max(kv_lengths) + block - 1) // block

    def body(j, carry):
        out, row_max, row_sum = carry
        cols = jax.lax.dynamic_slice_in_dim(tables, j * block_pages, block_pages, axis=1) + layer_rows
        k = pool.k[:, cols].reshape(kv_heads, batch, block, head_dim)           # [Hkv, B, S, D]
        v = pool.v[:, cols].reshape(kv_heads, batch, block, head_dim)
        logits = jnp.einsum("btkgd,kbsd->bkgts", qg, k.astype(q.dtype), precision=precision,
                            preferred_element_type=jnp.float32) * scale
        key_pos = j * block + jnp.arange(block, dtype=jnp.int32)
        visible = (key_pos[None, None, :] <= q_positions[:, :, None]) & \
                  (key_pos[None, None, :] < kv_lengths[:, None, None])          # [B, T, S]
        logits = jnp.where(visible[:, None, None], logits, _MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(logits, axis=-1))
        correction = jnp.exp(row_max - new_max)
        probs = jnp.exp(logits - new_max[..., None])
        new_sum = row_sum * correction + jnp.sum(probs, axis=-1)
        pv = jnp.einsum("bkgts,kbsd->bkgtd", probs.astype(v.dtype), v, precision=precision,
                        preferred_element_type=jnp.float32)
        return out * correction[..., None] + pv, new_max, new_sum

    init = (jnp.zeros((batch, kv_heads, groups, length, head_dim), jnp.float32),
            jnp.full((batch, kv_heads, groups, length), -jnp.inf, jnp.float32),
            jnp.zeros((batch, kv_heads, groups, length), jnp.float32))
    out, _, row_sum = jax.lax.fori_loop(0, num_blocks, body, init)
    out = out / jnp.maximum(row_sum, 1e-30)[..., None]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(batch, length, q_heads, head_dim).astype(q.dtype)


# ----------------------------------------------------------------------------------------------- Pallas (GPU)
@dataclasses.dataclass(frozen=True)
class PallasParams:
    pages_per_compute_block: int
    k_splits: int
    num_warps: int
    num_stages: int
    interpret: bool


# Automatic blocking: the winner of benchmarks/sampler.py's sweep on the H200 (docs/LOG.md, "two H200 machines"): 64 keys
# per block, >= 512 keys per program, 4 warps, ONE pipeline stage. One stage needs a third of the shared memory of
# three, so more programs share an SM and hide each other's latency: at batch 512, attention took 14.3 ms/step (1.5B)
# and 23.2-23.9 ms (7B) against 18.7 ms and >= 30.9 ms with 3 stages, our first-principles guess. Tables longer than 16k
# keys get longer programs so that the partial outputs combined afterwards (16 padded query rows per split) stay small.
_AUTO_BLOCK_TOKENS = 64
_AUTO_SPLIT_TOKENS = 512
_AUTO_MAX_SPLITS = 32
_AUTO_WARPS = 4
_AUTO_STAGES = 1


def pallas_params(geometry: PoolGeometry, interpret: bool, *, block_tokens: int = 0, split_tokens: int = 0,
                  warps: int = 0, stages: int = 0) -> PallasParams:
    """Blocking of the Pallas paged-attention kernel (0 = automatic). The table of a sequence (table_width pages) is
    split into k_splits programs of pages_per_partition pages, each walking its pages pages_per_compute_block at a
    time; the kernel needs k_splits | table_width and pages_per_compute_block | pages_per_partition."""
    page, width = geometry.page_size, geometry.table_width
    block = max(1, (block_tokens or _AUTO_BLOCK_TOKENS) // page)
    block = 1 << (min(block, width).bit_length() - 1)                 # a power of two; width is a multiple of 16
    if split_tokens:
        split = max(block, split_tokens // page)
    else:
        split = max(block, _AUTO_SPLIT_TOKENS // page, -(-width // _AUTO_MAX_SPLITS))
    splits = max(1, width // split)
    while width % splits or (width // splits) % block:
        splits -= 1
    return PallasParams(pages_per_compute_block=block, k_splits=splits, num_warps=warps or _AUTO_WARPS,
                        num_stages=stages or _AUTO_STAGES, interpret=interpret)


def paged_decode_attention_pallas(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, layer_tables: jax.Array,
                                  lengths: jax.Array, *, params: PallasParams) -> jax.Array:
    """One query token per row: q [B, Hq, D] over the first lengths[b] tokens of row b's pages -> [B, Hq, D].

    jax.experimental.pallas.ops.gpu.paged_attention (flash-decoding over pages, GQA, per-row lengths): each program
    reads only its row's live pages. layer_tables are page rows of the pool (layer offset already added). The kernel
    applies no softmax scale, so q is scaled here.
    """
    from jax.experimental.pallas.ops.gpu import paged_attention as pallas_paged

    scaled = (q.astype(jnp.float32) * q.shape[-1] ** -0.5).astype(q.dtype)
    return pallas_paged.paged_attention(scaled, k_pool, v_pool, layer_tables, lengths.astype(jnp.int32),
                                        block_h=16, pages_per_compute_block=params.pages_per_compute_block,
                                        k_splits=params.k_splits, num_warps=params.num_warps,
                                        num_stages=params.num_stages, interpret=params.interpret)


def shard_heads(fn, mesh, tensor_axis: str | None):
    """Runs a per-head attention fn(q [B, Hq, D], k_pool, v_pool, tables, lengths) under shard_map with heads split
    over `tensor_axis` (the kernel has no SPMD rule of its own); everything else is replicated."""
    if mesh is None:
        return fn
    from jax.sharding import PartitionSpec as P

    heads = P(None, tensor_axis, None)
    pool_spec = P(tensor_axis, None, None, None)
    return jax.shard_map(fn, mesh=mesh, in_specs=(heads, pool_spec, pool_spec, P(), P()), out_specs=heads,
                         check_vma=False)


def pallas_available(geometry: PoolGeometry, dtype, params: PallasParams) -> tuple[bool, str]:
    """Compiles and runs the Pallas kernel with these params once on tiny inputs of this geometry; (ok, reason)."""
    if jax.default_backend() != "gpu":
        return False, f"backend is {jax.default_backend()}, not gpu"
    probe = dataclasses.replace(geometry, num_layers=1, pages_per_layer=2)
    params = dataclasses.replace(params, interpret=False)
    try:
        pool = init_pool(probe, dtype)
        q = jnp.ones((1, probe.q_heads, probe.head_dim), dtype)
        tables = jnp.ones((1, probe.table_width), jnp.int32)
        out = jax.jit(lambda q, pool, t: paged_decode_attention_pallas(
            q, pool.k, pool.v, t, jnp.array([3], jnp.int32), params=params))(q, pool, tables)
        jax.block_until_ready(out)
        if not bool(jnp.all(jnp.isfinite(out.astype(jnp.float32)))):
            return False, "probe returned non-finite values"
    except Exception as e:   # noqa: BLE001 - any lowering/compile failure means: use the pure-JAX path
        return False, f"{type(e).__name__}: {str(e)[:300]}"
    return True, "ok"


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) if tokens > 0 else 0


# Sequence length the pool's capacity is quoted in (Kevin's response budget).
QUOTE_TOKENS = 16384


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """How big the KV pool is and why (kevin_jax.sampler.kv_cache.plan_pool)."""
    pages_per_layer: int          # including the scratch page 0
    page_size: int
    bytes_per_device: int         # K + V bytes of the pool on each device
    rule: str                     # how it was sized, in words

    @property
    def tokens(self) -> int:
        """Tokens the pool holds at once (pages shared by a common prompt prefix count once)."""
        return (self.pages_per_layer - 1) * self.page_size

    def describe(self, slots: int, max_seq_len: int, where: str) -> str:
        return (f"KV pool: {self.pages_per_layer} pages x {self.page_size} tokens = "
                f"{self.bytes_per_device / 1e9:.2f} GB per device ({where}), holds {self.tokens} tokens = "
                f"{self.tokens / QUOTE_TOKENS:.1f} sequences of {QUOTE_TOKENS // 1024}k "
                f"({self.tokens / max_seq_len:.1f} of max_seq_len={max_seq_len}) for {slots} slots; {self.rule}")


def workspace_bytes(model, *, prefill_tokens: int, slots: int, tensor: int) -> int:
    """Device memory the sampler's calls need besides weights and pool, per device (an upper bound): a prefill call's
    activations (float32, every per-token tensor of one layer live at once), the decode logits and sampling
    temporaries (float32 [slots, vocab / tensor], x4), and 1 GiB for collectives, cuBLAS and XLA workspaces."""
    per_token = (4 * model.hidden_size
                 + (3 * model.intermediate_size + 2 * model.num_attention_heads * model.head_dim
                    + 4 * model.num_key_value_heads * model.head_dim) // tensor)
    prefill = prefill_tokens * per_token * 4
    decode = 4 * slots * (model.vocab_size // tensor) * 4
    return max(prefill, decode) + (1 << 30)


def plan_pool(*, worst_case_tokens: int, page_size: int, page_bytes_per_device: int, num_pages: int = 0,
              kv_cache_gb: float = 0.0, fraction: float = 0.0, limit_bytes: int | None = None,
              in_use_bytes: int = 0, weight_copy_bytes: int = 0, workspace: int = 0) -> PoolPlan:
    """Pages per layer of the KV pool, by the first rule that applies:
      num_pages > 0     exactly that many;
      kv_cache_gb > 0   that many GB per device;
      fraction > 0 and the device reports its memory limit (GPU): that fraction of what is left of the limit (JAX's
                        cap, gpu.jax_memory_fraction of the card) after what is in use now, the sampler's weight copy
                        (made at each generate call) and its workspace;
      otherwise         the dense worst case (every slot at max_seq_len).
    The explicit and memory rules are capped at the dense worst case (more pages could never be used)."""
    worst = pages_for(worst_case_tokens, page_size) + 1
    gb = 1e9
    if num_pages:
        pages, rule = num_pages, "sampler.num_pages"
    elif kv_cache_gb > 0:
        pages = min(worst, max(2, int(kv_cache_gb * gb) // page_bytes_per_device))
        rule = f"sampler.kv_cache_gb={kv_cache_gb:g}" + (" (capped at the dense worst case)" if pages == worst else "")
    elif fraction > 0 and limit_bytes:
        left = limit_bytes - in_use_bytes - weight_copy_bytes - workspace
        if left < 2 * page_bytes_per_device:
            raise ValueError(
                f"no device memory left for the KV pool: limit {limit_bytes / gb:.1f} GB - in use "
                f"{in_use_bytes / gb:.1f} - the sampler's weight copy {weight_copy_bytes / gb:.1f} - workspace "
                f"{workspace / gb:.1f} = {left / gb:.1f} GB. Free memory before sampling, raise gpu.jax_memory_fraction, use more devices "
                f"(tensor parallelism splits the weight copy), or set sampler.kv_cache_gb / num_pages")
        pages = min(worst, max(2, int(left * fraction) // page_bytes_per_device))
        rule = (f"sampler.kv_cache_fraction={fraction:g} of {left / gb:.1f} GB = limit {limit_bytes / gb:.1f} - in use "
                f"{in_use_bytes / gb:.1f} - weight copy {weight_copy_bytes / gb:.1f} - workspace {workspace / gb:.1f}")
        if pages == worst:
            rule += " (capped at the dense worst case)"
    else:
        pages, rule = worst, "the dense worst case (max_slots x max_seq_len)"
    return PoolPlan(pages_per_layer=pages, page_size=page_size, bytes_per_device=pages * page_bytes_per_device,
                    rule=rule)


def memory_limits(device) -> tuple[int | None, int]:
    """(bytes JAX may use on `device`, bytes in use now); (None, 0) where the platform reports no statistics."""
    if device.platform != "gpu":
        return None, 0
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - e.g. a compile-only (deviceless) device: no statistics to read
        return None, 0
    return stats.get("bytes_limit") or None, stats.get("bytes_in_use", 0)


def tensor_axis_for(mesh, kv_heads: int, axis: str = "tensor") -> str | None:
    """The mesh axis that splits KV heads (None = replicate): 'tensor' when it exists and divides kv_heads."""
    if mesh is None or axis not in mesh.shape or mesh.shape[axis] == 1:
        return None
    if kv_heads % mesh.shape[axis]:
        raise ValueError(f"mesh axis {axis}={mesh.shape[axis]} does not divide num_key_value_heads={kv_heads}: the "
                         f"KV cache is split by heads; use a tensor axis that divides {kv_heads}")
    return axis

