"""The jitted device work of the sampler: a cached forward through the model's own layers, prefill, and a decode loop.

The layers are the model's own `DecoderLayer`s, run through its attention hook (docs/ARCHITECTURE.md, Contract 3): the
sampler's attention_fn writes the new keys/values into the paged pool and attends over the pages. The layer loop is a
scan here (not `Qwen2ForCausalLM.run_layers`) only because the pool must ride in the scan *carry*: as run_layers'
per-layer scanned state it would be re-stacked, i.e. copied whole, on every decode step.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kevin_jax import parallel
from kevin_jax.model import qwen2
from kevin_jax.sampler import kv_cache, sampling
from kevin_jax.sampler.kv_cache import KVPool, PoolGeometry

# Why a sequence stopped, as stored on device (0 = still running).
RUNNING, EOS, STOP, LENGTH = 0, 1, 2, 3
REASON_NAMES = {EOS: "eos", STOP: "stop", LENGTH: "length"}
NO_TOKEN = -1


class CacheContext(NamedTuple):
    """ctx of the cached attention (identical for every layer)."""
    write_pages: jax.Array    # [B, T] page (layer 0 numbering) each new token is stored in; 0 = scratch
    write_offsets: jax.Array  # [B, T] slot inside that page
    tables: jax.Array         # [B, W] each row's pages
    q_positions: jax.Array    # [B, T] absolute position of each query token
    kv_lengths: jax.Array     # [B] tokens in the row's pages after the write (what attention may read)


class PrefillBatch(NamedTuple):
    tokens: jax.Array         # [R, C] prompt pieces, right-padded
    positions: jax.Array      # [R, C] absolute positions
    valid: jax.Array          # [R, C] bool
    tables: jax.Array         # [R, W]
    kv_lengths: jax.Array     # [R] = last valid position + 1
    last_index: jax.Array     # [R] index in the row of its last valid token
    sample_row: jax.Array     # [R] bool: this piece ends the prompt, draw the first token
    sequence_ids: jax.Array   # [R]
    gen_index: jax.Array      # [R] generation index of the token to draw (its RNG position)
    max_new: jax.Array        # [R]
    recent: jax.Array         # [R, S] last generated tokens before this one (for stop sequences), -1 = none


class SlotState(NamedTuple):
    """Per decode slot, [N] unless noted. The last token is sampled but not yet in the cache."""
    last_token: jax.Array
    cache_len: jax.Array      # tokens in the cache = position of last_token
    gen_count: jax.Array      # tokens generated so far (last_token included)
    max_new: jax.Array
    active: jax.Array         # bool
    sequence_ids: jax.Array
    tables: jax.Array         # [N, W]
    recent: jax.Array         # [N, S]


class DecodeWeights(NamedTuple):
    """What the unrolled decode step reads: each layer's parameters as separate arrays, and the LM head, all in the
    compute dtype. Made once per generate call (StepFunctions.prepare) so that no decode step slices or converts."""
    layers: tuple             # num_layers nnx.States of one layer's parameters (no leading layer axis)
    head: jax.Array           # [V, H]


class DecodeOutput(NamedTuple):
    tokens: jax.Array           # [N, K], NO_TOKEN where the slot produced nothing
    logprobs: jax.Array         # [N, K]
    policy_logprobs: jax.Array  # [N, K]
    reasons: jax.Array          # [N] why each slot stopped during this call (RUNNING = did not)
    steps: jax.Array            # [] decode steps run


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """Everything static about the compiled step functions."""
    geometry: PoolGeometry
    temperature: float
    top_k: int
    top_p: float
    stop_ids: tuple[int, ...]
    stop_patterns: tuple[tuple[int, ...], ...]   # right-aligned, -2 = any; width = recent width
    decode_impl: str                              # "pallas" | "xla"
    pallas: kv_cache.PallasParams | None
    layer_unroll: int | bool                      # of the layer scan (prefill; decode with layer_loop="scan")
    decode_steps: int
    layer_loop: str = "unrolled"                  # decode: "unrolled" over DecodeWeights | "scan" over the stack


def stop_patterns(stop_sequences, width: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple([-2] * (width - len(s)) + list(s)) for s in stop_sequences)


def finish_reasons(tokens, gen_count, max_new, recent, settings: StepSettings) -> jax.Array:
    """EOS beats a stop sequence beats the length limit."""
    reason = jnp.where(gen_count >= max_new, LENGTH, RUNNING)
    if settings.stop_patterns:
        patterns = jnp.asarray(np.array(settings.stop_patterns, np.int32))                  # [P, S]
        match = jnp.all((patterns[None] == -2) | (recent[:, None, :] == patterns[None]), axis=-1)
        reason = jnp.where(jnp.any(match, axis=-1), STOP, reason)
    if settings.stop_ids:
        reason = jnp.where(jnp.isin(tokens, jnp.asarray(settings.stop_ids, jnp.int32)), EOS, reason)
    return reason.astype(jnp.int32)


def push_recent(recent, tokens):
    return jnp.concatenate([recent[:, 1:], tokens[:, None]], axis=1)


# ----------------------------------------------------------------------------------------------- forward
def make_cache_attention(settings: StepSettings, precision, mesh, tensor_axis):
    geometry = settings.geometry
    pallas_decode = None
    if settings.decode_impl == "pallas":
        pallas_decode = kv_cache.shard_heads(
            functools.partial(kv_cache.paged_decode_attention_pallas, params=settings.pallas), mesh, tensor_axis)

    def attention(q, k, v, layer_state, ctx: CacheContext):
        pool, layer = layer_state
        pool = kv_cache.write_kv(pool, layer, k, v, ctx.write_pages, ctx.write_offsets, geometry)
        if pallas_decode is not None and q.shape[1] == 1:
            layer_tables = ctx.tables + layer * geometry.pages_per_layer
            out = pallas_decode(q[:, 0], pool.k, pool.v, layer_tables, ctx.kv_lengths)[:, None]
        else:
            out = kv_cache.paged_attention_xla(q, pool, layer, ctx.tables, ctx.q_positions, ctx.kv_lengths,
                                               geometry, precision=precision)
        return out, (pool, layer)

    return attention


def cached_forward(model: qwen2.Qwen2ForCausalLM, tokens, positions, pool: KVPool, ctx: CacheContext, attention,
                   unroll) -> tuple[jax.Array, KVPool]:
    """Final-normed hidden states [B, T, H] of tokens at positions, writing their K/V into the pool."""
    hidden = model.embed(tokens)
    rope = qwen2.rope_tables(positions, model.config.head_dim, model.config.rope_theta)
    graphdef, layer_params = nnx.split(model.layers)

    def body(carry, scanned):
        x, pool = carry
        params, layer = scanned
        x, (pool, _) = nnx.merge(graphdef, params)(x, rope, attention, ctx, (pool, layer))
        return (x, pool), None

    layers = jnp.arange(model.config.num_hidden_layers, dtype=jnp.int32)
    (hidden, pool), _ = jax.lax.scan(body, (hidden, pool), (layer_params, layers), unroll=unroll)
    return model.final_hidden(hidden), pool


def unrolled_cached_forward(model: qwen2.Qwen2ForCausalLM, weights: DecodeWeights, tokens, positions, pool: KVPool,
                            ctx: CacheContext, attention) -> tuple[jax.Array, KVPool]:
    """cached_forward with the layers as straight-line code over per-layer weight arrays (read in place: a scan over
    the stacked parameters makes XLA:GPU copy each layer's weights out of the stack on every step)."""
    hidden = model.embed(tokens)
    rope = qwen2.rope_tables(positions, model.config.head_dim, model.config.rope_theta)
    layer_graphdef = nnx.split(model.layers)[0]
    for index, layer_params in enumerate(weights.layers):
        hidden, (pool, _) = nnx.merge(layer_graphdef, layer_params)(hidden, rope, attention, ctx, (pool, index))
    return model.final_hidden(hidden), pool


def decode_weights(model: qwen2.Qwen2ForCausalLM) -> DecodeWeights:
    """Per-layer copies of the stacked layer parameters and the LM head, in the compute dtype."""
    dtype = model.options.compute_dtype
    layer_params = nnx.split(model.layers)[1]
    layers = tuple(jax.tree.map(lambda p, i=i: p[i].astype(dtype), layer_params)
                   for i in range(model.config.num_hidden_layers))
    return DecodeWeights(layers=layers, head=model.head_weight())


def head_logits(model: qwen2.Qwen2ForCausalLM, normed: jax.Array, head: jax.Array | None) -> jax.Array:
    """float32 [B, V] logits (Qwen2ForCausalLM.logits, from a ready-made compute-dtype head when given)."""
    if head is None:
        return model.logits(normed)
    return jnp.einsum("...h,vh->...v", normed, head, precision=model.options.precision,
                      preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------------------------- step functions
class StepFunctions:
    """The compiled prefill and decode functions for one model graph and one StepSettings."""

    def __init__(self, graphdef, settings: StepSettings, *, mesh=None, tensor_axis=None):
        self.graphdef = graphdef
        self.settings = settings
        self.mesh = mesh
        self.tensor_axis = tensor_axis
        self.prefill = jax.jit(self._traced(self._prefill), donate_argnums=(1,))
        # decode(params, weights, pool, state, seed, refill_threshold): weights = prepare(params) for the unrolled
        # layer loop, None for the scan.
        self.decode = jax.jit(self._traced(self._decode), donate_argnums=(2,))
        self.prepare = jax.jit(self._traced(self._prepare))

    def _traced(self, fn):
        """Traces under the mesh's activation-sharding rules (D's model pins activations through them)."""
        if self.mesh is None:
            return fn

        @functools.wraps(fn)
        def wrapped(*args):
            with parallel.activation_sharding(self.mesh):
                return fn(*args)

        return wrapped

    def _attention(self, model):
        return make_cache_attention(self.settings, model.options.precision, self.mesh, self.tensor_axis)

    def _prepare(self, params) -> DecodeWeights:
        return decode_weights(nnx.merge(self.graphdef, params))

    def _sample(self, model, normed_last, seed, sequence_ids, gen_index, head=None):
        logits = head_logits(model, normed_last, head)                              # [B, V] float32
        keys = sampling.token_keys(seed, sequence_ids, gen_index)
        s = self.settings
        return sampling.sample(logits, keys, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)

    def _prefill(self, params, pool: KVPool, batch: PrefillBatch, seed):
        model = nnx.merge(self.graphdef, params)
        page = self.settings.geometry.page_size
        page_index = jnp.clip(batch.positions // page, 0, batch.tables.shape[1] - 1)
        write_pages = jnp.where(batch.valid, jnp.take_along_axis(batch.tables, page_index, axis=1), 0)
        ctx = CacheContext(write_pages, batch.positions % page, batch.tables, batch.positions, batch.kv_lengths)
        normed, pool = cached_forward(model, batch.tokens, batch.positions, pool, ctx, self._attention(model),
                                      self.settings.layer_unroll)
        last = jnp.take_along_axis(normed, batch.last_index[:, None, None], axis=1)[:, 0]
        drawn = self._sample(model, last, seed, batch.sequence_ids, batch.gen_index)
        recent = push_recent(batch.recent, drawn.tokens)
        reasons = finish_reasons(drawn.tokens, batch.gen_index + 1, batch.max_new, recent, self.settings)
        reasons = jnp.where(batch.sample_row, reasons, RUNNING)
        return pool, drawn, reasons

    def _decode(self, params, weights: DecodeWeights | None, pool: KVPool, state: SlotState, seed, refill_threshold):
        model = nnx.merge(self.graphdef, params)
        attention = self._attention(model)
        if weights is None:
            forward = functools.partial(cached_forward, model, attention=attention, unroll=self.settings.layer_unroll)
            head = None
        else:
            forward = functools.partial(unrolled_cached_forward, model, weights, attention=attention)
            head = weights.head
        page = self.settings.geometry.page_size
        steps = self.settings.decode_steps
        slots = state.last_token.shape[0]
        out = DecodeOutput(tokens=jnp.full((slots, steps), NO_TOKEN, jnp.int32),
                           logprobs=jnp.zeros((slots, steps), jnp.float32),
                           policy_logprobs=jnp.zeros((slots, steps), jnp.float32),
                           reasons=jnp.zeros((slots,), jnp.int32), steps=jnp.int32(0))

        def cond(carry):
            _, st, o = carry
            finished = jnp.sum(o.reasons != RUNNING)
            return (o.steps < steps) & jnp.any(st.active) & (finished < refill_threshold)

        def body(carry):
            pool, st, o = carry
            active = st.active
            tables = jnp.where(active[:, None], st.tables, 0)
            page_index = jnp.clip(st.cache_len // page, 0, tables.shape[1] - 1)
            write_pages = jnp.take_along_axis(tables, page_index[:, None], axis=1)
            ctx = CacheContext(write_pages, (st.cache_len % page)[:, None], tables, st.cache_len[:, None],
                               jnp.where(active, st.cache_len + 1, 1))
            normed, pool = forward(st.last_token[:, None], st.cache_len[:, None], pool, ctx)
            drawn = self._sample(model, normed[:, 0], seed, st.sequence_ids, st.gen_count, head)
            gen_count = st.gen_count + active
            recent = jnp.where(active[:, None], push_recent(st.recent, drawn.tokens), st.recent)
            reasons = jnp.where(active, finish_reasons(drawn.tokens, gen_count, st.max_new, recent, self.settings),
                                RUNNING)
            col = o.steps
            o = DecodeOutput(
                tokens=o.tokens.at[:, col].set(jnp.where(active, drawn.tokens, NO_TOKEN)),
                logprobs=o.logprobs.at[:, col].set(jnp.where(active, drawn.logprobs, 0.0)),
                policy_logprobs=o.policy_logprobs.at[:, col].set(jnp.where(active, drawn.policy_logprobs, 0.0)),
                reasons=jnp.where(reasons != RUNNING, reasons, o.reasons), steps=o.steps + 1)
            st = st._replace(last_token=jnp.where(active, drawn.tokens, st.last_token),
                             cache_len=st.cache_len + active, gen_count=gen_count, recent=recent,
                             active=active & (reasons == RUNNING))
            return pool, st, o

        pool, state, out = jax.lax.while_loop(cond, body, (pool, state, out))
        return pool, state, out


@functools.lru_cache(maxsize=32)
def step_functions(graphdef, settings: StepSettings, mesh=None, tensor_axis=None) -> StepFunctions:
    """Shared per (graph, settings, mesh): engines built alike reuse one set of compiled functions."""
    return StepFunctions(graphdef, settings, mesh=mesh, tensor_axis=tensor_axis)
