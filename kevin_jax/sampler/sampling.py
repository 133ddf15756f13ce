"""Token sampling on device: temperature, top-k, top-p, per-sequence seeds, and the log-probs the RL loss needs.

Which log-probs come back (the loss must use the matching recomputation):
  logprobs         log-prob of the sampled token under the distribution it was actually drawn from: logits / T,
                   restricted to the top-k / top-p set and renormalised over it. With top_k=0 and top_p=1 this equals
                   Qwen2ForCausalLM.token_logprobs(..., temperature=T). For greedy (T=0) it is the policy log-prob.
  policy_logprobs  log softmax(logits) of the sampled token: temperature 1, no truncation, i.e.
                   token_logprobs(..., temperature=1.0).

Randomness: the key of the token a sequence draws at generation index i is fold_in(fold_in(key(seed), sequence id),
i), so the same (seed, sequence id) gives the same tokens whatever slot, batch or decode call it lands in, and
whatever other requests (each with its own seed) share the batch.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Sampled(NamedTuple):
    tokens: jax.Array           # [B] int32
    logprobs: jax.Array         # [B] float32, under the sampling distribution
    policy_logprobs: jax.Array  # [B] float32, temperature 1, untruncated


def token_keys(seed: jax.Array, sequence_ids: jax.Array, positions: jax.Array) -> jax.Array:
    """One PRNG key per row: fold_in(fold_in(key(seed), sequence_id), position). `seed` is one seed for every row
    or one per row (rows of different generate requests decoded in one batch: kevin_jax.sampler.engine)."""
    seeds = jnp.broadcast_to(jnp.asarray(seed, jnp.uint32), jnp.shape(sequence_ids))
    return jax.vmap(lambda k, s, p: jax.random.fold_in(jax.random.fold_in(jax.random.key(k), s), p))(
        seeds, sequence_ids, positions)


def _rows_mask(shape, rows_indices: jax.Array, keep: jax.Array | None = None) -> jax.Array:
    """Boolean [B, V] that is True at rows_indices[b, j] (where keep[b, j])."""
    batch = shape[0]
    values = jnp.ones(rows_indices.shape, bool) if keep is None else keep
    rows = jnp.arange(batch)[:, None]
    return jnp.zeros(shape, bool).at[rows, rows_indices].set(values)


def truncation_mask(scaled_logits: jax.Array, *, top_k: int, top_p: float) -> jax.Array | None:
    """[B, V] boolean of the tokens that stay in the sampling distribution, or None when nothing is cut.

    top_k keeps exactly k tokens (ties broken by index). top_p then keeps, in decreasing order of probability (under
    the top-k-renormalised distribution), each token whose preceding tokens sum to less than top_p: the smallest set
    that reaches top_p (Hugging Face's TopPLogitsWarper rule). Without top_k this sorts the whole vocabulary.
    """
    if top_k <= 0 and top_p >= 1.0:
        return None
    vocab = scaled_logits.shape[-1]
    if top_k > 0:
        values, indices = jax.lax.top_k(scaled_logits, min(top_k, vocab))       # sorted, descending
    else:
        iota = jax.lax.broadcasted_iota(jnp.int32, scaled_logits.shape, 1)
        neg_values, indices = jax.lax.sort((-scaled_logits, iota), dimension=1, num_keys=1)
        values = -neg_values
    if top_p >= 1.0:
        return _rows_mask(scaled_logits.shape, indices)
    probs = jax.nn.softmax(values, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs
    keep = before < top_p
    return _rows_mask(scaled_logits.shape, indices, keep)


def sampling_logits(logits: jax.Array, *, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """float32 [B, V] logits of the sampling distribution: logits / T, -inf outside the kept set."""
    scaled = logits.astype(jnp.float32) / temperature
    mask = truncation_mask(scaled, top_k=top_k, top_p=top_p)
    return scaled if mask is None else jnp.where(mask, scaled, -jnp.inf)


def _logprob_of(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log softmax(logits)[token] per row, without materialising the whole log-softmax."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    hit = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1) == tokens[:, None]
    picked = jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)     # where, not gather: stays local under vocab sharding
    return picked - lse


def sample(logits: jax.Array, keys: jax.Array, *, temperature: float, top_k: int, top_p: float) -> Sampled:
    """Draws one token per row of float32 logits [B, V] (Gumbel-max with each row's own key)."""
    logits = logits.astype(jnp.float32)
    if temperature == 0.0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        policy = _logprob_of(logits, tokens)
        return Sampled(tokens, policy, policy)
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logits.shape[-1:], jnp.float32))(keys)
    if top_k <= 0 and top_p >= 1.0:
        return _sample_untruncated(logits, gumbel, temperature)
    dist = sampling_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    tokens = jnp.argmax(dist + gumbel, axis=-1).astype(jnp.int32)
    return Sampled(tokens, _logprob_of(dist, tokens), _logprob_of(logits, tokens))


def _sample_untruncated(logits: jax.Array, gumbel: jax.Array, temperature: float) -> Sampled:
    """The common case (no top-k / top-p), written for few passes over the [B, V] logits (at batch 256 and Qwen's
    152k vocabulary they are 156 MB): one max shared by both log-sum-exps (max(l / T) = max(l) / T for T > 0), and
    the token's logit picked once. The draw is the same Gumbel-max as in the truncated case."""
    tokens = jnp.argmax(logits / temperature + gumbel, axis=-1).astype(jnp.int32)
    shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
    hit = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1) == tokens[:, None]
    picked = jnp.sum(jnp.where(hit, shifted, 0.0), axis=-1)     # where, not gather: stays local under vocab sharding
    policy = picked - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    sampled = picked / temperature - jnp.log(jnp.sum(jnp.exp(shifted / temperature), axis=-1))
    return Sampled(tokens, sampled, policy)
