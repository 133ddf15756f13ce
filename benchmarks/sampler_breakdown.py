"""Where one decode step of the sampler spends its time: the parts of the step timed apart on the same shapes.

Used by benchmarks/sampler.py. A `Scene` is one decode batch frozen at realistic cache lengths: a KV pool of the
engine's geometry filled with random values, page tables over randomly placed pages, and the sampler's weights (on
the engine's mesh when it has one: the parts then run tensor-parallel, as the sampler does). Each part runs
`iterations` times inside one jitted fori_loop (device time only, no host round trip), chained through a carried value
so that nothing is hoisted out of the loop:

  layers       the decoder layers' matmuls, norms and RoPE with the attention replaced by a no-op (out = q, nothing
               written): the weight-streaming part of a step; "unrolled" over per-layer weight copies (what the
               sampler runs) or "scan" over the stacked parameters (where XLA:GPU copies each layer's weights).
  attention    one layer's decode attention over the live pages (Pallas kernel with given blocking, or the pure-JAX
               fallback), times num_layers.
  kv_write     one layer's scatter of the new token's K and V into the pool, times num_layers.
  head+sample  LM head matmul ([B, H] x [V, H] -> float32 logits) followed by the sampler's draw and log-probs.
  sample       the draw and log-probs alone, on fixed float32 logits.
  step         the real decode call (engine.functions.decode: a device while-loop of decode_steps steps, with its
               per-step stop checks), on the scene's slots; per step.
"""
from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kevin_jax import parallel
from kevin_jax.model import qwen2
from kevin_jax.sampler import kv_cache, sampling, steps
from kevin_jax.sampler.kv_cache import KVPool


@dataclasses.dataclass
class Scene:
    model: qwen2.Qwen2ForCausalLM
    params: object                  # nnx.State of the model
    weights: steps.SamplerWeights   # what the sampler reads (engine.weights(params))
    geometry: kv_cache.PoolGeometry
    lengths: np.ndarray             # [B] tokens in each slot's cache
    tables: np.ndarray              # [B, W] layer-0 page ids (room for `headroom` more tokens)
    pool: KVPool
    mesh: object = None             # the engine's mesh (None = one device)
    tensor_axis: str | None = None

    def traced(self, fn):
        """fn traced under the mesh's activation-sharding rules (what the engine's step functions do)."""
        return parallel.traced_with_activation_sharding(fn, self.mesh)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def kv_bytes_per_layer(self) -> float:
        """K + V bytes one layer's attention must read for the scene's lengths."""
        return float(self.lengths.sum()) * self.geometry.bytes_per_token(jnp.bfloat16) / self.geometry.num_layers


def random_pool(geometry: kv_cache.PoolGeometry, dtype, seed: int = 0, sharding=None) -> KVPool:
    """A pool of finite random values (exponent-limited random bits: no NaN/Inf, no big float32 temporary)."""
    shape = kv_cache.pool_shape(geometry)

    @functools.partial(jax.jit, out_shardings=None if sharding is None else (sharding, sharding))
    def create(key):
        def one(k):
            bits = jax.random.bits(k, shape, jnp.uint16)
            return jax.lax.bitcast_convert_type((bits & 0x0FFF) | 0x3C00, jnp.bfloat16).astype(dtype)
        ka, kb = jax.random.split(key)
        return one(ka), one(kb)

    return KVPool(*create(jax.random.key(seed)))


def scene_pages(lengths, headroom: int, page_size: int, share: int, shared_tokens: int) -> int:
    """Pages per layer a scene needs (see make_scene)."""
    shared = min(shared_tokens, int(np.min(lengths))) // page_size
    groups = -(-len(lengths) // share)
    return groups * shared + sum(kv_cache.pages_for(int(n) + headroom, page_size) - shared for n in lengths)


def make_scene(model, params, weights, geometry, lengths: np.ndarray, headroom: int, dtype, *, share: int = 1,
               shared_tokens: int = 0, seed: int = 0, engine=None, pool: KVPool | None = None) -> Scene:
    """Slots holding `lengths` tokens on randomly placed pages (room for `headroom` more tokens). Like the
    benchmark's prompts, each group of `share` consecutive slots shares the pages of its first `shared_tokens`
    tokens (the common prompt), which also keeps the pool small enough for large batches. engine: put the pool on its
    mesh (and run the parts there); pool: reuse this one (its values do not matter) instead of making one."""
    page = geometry.page_size
    shared = min(shared_tokens, int(np.min(lengths))) // page
    need = scene_pages(lengths, headroom, page, share, shared_tokens)
    if need > geometry.pages_per_layer - 1:
        raise ValueError(f"scene needs {need} pages per layer, the pool has {geometry.pages_per_layer - 1}")
    rng = np.random.default_rng(seed)
    free = iter(rng.permutation(np.arange(1, geometry.pages_per_layer, dtype=np.int32)).tolist())
    tables = np.zeros((len(lengths), geometry.table_width), np.int32)
    for row, n in enumerate(lengths):
        if row % share == 0:
            prefix = [next(free) for _ in range(shared)]
        own = kv_cache.pages_for(int(n) + headroom, page) - shared
        tables[row, :shared + own] = prefix + [next(free) for _ in range(own)]
    mesh = engine.mesh if engine is not None else None
    axis = engine.tensor_axis if engine is not None else None
    if pool is None:
        from kevin_jax.sampler import layout
        pool = random_pool(geometry, dtype, seed, layout.sharding_of_pool(mesh, axis))
    return Scene(model, params, weights, geometry, np.asarray(lengths, np.int32), tables, pool, mesh, axis)


def timed(run, args, repeats: int = 3) -> tuple[float, float]:
    """(compile + first call seconds, median seconds of `repeats` further calls). `run(*args)` returns arrays."""
    t0 = time.perf_counter()
    jax.block_until_ready(run(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run(*args))
        times.append(time.perf_counter() - t0)
    return first, float(np.median(times))


# Peak bf16 matmul rate (FLOP/s) for the compute-aware ideal; set by the caller (benchmarks/sampler.py).
PEAK_FLOPS: float | None = None


def _record(seconds_per_iteration: float, per_step: int, ideal_bytes: float, roofline_tb_s: float | None,
            compile_s: float, matmul_flops: float = 0.0, streamed_bytes: float | None = None) -> dict:
    """Per-step time and its ideal: bytes / roofline, and where matmul FLOPs are given, the weight-streaming part
    (streamed_bytes, default all) taken as max(bytes / roofline, FLOPs / peak matmul rate)."""
    step_s = seconds_per_iteration * per_step
    out = {"ms_per_step": 1e3 * step_s, "bytes_per_step_gb": ideal_bytes / 1e9, "compile_s": compile_s}
    if ideal_bytes:
        out["tb_s"] = ideal_bytes / step_s / 1e12
        if roofline_tb_s:
            out["roofline_fraction"] = out["tb_s"] / roofline_tb_s
            if matmul_flops and PEAK_FLOPS:
                streamed = ideal_bytes if streamed_bytes is None else streamed_bytes
                ideal_s = max(streamed / (roofline_tb_s * 1e12), matmul_flops / PEAK_FLOPS) \
                    + (ideal_bytes - streamed) / (roofline_tb_s * 1e12)
                out["matmul_tflop_per_step"] = matmul_flops / 1e12
                out["ideal_ms_compute_aware"] = 1e3 * ideal_s
                out["compute_aware_fraction"] = ideal_s / step_s
    return out


# ----------------------------------------------------------------------------------------------- parts
def attention_part(scene: Scene, impl: str, pallas: kv_cache.PallasParams | None, roofline_tb_s,
                   iterations: int = 8) -> dict:
    """One layer's decode attention (layer i % L at iteration i), times num_layers."""
    g = scene.geometry
    q0 = jax.random.normal(jax.random.key(1), (scene.batch, g.q_heads, g.head_dim), jnp.bfloat16)
    kernel = kv_cache.shard_heads(functools.partial(kv_cache.paged_decode_attention_pallas, params=pallas),
                                  scene.mesh, scene.tensor_axis) if impl == "pallas" else None

    @jax.jit
    @scene.traced
    def run(q, pool, tables, lengths):
        def body(i, q):
            layer = i % g.num_layers
            if impl == "pallas":
                out = kernel(q, pool.k, pool.v, tables + layer * g.pages_per_layer, lengths)
            else:
                out = kv_cache.paged_attention_xla(q[:, None], pool, layer, tables, (lengths - 1)[:, None], lengths,
                                                   g)[:, 0]
            return out.astype(q.dtype)
        return jax.lax.fori_loop(0, iterations, body, q)

    first, seconds = timed(run, (q0, scene.pool, jnp.asarray(scene.tables), jnp.asarray(scene.lengths)))
    return _record(seconds / iterations, g.num_layers, scene.kv_bytes_per_layer() * g.num_layers, roofline_tb_s,
                   first)


def kv_write_part(scene: Scene, roofline_tb_s, iterations: int = 8) -> dict:
    """One layer's scatter of one new K/V token per slot into the pool, times num_layers."""
    g = scene.geometry
    lengths = jnp.asarray(scene.lengths)
    tables = jnp.asarray(scene.tables)
    pages = jnp.take_along_axis(tables, (lengths // g.page_size)[:, None], axis=1)
    offsets = (lengths % g.page_size)[:, None]
    k = jax.random.normal(jax.random.key(2), (scene.batch, 1, g.kv_heads, g.head_dim), jnp.bfloat16)

    @functools.partial(jax.jit, donate_argnums=0)
    @scene.traced
    def run(pool, k):
        def body(i, pool):
            return kv_cache.write_kv(pool, i % g.num_layers, k, k, pages, offsets, g)
        return jax.lax.fori_loop(0, iterations, body, pool)

    first, seconds = timed(lambda k: _swap_pool(scene, run(scene.pool, k)), (k,))
    written = 2 * scene.batch * g.kv_heads * g.head_dim * 2 * g.num_layers
    return _record(seconds / iterations, g.num_layers, written, roofline_tb_s, first)


def _swap_pool(scene: Scene, pool: KVPool) -> KVPool:
    scene.pool = pool               # the pool was donated: keep the scene pointing at the live buffer
    return pool


def layers_part(scene: Scene, layer_loop: str, roofline_tb_s, weight_bytes: float, iterations: int = 4) -> dict:
    """The decoder layers without attention (out = q): weight streaming, per step ("unrolled" over the sampler's
    per-layer copies, or "scan" over the model's stacked parameters)."""
    model = scene.model
    graphdef, _ = nnx.split(model)
    layer_graphdef = nnx.split(model.layers)[0]
    config = model.config
    positions = jnp.asarray(scene.lengths)[:, None]
    x0 = jax.random.normal(jax.random.key(3), (scene.batch, 1, config.hidden_size), model.options.compute_dtype)

    def no_attention(q, k, v, state, ctx):
        return q, state

    @jax.jit
    @scene.traced
    def run(params, layers, x, positions):
        rope = qwen2.rope_tables(positions, config.head_dim, config.rope_theta)
        stacked = nnx.split(nnx.merge(graphdef, params).layers)[1]

        def body(i, x):
            if layer_loop == "unrolled":
                for layer_params in layers:
                    x, _ = nnx.merge(layer_graphdef, layer_params)(x, rope, no_attention, None, None)
                return x

            def one(x, layer_params):
                return nnx.merge(layer_graphdef, layer_params)(x, rope, no_attention, None, None)[0], None
            return jax.lax.scan(one, x, stacked)[0]
        return jax.lax.fori_loop(0, iterations, body, x)

    layers = scene.weights.layers if layer_loop == "unrolled" else None
    first, seconds = timed(run, (scene.params, layers, x0, positions))
    flops = 2.0 * config.num_hidden_layers * config.layer_param_count() * scene.batch
    return _record(seconds / iterations, 1, weight_bytes, roofline_tb_s, first, matmul_flops=flops)


def sample_part(scene: Scene, temperature: float, roofline_tb_s, with_head: bool, iterations: int = 8) -> dict:
    """The sampler's draw (+ log-probs), optionally with the LM head matmul in front; per step."""
    model = scene.model
    config = model.config
    batch = scene.batch
    ids = jnp.arange(batch, dtype=jnp.int32)
    head = scene.weights.head_weight()
    normed0 = jax.random.normal(jax.random.key(4), (batch, config.hidden_size), model.options.compute_dtype)
    logits0 = 3.0 * jax.random.normal(jax.random.key(5), (batch, config.vocab_size), jnp.float32)
    if scene.mesh is not None:        # logits split over the vocabulary, as the head's output is
        logits0 = jax.device_put(logits0, jax.sharding.NamedSharding(
            scene.mesh, jax.sharding.PartitionSpec(None, scene.tensor_axis)))

    @jax.jit
    @scene.traced
    def run(normed, logits, head):
        def body(i, carry):
            normed, total = carry
            current = (steps.head_logits(normed, head, model.options.compute_dtype, model.options.precision)
                       if with_head else logits)
            keys = sampling.token_keys(jnp.uint32(7), ids, jnp.full((batch,), i, jnp.int32))
            drawn = sampling.sample(current, keys, temperature=temperature, top_k=0, top_p=1.0)
            total = total + jnp.sum(drawn.logprobs) + jnp.sum(drawn.policy_logprobs)
            # The next input depends on this draw, so that no iteration is hoisted.
            normed = normed + (drawn.tokens[:, None] % 2).astype(normed.dtype) * jnp.asarray(1e-3, normed.dtype)
            return normed, total
        return jax.lax.fori_loop(0, iterations, body, (normed, jnp.float32(0)))

    first, seconds = timed(run, (normed0, logits0, head))
    logits_bytes = batch * config.vocab_size * 4
    head_bytes = config.vocab_size * config.hidden_size * 2
    ideal = logits_bytes + (head_bytes + logits_bytes if with_head else 0)
    flops = 2.0 * config.vocab_size * config.hidden_size * batch if with_head else 0.0
    return _record(seconds / iterations, 1, ideal, roofline_tb_s, first, matmul_flops=flops,
                   streamed_bytes=head_bytes if with_head else None)


def step_part(scene: Scene, engine, roofline_tb_s, weight_bytes: float) -> dict:
    """The engine's real decode call (decode_steps steps, device loop with stop checks) on the scene's slots."""
    g = scene.geometry
    slots = scene.batch
    if engine.config.max_slots != slots or engine.geometry != g:
        raise ValueError("step_part needs an engine built for the scene's batch and pool geometry")
    state = steps.SlotState(
        last_token=np.arange(slots, dtype=np.int32) % scene.model.config.vocab_size,
        cache_len=scene.lengths.copy(), gen_count=np.ones(slots, np.int32),
        max_new=np.full(slots, 1 << 30, np.int32), active=np.ones(slots, bool),
        sequence_ids=np.arange(slots, dtype=np.int32), tables=scene.tables,
        recent=np.full((slots, engine.recent_width), -1, np.int32))
    weights = scene.weights if engine.config.layer_loop == "unrolled" else engine.weights(scene.params)

    def run():
        pool, _, out = engine.functions.decode(weights, scene.pool, state, np.uint32(0), np.int32(slots + 1))
        scene.pool = pool
        return out.steps

    t0 = time.perf_counter()
    num_steps = int(jax.block_until_ready(run()))
    first = time.perf_counter() - t0
    # A second untimed call: the donated pool may come back with another sharding object than the scene's, and a
    # new input sharding means one more compile.
    jax.block_until_ready(run())
    t0 = time.perf_counter()
    num_steps = int(jax.block_until_ready(run()))
    seconds = (time.perf_counter() - t0) / max(1, num_steps)
    kv = float((scene.lengths + num_steps // 2).sum()) * g.bytes_per_token(jnp.bfloat16)
    flops = 2.0 * scene.model.config.matmul_param_count() * slots
    record = _record(seconds, 1, weight_bytes + kv, roofline_tb_s, first, matmul_flops=flops,
                     streamed_bytes=weight_bytes)
    record["steps_per_call"] = num_steps
    return record
