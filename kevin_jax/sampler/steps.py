"""The jitted device work of the sampler: the weight copy, a cached forward through the model's own layers, prefill,
and a decode loop.

The layers are the model's own `DecoderLayer`s, run through its attention hook (docs/ARCHITECTURE.md, Contract 3): the
sampler's attention_fn writes the new keys/values into the paged pool and attends over the pages. The pool is threaded
through the layers as one carried buffer (in-place scatters), never as a per-layer scanned state (which would be
re-stacked, i.e. copied whole, on every decode step).

Everything reads `SamplerWeights` (kevin_jax.sampler.layout): the parameters copied once per generate call into the
sampling layout (tensor-parallel over the sampler's mesh) and the compute dtype. Decode runs all layers in one jitted
device loop. Prefill runs one jitted call per layer from the host, so that it reads the same per-layer arrays as decode
(no second copy of the weights) while compiling one layer per prompt shape, not the whole unrolled stack (at 64 layers
that is ~20 s per shape, and prefill has a shape per bucket).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kevin_jax import parallel
from kevin_jax.model import qwen2
from kevin_jax.sampler import kv_cache, layout, sampling
from kevin_jax.sampler.kv_cache import KVPool, PoolGeometry

SamplerWeights = layout.SamplerWeights

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
    layer_loop: str = "unrolled"                  # "unrolled": per-layer weight copies | "scan": one stack


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


def head_logits(normed: jax.Array, head: jax.Array, dtype, precision) -> jax.Array:
    """float32 [B, V] logits of final-normed hidden states (Qwen2ForCausalLM.logits on the sampler's head copy)."""
    return jnp.einsum("...h,vh->...v", normed, head.astype(dtype), precision=precision,
                      preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class ModelParts:
    """The static pieces of a Qwen2ForCausalLM graph the step functions run: the whole model's graph (to read its
    parameters), one decoder layer's graph (merged with one layer's parameters, or the stack's) and the final norm's."""
    graphdef: nnx.GraphDef
    layer_graphdef: nnx.GraphDef
    norm_graphdef: nnx.GraphDef
    config: qwen2.Qwen2Config
    options: qwen2.ModelOptions

    @classmethod
    def of(cls, model: qwen2.Qwen2ForCausalLM) -> "ModelParts":
        return cls(nnx.split(model)[0], nnx.split(model.layers)[0], nnx.split(model.final_norm)[0], model.config,
                   model.options)


# ----------------------------------------------------------------------------------------------- step functions
class StepFunctions:
    """The compiled functions for one model graph, one StepSettings and one sampling mesh:

      prepare(params) -> SamplerWeights       the copy in the sampling layout and compute dtype (reshard + cast)
      view(params) -> SamplerWeights          the parameters themselves (no copy), for layer_loop="scan"
      prefill(weights, pool, batch, seed)     -> (pool, Sampled of the rows' first tokens, reasons)
      decode(weights, pool, state, seed, refill_threshold) -> (pool, state, DecodeOutput)
    `seed` is a uint32 scalar (every row) or one per row ([R] / [N]: rows of different requests in one batch).
    """

    def __init__(self, parts: ModelParts, settings: StepSettings, *, mesh=None, tensor_axis=None):
        self.parts = parts
        self.graphdef = parts.graphdef
        self.settings = settings
        self.mesh = mesh
        self.tensor_axis = tensor_axis
        self.num_layers = parts.config.num_hidden_layers
        self.dtype = parts.options.compute_dtype
        self.precision = parts.options.precision
        self._prepare_jits: dict | None = None
        self.weight_shardings: layout.SamplerWeights | None = None
        self.decode = jax.jit(self._traced(self._decode), donate_argnums=(1,))
        self.prefill_start = jax.jit(self._traced(self._prefill_start))
        self.prefill_layer = jax.jit(self._traced(self._prefill_layer), donate_argnums=(4,))
        self.prefill_finish = jax.jit(self._traced(self._prefill_finish))

    def _traced(self, fn):
        """Traces under the mesh's activation-sharding rules (the model pins activations through them)."""
        return parallel.traced_with_activation_sharding(fn, self.mesh)

    # ------------------------------------------------------------------ weights
    def _weights(self, params, copy: bool) -> layout.SamplerWeights:
        return layout.extract(nnx.merge(self.graphdef, params), copy=copy,
                              unrolled=self.settings.layer_loop == "unrolled")

    def prepare_jits(self, params) -> dict:
        """The jitted copy functions (out_shardings = the sampling layout), built on first use from params' shapes:
          unrolled: "layer" (stacked layer parameters, index) -> one layer's copy, and "rest" (params) -> (embedding,
            final norm, head). One layer at a time: resharding the whole stack in one call makes XLA gather it whole
            first (20 GB of temporaries per GPU at QwQ-32B on 4 GPUs, by the deviceless compile); a layer at a time
            the temporaries are one layer's.
          scan: "whole" (params) -> the stacked copy."""
        if self._prepare_jits is None:
            out = None
            if self.mesh is not None:
                abstract = jax.eval_shape(lambda p: self._weights(p, copy=True), params)
                out = self.weight_shardings = layout.weight_shardings(abstract, self.mesh)
            if self.settings.layer_loop == "unrolled":
                self._prepare_jits = {
                    "layer": jax.jit(self._copy_layer, out_shardings=None if out is None else out.layers[0]),
                    "rest": jax.jit(self._copy_rest,
                                    out_shardings=None if out is None else (out.embed, out.final_norm, out.head))}
            else:
                self._prepare_jits = {"whole": jax.jit(lambda p: self._weights(p, copy=True), out_shardings=out)}
        return self._prepare_jits

    def _copy_layer(self, stacked, index):
        return jax.tree.map(lambda p: jax.lax.dynamic_index_in_dim(p, index, keepdims=False).astype(self.dtype),
                            stacked)

    def _copy_rest(self, params):
        weights = layout.extract(nnx.merge(self.graphdef, params), copy=True, unrolled=False)
        return weights.embed, weights.final_norm, weights.head

    def stacked_layers(self, params):
        """The stacked layer parameters of a model state (the same arrays)."""
        return nnx.split(nnx.merge(self.graphdef, params).layers)[1]

    def prepare(self, params) -> layout.SamplerWeights:
        jits = self.prepare_jits(params)
        if "whole" in jits:
            return jits["whole"](params)
        stacked = self.stacked_layers(params)
        layers = tuple(jits["layer"](stacked, np.int32(i)) for i in range(self.num_layers))
        embed, final_norm, head = jits["rest"](params)
        return layout.SamplerWeights(embed=embed, layers=layers, final_norm=final_norm, head=head)

    def view(self, params) -> layout.SamplerWeights | None:
        """The parameters as SamplerWeights without a copy when they already have the sampling layout (one device, or
        a trainer mesh laid out like the sampler's), else None. Layers stay stacked (layer_loop="scan")."""
        weights = self._weights(params, copy=False)
        if self.mesh is None:
            return weights
        target = layout.weight_shardings(jax.eval_shape(lambda w: w, weights), self.mesh)
        return weights if layout.has_layout(weights, target) else None

    # ------------------------------------------------------------------ forward pieces
    def _embed(self, weights: layout.SamplerWeights, tokens):
        hidden = jnp.take(weights.embed, tokens, axis=0).astype(self.dtype)
        return parallel.constrain(hidden, ("batch", "seq", "act_embed"))

    def _rope(self, positions):
        return qwen2.rope_tables(positions, self.parts.config.head_dim, self.parts.config.rope_theta)

    def _layer(self, layer_params, hidden, rope, attention, ctx, pool, index):
        layer = nnx.merge(self.parts.layer_graphdef, layer_params)
        hidden, (pool, _) = layer(hidden, rope, attention, ctx, (pool, index))
        return hidden, pool

    def _final_norm(self, weights: layout.SamplerWeights, hidden):
        return nnx.merge(self.parts.norm_graphdef, weights.final_norm)(hidden)

    def _forward(self, weights: layout.SamplerWeights, tokens, positions, pool: KVPool, ctx: CacheContext,
                 attention) -> tuple[jax.Array, KVPool]:
        """Final-normed hidden states [B, T, H] of tokens at positions, writing their K/V into the pool. Unrolled
        over per-layer arrays (read in place: a scan over a stack makes XLA:GPU copy each layer's weights out of it
        on every step), or a scan over the stacked layers (layer_loop="scan")."""
        hidden = self._embed(weights, tokens)
        rope = self._rope(positions)
        if weights.stacked:
            def body(carry, scanned):
                x, pool = carry
                params, index = scanned
                return self._layer(params, x, rope, attention, ctx, pool, index), None

            indices = jnp.arange(self.num_layers, dtype=jnp.int32)
            (hidden, pool), _ = jax.lax.scan(body, (hidden, pool), (weights.layers, indices),
                                             unroll=self.settings.layer_unroll)
        else:
            for index, layer_params in enumerate(weights.layers):
                hidden, pool = self._layer(layer_params, hidden, rope, attention, ctx, pool, index)
        return self._final_norm(weights, hidden), pool

    def _attention(self):
        return make_cache_attention(self.settings, self.precision, self.mesh, self.tensor_axis)

    def _sample(self, normed_last, head, seed, sequence_ids, gen_index):
        logits = head_logits(normed_last, head, self.dtype, self.precision)           # [B, V] float32
        keys = sampling.token_keys(seed, sequence_ids, gen_index)
        s = self.settings
        return sampling.sample(logits, keys, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)

    # ------------------------------------------------------------------ prefill: one call per layer
    def prefill(self, weights: layout.SamplerWeights, pool: KVPool, batch: PrefillBatch, seed):
        """Writes the batch's K/V into the pool; draws each sampling row's first token. Returns (pool, Sampled,
        reasons)."""
        hidden, rope, ctx = self.prefill_start(weights.embed, batch)
        for index in range(self.num_layers):
            layer = weights.layers if weights.stacked else weights.layers[index]
            hidden, pool = self.prefill_layer(layer, hidden, rope, ctx, pool, np.int32(index))
        drawn, reasons = self.prefill_finish(weights.final_norm, weights.head_weight(), hidden, batch, seed)
        return pool, drawn, reasons

    def _prefill_start(self, embed, batch: PrefillBatch):
        page = self.settings.geometry.page_size
        page_index = jnp.clip(batch.positions // page, 0, batch.tables.shape[1] - 1)
        write_pages = jnp.where(batch.valid, jnp.take_along_axis(batch.tables, page_index, axis=1), 0)
        ctx = CacheContext(write_pages, batch.positions % page, batch.tables, batch.positions, batch.kv_lengths)
        hidden = jnp.take(embed, batch.tokens, axis=0).astype(self.dtype)
        return parallel.constrain(hidden, ("batch", "seq", "act_embed")), self._rope(batch.positions), ctx

    def _prefill_layer(self, layer_params, hidden, rope, ctx: CacheContext, pool: KVPool, index):
        # A stack (layer_loop="scan": a leading layer axis, so the input norm's scale is 2-D): this layer's slice.
        if jax.tree.leaves(layer_params["input_norm"])[0].ndim == 2:
            layer_params = jax.tree.map(lambda p: jax.lax.dynamic_index_in_dim(p, index, keepdims=False),
                                        layer_params)
        return self._layer(layer_params, hidden, rope, self._attention(), ctx, pool, index)

    def _prefill_finish(self, final_norm, head, hidden, batch: PrefillBatch, seed):
        last = jnp.take_along_axis(hidden, batch.last_index[:, None, None], axis=1)[:, 0]
        normed = nnx.merge(self.parts.norm_graphdef, final_norm)(last)
        drawn = self._sample(normed, head, seed, batch.sequence_ids, batch.gen_index)
        recent = push_recent(batch.recent, drawn.tokens)
        reasons = finish_reasons(drawn.tokens, batch.gen_index + 1, batch.max_new, recent, self.settings)
        return drawn, jnp.where(batch.sample_row, reasons, RUNNING)

    # ------------------------------------------------------------------ decode: one device loop
    def _decode(self, weights: layout.SamplerWeights, pool: KVPool, state: SlotState, seed, refill_threshold):
        attention = self._attention()
        head = weights.head_weight()
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
            normed, pool = self._forward(weights, st.last_token[:, None], st.cache_len[:, None], pool, ctx,
                                         attention)
            drawn = self._sample(normed[:, 0], head, seed, st.sequence_ids, st.gen_count)
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


_FUNCTIONS: "collections.OrderedDict[tuple, StepFunctions]" = collections.OrderedDict()
_MAX_CACHED = 32


def step_functions(model: qwen2.Qwen2ForCausalLM, settings: StepSettings, mesh=None,
                   tensor_axis=None) -> StepFunctions:
    """Shared per (graph, settings, mesh): engines built alike reuse one set of compiled functions."""
    parts = ModelParts.of(model)
    key = (parts, settings, mesh, tensor_axis)
    if key in _FUNCTIONS:
        _FUNCTIONS.move_to_end(key)
        return _FUNCTIONS[key]
    functions = _FUNCTIONS[key] = StepFunctions(parts, settings, mesh=mesh, tensor_axis=tensor_axis)
    while len(_FUNCTIONS) > _MAX_CACHED:
        _FUNCTIONS.popitem(last=False)
    return functions
