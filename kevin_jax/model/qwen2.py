"""Qwen2 / QwQ-32B decoder in Flax NNX: scanned layers, pluggable attention, chunked log-probs.

Layout of one forward pass (each piece callable on its own, which is what the sampler uses):

  embed(tokens) -> run_layers(hidden, positions, attention_fn, ctx, layer_states) -> final_norm -> logits / log-probs

The decoder layers are ONE module whose parameters carry a leading [num_layers] axis; `run_layers` runs them with
jax.lax.scan (one compiled layer body, whatever the depth; or unrolled, ModelOptions.scan_layers) under a configurable
remat policy. Attention goes through `attention_fn(q, k, v, layer_state, ctx) -> (out, new_layer_state)`
(docs/ARCHITECTURE.md, Contract 3); the default is causal attention with per-sequence segment ids (0 = padding).

Parameter layouts (leading L on layer parameters; HF names in brackets, see hf.py for the mapping):
  embed_tokens.embedding      [V, H]          (model.embed_tokens.weight)
  layers.attn.q_proj.kernel   [L, H, Hq, D]   (q_proj.weight [Hq*D, H], transposed), bias [L, Hq, D]
  layers.attn.k_proj / v_proj [L, H, Hkv, D], bias [L, Hkv, D]
  layers.attn.o_proj.kernel   [L, Hq, D, H]
  layers.mlp.gate_proj/up_proj.kernel [L, H, I], down_proj.kernel [L, I, H]
  layers.input_norm.scale, layers.post_attention_norm.scale [L, H]; final_norm.scale [H]
  lm_head.kernel              [V, H]          (lm_head.weight; absent when tie_word_embeddings)
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.ad_checkpoint import checkpoint_name

from kevin_jax import parallel
from kevin_jax.model.config import ModelOptions
from kevin_jax.model.shapes import Qwen2Config

# Checkpoint name of what the cuDNN flash attention's backward pass needs (q, k, v after RoPE, the output and the
# softmax statistics; O(T) memory). Saving it keeps the backward pass from re-running the attention forward kernel.
ATTENTION_RESIDUALS = "attention_residuals"

# Remat policies for the scanned layer body, by name (model.config.REMAT_POLICY_NAMES). "full" keeps only each layer's
# input (the least memory); "none" keeps everything (the most); the others save matmul outputs so that the backward
# pass recomputes less. Note that jax's dots policies do not see the cuDNN attention (a custom call, not a dot):
# without ATTENTION_RESIDUALS among the saved names the backward pass runs the attention forward a second time.
_policies = jax.checkpoint_policies
REMAT_POLICIES: dict[str, Any] = {
    "none": None,
    "full": _policies.nothing_saveable,
    "dots": _policies.dots_saveable,
    "dots_no_batch": _policies.dots_with_no_batch_dims_saveable,
    # Every matmul output and the attention output and residuals (MaxText's GPU "minimal_flash"): the backward pass
    # recomputes only elementwise ops (norms, RoPE, SiLU); as few FLOPs as "none" in much less memory.
    "dots_attn": _policies.save_from_both_policies(
        _policies.dots_with_no_batch_dims_saveable,
        _policies.save_only_these_names("attention_out", ATTENTION_RESIDUALS)),
    # The q/k/v projections and the attention (output and residuals): the backward pass recomputes the MLP only.
    "qkv_attn": _policies.save_only_these_names("query", "key", "value", "attention_out", ATTENTION_RESIDUALS),
    # The attention output and residuals only: the (cheap in memory, costly in FLOPs) attention is not run twice.
    "attn_out": _policies.save_only_these_names("attention_out", ATTENTION_RESIDUALS),
}

# Longest sequence for which "auto" uses XLA's dense attention when cuDNN does not apply.
_XLA_MAX_LENGTH = 4096

# A large finite negative for masked logits (finite so that fully-masked padding rows give no NaN).
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


# ------------------------------------------------------------------------------------------------ attention
@struct.dataclass
class SegmentContext:
    """The default attention's ctx: which sequence each token belongs to.

    segment_ids: [B, T] int32; tokens attend causally to earlier tokens with the same id; 0 = padding.
    right_padded: static promise that every row holds ONE sequence starting at index 0, followed only by padding.
      Then plain causal attention is exact for the real tokens, and on GPU the cuDNN flash kernel can run.
    """
    segment_ids: jax.Array
    right_padded: bool = struct.field(pytree_node=False, default=False)


AttentionFn = Callable[[jax.Array, jax.Array, jax.Array, Any, Any], tuple[jax.Array, Any]]


def _cudnn_usable(dtype, head_dim: int) -> bool:
    return jax.default_backend() == "gpu" and dtype in (jnp.bfloat16, jnp.float16) and head_dim <= 128


def segment_mask(q_segments: jax.Array, kv_segments: jax.Array, q_index: jax.Array, kv_index: jax.Array) -> jax.Array:
    """[B, Tq, S] boolean: same non-padding segment and causal by array index."""
    same = (q_segments[:, :, None] == kv_segments[:, None, :]) & (q_segments[:, :, None] != 0)
    return same & (q_index[:, None] >= kv_index[None, :])[None]


def _chunked_attention(q, k, v, segment_ids, chunk: int, precision):
    """Blockwise causal attention with segment masking; memory O(B * H * chunk * T) per step, recomputed in the
    backward pass (jax.checkpoint per chunk). Computes the full T x T grid (no causal block skipping)."""
    batch, length, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    groups = q_heads // kv_heads
    chunk = min(chunk, length)
    pad = (-length) % chunk
    q_pad = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    seg_pad = jnp.pad(segment_ids, ((0, 0), (0, pad)))
    n = (length + pad) // chunk
    q_chunks = q_pad.reshape(batch, n, chunk, kv_heads, groups, head_dim).swapaxes(0, 1)
    seg_chunks = seg_pad.reshape(batch, n, chunk).swapaxes(0, 1)
    idx_chunks = jnp.arange(length + pad, dtype=jnp.int32).reshape(n, chunk)
    kv_index = jnp.arange(length, dtype=jnp.int32)
    scale = head_dim ** -0.5

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def one_chunk(args):
        qc, segc, idxc = args
        logits = jnp.einsum("bckgd,bskd->bkgcs", qc, k, precision=precision,
                            preferred_element_type=jnp.float32) * scale
        mask = segment_mask(segc, segment_ids, idxc, kv_index)                 # [B, c, S]
        logits = jnp.where(mask[:, None, None], logits, _MASK_VALUE)
        probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        return jnp.einsum("bkgcs,bskd->bckgd", probs, v, precision=precision)

    out = jax.lax.map(one_chunk, (q_chunks, seg_chunks, idx_chunks))       # [n, B, c, Hkv, G, D]
    out = out.swapaxes(0, 1).reshape(batch, length + pad, q_heads, head_dim)
    return out[:, :length]


def save_residuals_as(name: str, fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """`fn` (positional array arguments) with the same value and gradient, whose backward-pass residuals carry the
    checkpoint name `name`, so that a remat policy such as save_only_these_names(name) can keep them."""

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def forward(*args):
        out, pullback = jax.vjp(fn, *args)      # the pullback is a pytree whose leaves are the residuals
        return out, jax.tree.map(lambda r: checkpoint_name(r, name), pullback)

    def backward(pullback, cotangent):
        return pullback(cotangent)

    wrapped.defvjp(forward, backward)
    return wrapped


_cudnn_causal_attention = save_residuals_as(
    ATTENTION_RESIDUALS,
    functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation="cudnn"))


def make_segment_attention(options: ModelOptions) -> AttentionFn:
    """The default training/scoring attention: causal within segments, padding ignored. Layer state passes through."""

    def attention(q, k, v, layer_state, ctx: SegmentContext):
        if not isinstance(ctx, SegmentContext):
            raise TypeError(f"the default attention needs a SegmentContext ctx, got {type(ctx).__name__}")
        impl = options.attention
        if impl == "auto":
            if ctx.right_padded and _cudnn_usable(q.dtype, q.shape[-1]):
                impl = "cudnn"
            else:   # XLA's attention materialises [B, H, T, T] scores: blockwise beyond a few thousand tokens
                impl = "xla" if q.shape[1] <= _XLA_MAX_LENGTH else "chunked"
        if impl == "chunked":
            out = _chunked_attention(q, k, v, ctx.segment_ids, options.attention_chunk, options.precision)
        elif impl == "cudnn":
            if not ctx.right_padded:
                raise ValueError("attention='cudnn' needs right-padded single-sequence rows (SegmentContext("
                                 "right_padded=True)); use 'xla' or 'chunked' for packed or left-padded batches")
            out = _cudnn_causal_attention(q, k, v)
        else:
            # jax.nn.dot_product_attention takes no precision argument: without this scope its fp32 dots run as TF32
            # on GPU even when the model asks for "highest" (seen on the H200: 1e-4 gradient drift across remat).
            scope = jax.default_matmul_precision("highest") if options.precision is not None else contextlib.nullcontext()
            with scope:
                if ctx.right_padded:
                    out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
                else:
                    index = jnp.arange(q.shape[1], dtype=jnp.int32)
                    mask = segment_mask(ctx.segment_ids, ctx.segment_ids, index, index)[:, None]   # [B, 1, T, S]
                    out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
        return out, layer_state

    return attention


def _unrolled_scan(body, carry, xs, length: int):
    """jax.lax.scan's contract as a Python loop. Per-layer slices come from one lax.split per array, whose transpose
    (the gradient) is one concatenate, rather than from `x[i]`, whose transpose pads every layer's gradient to the
    full [L, ...] shape."""
    leaves, treedef = jax.tree_util.tree_flatten(xs)
    pieces = [[p.reshape(p.shape[1:]) for p in jax.lax.split(leaf, [1] * length, axis=0)] for leaf in leaves]
    outputs = []
    for i in range(length):
        carry, y = body(carry, jax.tree_util.tree_unflatten(treedef, [piece[i] for piece in pieces]))
        outputs.append(y)
    return carry, jax.tree.map(lambda *ys: jnp.stack(ys), *outputs)


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
    """Position of each token within its segment (0 at each segment's first token), for packed or padded rows."""
    index = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], dtype=bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    start_index = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
    return (index - start_index).astype(jnp.int32)


def validate_right_padded(segment_ids) -> None:
    """Eager check of the right_padded promise (numpy in, raises ValueError); skipped for traced values."""
    try:
        seg = np.asarray(segment_ids)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return      # traced inside jit: the caller's promise stands
    real = seg != 0
    lengths = real.sum(axis=1)
    expected = np.arange(seg.shape[1])[None, :] < lengths[:, None]
    if not np.array_equal(real, expected):
        row = int(np.argmax((real != expected).any(axis=1)))
        raise ValueError(f"right_padded=True but row {row} is not one sequence followed by padding: "
                         f"segment ids {seg[row].tolist()[:64]}...")
    if seg.size and np.any((seg != 0) & (seg != seg[:, :1])):
        raise ValueError("right_padded=True but a row holds more than one segment id (a packed row)")


# ------------------------------------------------------------------------------------------------ rotary
def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos/sin [B, T, D/2] in float32 (HF's default RoPE: inv_freq = theta ** -(2i / D))."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = jnp.asarray(1.0 / (np.float32(theta) ** exponent), dtype=jnp.float32)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(freqs), jnp.sin(freqs)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, H, D]; rotate-half convention (first half pairs with second half), as in HF Qwen2."""
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


# ------------------------------------------------------------------------------------------------ modules
def _normal(rngs: nnx.Rngs, shape, dtype, stddev: float = 0.02):
    return (stddev * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, options: ModelOptions):
        self.scale = nnx.Param(jnp.ones((dim,), options.storage_dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(x.dtype) * normed.astype(x.dtype)


class Embedding(nnx.Module):
    def __init__(self, vocab: int, width: int, options: ModelOptions, rngs: nnx.Rngs):
        self.embedding = nnx.Param(_normal(rngs, (vocab, width), options.storage_dtype))


class Projection(nnx.Module):
    """A weight (and optional bias) applied with an einsum spec."""

    def __init__(self, kernel_shape, bias_shape, options: ModelOptions, rngs: nnx.Rngs):
        self.kernel = nnx.Param(_normal(rngs, kernel_shape, options.storage_dtype))
        self.bias = nnx.Param(jnp.zeros(bias_shape, options.storage_dtype)) if bias_shape is not None else None


class Attention(nnx.Module):
    def __init__(self, config: Qwen2Config, options: ModelOptions, rngs: nnx.Rngs):
        h, d, hq, hkv = config.hidden_size, config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.q_proj = Projection((h, hq, d), (hq, d), options, rngs)
        self.k_proj = Projection((h, hkv, d), (hkv, d), options, rngs)
        self.v_proj = Projection((h, hkv, d), (hkv, d), options, rngs)
        self.o_proj = Projection((hq, d, h), None, options, rngs)
        self.options = options

    def project_qkv(self, x):
        dtype, precision = self.options.compute_dtype, self.options.precision

        def proj(p: Projection, name: str):
            y = jnp.einsum("bth,hnd->btnd", x, p.kernel[...].astype(dtype), precision=precision)
            return checkpoint_name(y + p.bias[...].astype(dtype), name)

        return proj(self.q_proj, "query"), proj(self.k_proj, "key"), proj(self.v_proj, "value")

    def project_out(self, attn):
        kernel = self.o_proj.kernel[...].astype(self.options.compute_dtype)
        return jnp.einsum("btnd,ndh->bth", attn, kernel, precision=self.options.precision)


class MLP(nnx.Module):
    def __init__(self, config: Qwen2Config, options: ModelOptions, rngs: nnx.Rngs):
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = Projection((h, i), None, options, rngs)
        self.up_proj = Projection((h, i), None, options, rngs)
        self.down_proj = Projection((i, h), None, options, rngs)
        self.options = options

    def __call__(self, x):
        dtype, precision = self.options.compute_dtype, self.options.precision
        gate = jnp.einsum("bth,hi->bti", x, self.gate_proj.kernel[...].astype(dtype), precision=precision)
        up = jnp.einsum("bth,hi->bti", x, self.up_proj.kernel[...].astype(dtype), precision=precision)
        hidden = parallel.constrain(jax.nn.silu(gate) * up, ("batch", "seq", "act_mlp"))
        return jnp.einsum("bti,ih->bth", hidden, self.down_proj.kernel[...].astype(dtype), precision=precision)


class DecoderLayer(nnx.Module):
    def __init__(self, config: Qwen2Config, options: ModelOptions, rngs: nnx.Rngs):
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, options)
        self.attn = Attention(config, options, rngs)
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, options)
        self.mlp = MLP(config, options, rngs)

    def __call__(self, x, rope, attention_fn: AttentionFn, ctx, layer_state):
        cos, sin = rope
        q, k, v = self.attn.project_qkv(self.input_norm(x))
        q = parallel.constrain(apply_rope(q, cos, sin), ("batch", "seq", "act_heads", None))
        k = parallel.constrain(apply_rope(k, cos, sin), ("batch", "seq", "act_kv_heads", None))
        v = parallel.constrain(v, ("batch", "seq", "act_kv_heads", None))
        attn, new_state = attention_fn(q, k, v, layer_state, ctx)
        attn = checkpoint_name(attn, "attention_out")
        x = x + self.attn.project_out(attn)
        x = parallel.constrain(x, ("batch", "seq", "act_embed"))
        x = x + self.mlp(self.post_attention_norm(x))
        return parallel.constrain(x, ("batch", "seq", "act_embed")), new_state


class Qwen2ForCausalLM(nnx.Module):
    """Qwen2 decoder-only LM. Build with `Qwen2ForCausalLM(config, options, rngs=nnx.Rngs(seed))`, or without
    allocating anything with `abstract_model(config, options)`."""

    def __init__(self, config: Qwen2Config, options: ModelOptions = ModelOptions(), *, rngs: nnx.Rngs):
        self.config = config
        self.options = options
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, options, rngs)

        @nnx.split_rngs(splits=config.num_hidden_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make_layers(layer_rngs):
            return DecoderLayer(config, options, layer_rngs)

        self.layers = make_layers(rngs)
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, options)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Projection((config.vocab_size, config.hidden_size), None, options, rngs)

    # ------------------------------------------------------------------ pieces
    def embed(self, tokens: jax.Array) -> jax.Array:
        table = self.embed_tokens.embedding[...]
        hidden = jnp.take(table, tokens, axis=0).astype(self.options.compute_dtype)
        return parallel.constrain(hidden, ("batch", "seq", "act_embed"))

    def run_layers(self, hidden: jax.Array, positions: jax.Array, ctx: Any, *,
                   attention_fn: AttentionFn | None = None, layer_states: Any = None,
                   collect_hidden: bool = False):
        """Runs the scanned decoder layers.

        Args:
          hidden: [B, T, H] embeddings (compute dtype).
          positions: [B, T] int32 RoPE positions.
          ctx: passed unchanged to every layer's attention_fn (SegmentContext for the default attention).
          attention_fn: Contract 3 hook; default: make_segment_attention(self.options).
          layer_states: pytree whose leaves have a leading [num_layers] axis (e.g. a KV cache), sliced per layer and
            given to attention_fn; None for training.
          collect_hidden: also return every layer's output [L, B, T, H] (parity tests).
        Returns:
          (hidden [B, T, H], new_layer_states stacked over layers[, per-layer hidden]).
        """
        attention_fn = attention_fn or make_segment_attention(self.options)
        rope = rope_tables(positions, self.config.head_dim, self.config.rope_theta)
        graphdef, layer_params = nnx.split(self.layers)

        def body(x, scanned):
            params, state = scanned
            layer = nnx.merge(graphdef, params)
            y, new_state = layer(x, rope, attention_fn, ctx, state)
            return y, (new_state, y if collect_hidden else None)

        policy = REMAT_POLICIES[self.options.remat]
        if self.options.remat != "none":
            body = jax.checkpoint(body, policy=policy, prevent_cse=not self.options.scan_layers)
        if self.options.scan_layers:
            hidden, (new_states, per_layer) = jax.lax.scan(body, hidden, (layer_params, layer_states))
        else:
            hidden, (new_states, per_layer) = _unrolled_scan(body, hidden, (layer_params, layer_states),
                                                             self.config.num_hidden_layers)
        if collect_hidden:
            return hidden, new_states, per_layer
        return hidden, new_states

    def final_hidden(self, hidden: jax.Array) -> jax.Array:
        return self.final_norm(hidden)

    def head_weight(self) -> jax.Array:
        """[V, H] output projection in compute dtype (the embedding table when tied)."""
        weight = self.embed_tokens.embedding[...] if self.lm_head is None else self.lm_head.kernel[...]
        return weight.astype(self.options.compute_dtype)

    def logits(self, normed_hidden: jax.Array) -> jax.Array:
        """float32 [..., V] logits of final-normed hidden states (use on few positions; see token_logprobs)."""
        return jnp.einsum("...h,vh->...v", normed_hidden, self.head_weight(), precision=self.options.precision,
                          preferred_element_type=jnp.float32)

    # ------------------------------------------------------------------ whole passes
    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None, segment_ids: jax.Array | None = None,
                 *, right_padded: bool = False, collect_hidden: bool = False):
        """Full logits [B, T, V] (float32). Materialises all logits: for scoring long sequences use token_logprobs."""
        hidden, ctx, positions = self._prepare(tokens, positions, segment_ids, right_padded)
        out = self.run_layers(hidden, positions, ctx, collect_hidden=collect_hidden)
        logits = self.logits(self.final_hidden(out[0]))
        return (logits, out[2]) if collect_hidden else logits

    def token_logprobs(self, tokens: jax.Array, positions: jax.Array | None, segment_ids: jax.Array | None,
                       targets: jax.Array, *, chunk_size: int = 1024, temperature: float = 1.0,
                       return_entropy: bool = False, right_padded: bool = False):
        """log p(targets[b, t] | tokens[b, :t+1]) for every position, without materialising [B, T, V] logits.

        Args:
          tokens: [B, T] int32 inputs. positions: [B, T] RoPE positions, or None = derived from segment_ids.
          segment_ids: [B, T] int32 (0 = padding) or None = one sequence per row, no padding.
          targets: [B, T] int32, usually tokens shifted left by one (the caller masks the last token of each
            sequence, whose target is not part of it).
          chunk_size: sequence positions per logits chunk; peak extra memory ~ B * chunk_size * V * 4 bytes, and
            each chunk is recomputed in the backward pass (jax.checkpoint), so gradients stay bounded too.
          temperature: logits are divided by it (log-probs under the sampling distribution).
          return_entropy: also return the entropy of each position's distribution.
          right_padded: promise that each row is one sequence followed by padding (enables cuDNN flash attention).
        Returns:
          float32 [B, T] log-probs (0 at padding), and [B, T] entropies if return_entropy.
        """
        if segment_ids is None:
            segment_ids = jnp.ones(tokens.shape, jnp.int32)
        hidden, ctx, positions = self._prepare(tokens, positions, segment_ids, right_padded)
        hidden, _ = self.run_layers(hidden, positions, ctx)
        logprobs, entropy = chunked_logprobs(self.final_hidden(hidden), self.head_weight(), targets,
                                             chunk_size=chunk_size, temperature=temperature,
                                             precision=self.options.precision)
        real = segment_ids != 0
        logprobs = jnp.where(real, logprobs, 0.0)
        if return_entropy:
            return logprobs, jnp.where(real, entropy, 0.0)
        return logprobs

    def _prepare(self, tokens, positions, segment_ids, right_padded):
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tokens.shape}")
        if segment_ids is None:
            segment_ids = jnp.ones(tokens.shape, jnp.int32)
        if segment_ids.shape != tokens.shape:
            raise ValueError(f"segment_ids shape {segment_ids.shape} != tokens shape {tokens.shape}")
        if right_padded:
            validate_right_padded(segment_ids)
        if positions is None:
            positions = positions_from_segments(segment_ids)
        elif positions.shape != tokens.shape:
            raise ValueError(f"positions shape {positions.shape} != tokens shape {tokens.shape}")
        ctx = SegmentContext(segment_ids=segment_ids.astype(jnp.int32), right_padded=right_padded)
        return self.embed(tokens), ctx, positions


def chunked_logprobs(normed_hidden: jax.Array, head: jax.Array, targets: jax.Array, *, chunk_size: int,
                     temperature: float = 1.0, precision=None) -> tuple[jax.Array, jax.Array]:
    """Per-token log-prob of `targets` and entropy, computing [B, chunk, V] logits at a time.

    Args:
      normed_hidden: [B, T, H] final-normed hidden states (compute dtype).
      head: [V, H] output projection (compute dtype).
      targets: [B, T] int32 token ids.
      chunk_size: sequence positions per logits chunk (peak extra memory ~ B * chunk_size * V * 6 bytes).
    Returns:
      float32 [B, T] log-probs and entropies.

    Differentiable through a hand-written VJP (_logprob_head_bwd): the forward keeps only the [B, T] log-sum-exp
    and entropy, the backward recomputes each chunk's logits once, runs its two matmuls in the compute dtype (as every
    other matmul's backward does) and accumulates the head gradient over chunks in float32.
    """
    chunk = max(1, min(chunk_size, normed_hidden.shape[1]))
    return _logprob_head(normed_hidden, head, targets, chunk, float(temperature), precision)


def _to_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [n, B, chunk, ...], zero-padding T up to a multiple of chunk."""
    batch, length = x.shape[:2]
    pad = (-length) % chunk
    x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
    return x.reshape(batch, -1, chunk, *x.shape[2:]).swapaxes(0, 1)


def _from_chunks(x: jax.Array, length: int) -> jax.Array:
    """[n, B, chunk, ...] -> [B, length, ...]."""
    x = x.swapaxes(0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def _chunk_logits(h, head, temperature, precision):
    """float32 [B, c, V] logits of one chunk (bf16 x bf16 matmul with float32 accumulation and output)."""
    logits = jnp.einsum("bch,vh->bcv", h, head, precision=precision, preferred_element_type=jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    return parallel.constrain(logits, ("batch", "seq", "act_vocab"))


def _target_logits(h, head, targets, temperature, precision):
    """float32 [B, c] logits of the target tokens, from the gathered head rows (a gather, not a [B, c, V] pass)."""
    rows = jnp.take(head, targets, axis=0)                                       # [B, c, H]
    logit = jnp.einsum("bch,bch->bc", h, rows, precision=precision, preferred_element_type=jnp.float32)
    return logit / temperature if temperature != 1.0 else logit


def _logprob_head_forward(h, head, targets, chunk, temperature, precision):
    length = h.shape[1]

    def one_chunk(args):
        hc, tc = args
        logits = _chunk_logits(hc, head, temperature, precision)
        top = jnp.max(logits, axis=-1, keepdims=True)
        shifted = jnp.exp(logits - top)
        total = jnp.sum(shifted, axis=-1)
        lse = top[..., 0] + jnp.log(total)
        # entropy = lse - E_p[logits], with E_p[logits] = sum(exp(l - top) * l) / sum(exp(l - top)): one pass.
        entropy = lse - jnp.sum(shifted * logits, axis=-1) / total
        logprob = _target_logits(hc, head, tc, temperature, precision) - lse
        return logprob, entropy, lse

    logprobs, entropy, lse = jax.lax.map(one_chunk, (_to_chunks(h, chunk), _to_chunks(targets, chunk)))
    return _from_chunks(logprobs, length), _from_chunks(entropy, length), _from_chunks(lse, length)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _logprob_head(h, head, targets, chunk, temperature, precision):
    logprobs, entropy, _ = _logprob_head_forward(h, head, targets, chunk, temperature, precision)
    return logprobs, entropy


def _logprob_head_fwd(h, head, targets, chunk, temperature, precision):
    logprobs, entropy, lse = _logprob_head_forward(h, head, targets, chunk, temperature, precision)
    return (logprobs, entropy), (h, head, targets, lse, entropy)


def _logprob_head_bwd(chunk, temperature, precision, residuals, cotangents):
    """d logprob_t / d logits = onehot(t) - p;  d entropy / d logits = -p * (log p + entropy).

    The dense part (-p * (g_logprob + g_entropy * (log p + entropy))) goes through the two matmuls in the compute
    dtype; the one-hot part (+g_logprob at the target) is added exactly through a gather / scatter of head rows."""
    h, head, targets, lse, entropy = residuals
    g_logprob, g_entropy = cotangents
    length, compute_dtype = h.shape[1], head.dtype
    inv_t = 1.0 / temperature

    def one_chunk(head_grad, args):
        hc, tc, lse_c, ent_c, glp_c, gent_c = args
        logits = _chunk_logits(hc, head, temperature, precision)
        logp = logits - lse_c[..., None]
        dense = -jnp.exp(logp) * (glp_c[..., None] + gent_c[..., None] * (logp + ent_c[..., None]))
        dense = parallel.constrain((dense * inv_t).astype(compute_dtype), ("batch", "seq", "act_vocab"))
        target_scale = (glp_c * inv_t)[..., None]                                        # [B, c, 1] float32
        dh = jnp.einsum("bcv,vh->bch", dense, head, precision=precision, preferred_element_type=jnp.float32)
        dh = dh + target_scale * jnp.take(head, tc, axis=0).astype(jnp.float32)
        head_grad = head_grad + jnp.einsum("bcv,bch->vh", dense, hc, precision=precision,
                                           preferred_element_type=jnp.float32)
        head_grad = head_grad.at[tc.reshape(-1)].add((target_scale * hc.astype(jnp.float32)).reshape(-1, hc.shape[-1]))
        return head_grad, dh.astype(h.dtype)

    chunks = tuple(_to_chunks(x, chunk) for x in (h, targets, lse, entropy, g_logprob, g_entropy))
    head_grad, dh = jax.lax.scan(one_chunk, jnp.zeros(head.shape, jnp.float32), chunks)
    return _from_chunks(dh, length), head_grad.astype(head.dtype), None


_logprob_head.defvjp(_logprob_head_fwd, _logprob_head_bwd)


# ------------------------------------------------------------------------------------------------ building
def abstract_model(config: Qwen2Config, options: ModelOptions = ModelOptions()) -> Qwen2ForCausalLM:
    """The model with jax.ShapeDtypeStruct leaves: shapes and dtypes, no memory."""
    return nnx.eval_shape(lambda: Qwen2ForCausalLM(config, options, rngs=nnx.Rngs(0)))


# Logical axes of every parameter, by its path inside the model (layer parameters get a leading "layers").
_PARAM_AXES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("embed_tokens", "embedding"): ("vocab", "embed"),
    ("attn", "q_proj", "kernel"): ("embed", "q_heads", "head_dim"),
    ("attn", "q_proj", "bias"): ("q_heads", "head_dim"),
    ("attn", "k_proj", "kernel"): ("embed", "kv_heads", "head_dim"),
    ("attn", "k_proj", "bias"): ("kv_heads", "head_dim"),
    ("attn", "v_proj", "kernel"): ("embed", "kv_heads", "head_dim"),
    ("attn", "v_proj", "bias"): ("kv_heads", "head_dim"),
    ("attn", "o_proj", "kernel"): ("q_heads", "head_dim", "embed"),
    ("mlp", "gate_proj", "kernel"): ("embed", "mlp"),
    ("mlp", "up_proj", "kernel"): ("embed", "mlp"),
    ("mlp", "down_proj", "kernel"): ("mlp", "embed"),
    ("input_norm", "scale"): ("norm",),
    ("post_attention_norm", "scale"): ("norm",),
    ("final_norm", "scale"): ("norm",),
    ("lm_head", "kernel"): ("vocab", "embed"),
}


def param_path(path) -> tuple[str, ...]:
    """A jax key path of the model state as a tuple of names, e.g. ('layers', 'attn', 'q_proj', 'kernel')."""
    return tuple(parallel.path_name(path).split("/"))


def logical_axes_for(path: tuple[str, ...]) -> tuple[str, ...]:
    if path and path[0] == "layers":
        key = path[1:]
        if key in _PARAM_AXES:
            return ("layers",) + _PARAM_AXES[key]
    elif path in _PARAM_AXES:
        return _PARAM_AXES[path]
    raise KeyError(f"parameter {'/'.join(path)} has no logical-axes rule (add it to qwen2._PARAM_AXES)")


def param_logical_axes(state: Any) -> Any:
    """Tree of logical-axis tuples with the structure of `state` (an nnx.State of the model's parameters)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: logical_axes_for(param_path(path)), state)


def check_mesh_fits(config: Qwen2Config, mesh, rules=parallel.DEFAULT_RULES) -> None:
    """Raises a ValueError naming the model dimension that a mesh axis does not divide."""
    dims = (("num_attention_heads", "q_heads", config.num_attention_heads),
            ("num_key_value_heads", "kv_heads", config.num_key_value_heads),
            ("intermediate_size", "mlp", config.intermediate_size),
            ("vocab_size", "vocab", config.vocab_size),
            ("hidden_size", "embed", config.hidden_size))
    for field, logical, size in dims:
        entry = parallel.logical_to_spec((logical,), rules)[0]
        if entry is None:
            continue
        names = (entry,) if isinstance(entry, str) else entry
        parts = int(np.prod([mesh.shape[n] for n in names]))
        if size % parts:
            raise ValueError(f"mesh axis {'x'.join(names)} of size {parts} does not divide {field}={size} "
                             f"(logical axis '{logical}'); pick a mesh whose {'x'.join(names)} size divides {size}")


def param_shardings(state: Any, mesh, rules=parallel.DEFAULT_RULES) -> Any:
    """NamedShardings for the model's parameter state (abstract or concrete); clear errors on indivisible dims."""
    config = _config_from_state(state)
    if config is not None:
        check_mesh_fits(config, mesh, rules)
    return parallel.tree_shardings(state, param_logical_axes(state), mesh, rules)


def _config_from_state(state) -> Qwen2Config | None:
    """Recovers the dimensions check_mesh_fits needs from parameter shapes (None if the state is not a full model)."""
    shapes = {param_path(p): leaf.shape for p, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}
    try:
        vocab, hidden = shapes[("embed_tokens", "embedding")]
        _, _, heads, head_dim = shapes[("layers", "attn", "q_proj", "kernel")]
        kv_heads = shapes[("layers", "attn", "k_proj", "kernel")][2]
        layers, _, mlp = shapes[("layers", "mlp", "gate_proj", "kernel")]
    except KeyError:
        return None
    return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)


def init_sharded(config: Qwen2Config, options: ModelOptions, mesh, seed: int = 0,
                 rules=parallel.DEFAULT_RULES) -> Qwen2ForCausalLM:
    """Randomly initialised model whose parameters are created directly in their shards (never whole on a device)."""
    graphdef, abstract_state = nnx.split(abstract_model(config, options))
    shardings = param_shardings(abstract_state, mesh, rules)

    @functools.partial(jax.jit, out_shardings=shardings)
    def create():
        return nnx.state(Qwen2ForCausalLM(config, options, rngs=nnx.Rngs(seed)))

    return nnx.merge(graphdef, create())
