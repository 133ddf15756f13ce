"""The policy-gradient objective: token-level PPO-clip with clip-higher, Dr. GRPO aggregation, optional KL and TIS.

For every token the model itself generated (prompt and feedback tokens are masked out), with A the advantage of its
turn, r = pi_theta(token) / pi_old(token):

    l = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)) * w_tis + kl_coef * KL_k3(pi_theta || pi_ref)

and the batch loss is sum_tokens weight * l, where the per-token `weight` is fixed on the host from the WHOLE batch
(see `aggregation_weights`): the loss, its gradient and every statistic are sums, so they do not depend on how the
batch is cut into micro-batches or spread over devices.

Old log-probs (`RLConfig.old_logprobs`):
  "sampler"  pi_old = the sampler's log-probs (Kevin): the first update is on-policy up to the numerical mismatch
             between sampler and trainer, the second is off-policy with true importance ratios.
  "trainer"  pi_old = the trainer's own log-probs under the parameters that sampled (taken from the first update's
             forward pass, no extra compute); with `tis_cap` > 0 each token is also weighted by
             w_tis = min(pi_trainer_old / pi_sampler, tis_cap) (truncated importance sampling, Yao et al. 2025).
"""
from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from kevin_jax.rl.config import LOSS_AGGREGATIONS, RLConfig


def aggregation_weights(response_lengths: np.ndarray, mode: str, constant_length: int = 0) -> np.ndarray:
    """Per-sample weight of each of its response tokens, from the lengths of ALL samples of the batch.

    constant_length: 1 / (samples * L);  token_mean: 1 / sum(lengths);  sequence_mean: 1 / (samples * length_i).
    """
    lengths = np.asarray(response_lengths, dtype=np.float64)
    n = len(lengths)
    if n == 0:
        return lengths.copy()
    if mode == "constant_length":
        if constant_length <= 0:
            raise ValueError("loss aggregation 'constant_length' needs a positive constant_length")
        return np.full(n, 1.0 / (n * constant_length))
    if mode == "token_mean":
        total = lengths.sum()
        return np.full(n, 1.0 / total if total > 0 else 0.0)
    if mode == "sequence_mean":
        return np.where(lengths > 0, 1.0 / (n * np.maximum(lengths, 1)), 0.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {LOSS_AGGREGATIONS}")


def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Schulman's k3 estimate of KL(pi || pi_ref) from samples of pi: exp(d) - d - 1, d = ref - logp (>= 0)."""
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


def ppo_token_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, eps_low: float,
                   eps_high: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(per-token clipped surrogate loss, ratio, clipped) with clipped = the clipped branch is the active one."""
    ratio = jnp.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clipped = -advantages * clipped_ratio
    loss = jnp.maximum(unclipped, clipped)
    return loss, ratio, clipped > unclipped


def batch_loss(logp: jax.Array, entropy: jax.Array | None, batch: Mapping[str, jax.Array], config: RLConfig, *,
               old_from_current: bool) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The weighted-sum loss of one micro-batch and its statistics (all sums, see `finish_stats`).

    Args:
      logp: [R, L] log-probs of `batch["targets"]` under the current parameters (differentiable).
      entropy: [R, L] entropies of the current distribution, or None.
      batch: arrays of `kevin_jax.rl.batch.MicroBatch` ([R, L] each): loss_mask, loss_weights, advantages,
        sampler_logprobs, trainer_old_logprobs, ref_logprobs.
      old_from_current: this is the first update on the batch, so the trainer's old log-probs are the current ones
        (stop-gradient); later updates read batch["trainer_old_logprobs"].
    Returns:
      (loss, stats); stats["trainer_logprobs"] is the [R, L] stop-gradient current log-probs (kept by the caller
      after the first update when old_logprobs="trainer").
    """
    mask = batch["loss_mask"]
    maskf = mask.astype(jnp.float32)
    weights = batch["loss_weights"]
    sampler = batch["sampler_logprobs"]
    current = jax.lax.stop_gradient(logp)
    if config.old_logprobs == "trainer":
        trainer_old = current if old_from_current else batch["trainer_old_logprobs"]
        old = trainer_old
        if config.tis_cap > 0:
            tis = jnp.minimum(jnp.exp(trainer_old - sampler), config.tis_cap)
        else:
            tis = jnp.ones_like(logp)
    else:
        old = sampler
        tis = jnp.ones_like(logp)
    # Masked positions get old = logp so that exp() stays finite there whatever the padding holds.
    old = jnp.where(mask, old, current)
    tok_loss, ratio, clipped = ppo_token_loss(logp, old, batch["advantages"], config.clip_eps_low,
                                              config.clip_eps_high)
    tok_loss = tok_loss * jnp.where(mask, tis, 0.0)
    if config.kl_coef > 0:
        kl_ref = jnp.where(mask, kl_k3(logp, batch["ref_logprobs"]), 0.0)
        tok_loss = tok_loss + config.kl_coef * kl_ref
    else:
        kl_ref = jnp.zeros_like(logp)
    loss = jnp.sum(jnp.where(mask, weights * tok_loss, 0.0))

    log_ratio = jnp.where(mask, current - old, 0.0)
    ratio_c = jnp.where(mask, jnp.exp(log_ratio), 1.0)
    mismatch = jnp.where(mask, current - sampler, 0.0)
    stats = {
        "tokens": jnp.sum(maskf),
        "loss": loss,
        "clipped": jnp.sum(jnp.where(mask, clipped, False).astype(jnp.float32)),
        "ratio_sum": jnp.sum(jnp.where(mask, ratio_c, 0.0)),
        "ratio_max": jnp.max(jnp.where(mask, ratio_c, -jnp.inf)),
        "ratio_min": jnp.min(jnp.where(mask, ratio_c, jnp.inf)),
        "approx_kl_old_sum": jnp.sum(jnp.where(mask, (ratio_c - 1.0) - log_ratio, 0.0)),
        "kl_ref_sum": jnp.sum(kl_ref),
        "mismatch_abs_sum": jnp.sum(jnp.abs(mismatch)),
        "mismatch_sum": jnp.sum(mismatch),
        "mismatch_abs_max": jnp.max(jnp.abs(mismatch)),
        "tis_sum": jnp.sum(jnp.where(mask, tis, 0.0)),
        "logp_sum": jnp.sum(jnp.where(mask, current, 0.0)),
    }
    if entropy is not None:
        stats["entropy_sum"] = jnp.sum(jnp.where(mask, jax.lax.stop_gradient(entropy), 0.0))
    stats["trainer_logprobs"] = current
    return loss, stats


_MAX_STATS = ("ratio_max", "mismatch_abs_max")
_MIN_STATS = ("ratio_min",)


def combine_stats(parts: list[Mapping[str, float]]) -> dict[str, float]:
    """Combines host copies of the scalar stats of several micro-batches (sums add, maxima/minima reduce)."""
    out: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            value = float(value)
            if key not in out:
                out[key] = value
            elif key in _MAX_STATS:
                out[key] = max(out[key], value)
            elif key in _MIN_STATS:
                out[key] = min(out[key], value)
            else:
                out[key] += value
    return out


def finish_stats(total: Mapping[str, float]) -> dict[str, float]:
    """Means per model token from the combined sums."""
    n = max(total.get("tokens", 0.0), 1.0)
    out = {"loss": total.get("loss", 0.0), "tokens": total.get("tokens", 0.0),
           "ratio_clip_fraction": total.get("clipped", 0.0) / n, "ratio_mean": total.get("ratio_sum", 0.0) / n,
           "ratio_max": total.get("ratio_max", float("nan")), "ratio_min": total.get("ratio_min", float("nan")),
           "approx_kl_old": total.get("approx_kl_old_sum", 0.0) / n, "kl_ref": total.get("kl_ref_sum", 0.0) / n,
           "logprob_mismatch_abs": total.get("mismatch_abs_sum", 0.0) / n,
           "logprob_mismatch_mean": total.get("mismatch_sum", 0.0) / n,
           "logprob_mismatch_abs_max": total.get("mismatch_abs_max", float("nan")),
           "tis_weight_mean": total.get("tis_sum", 0.0) / n, "logprob_mean": total.get("logp_sum", 0.0) / n}
    if "entropy_sum" in total:
        out["entropy"] = total["entropy_sum"] / n
    if not total.get("tokens"):
        for key in ("ratio_max", "ratio_min", "logprob_mismatch_abs_max"):
            out[key] = float("nan")
    return out
