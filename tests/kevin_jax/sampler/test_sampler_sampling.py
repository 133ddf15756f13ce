"""kevin_jax.sampler.sampling: truncation rules, log-probs, and chi-square tests of the sampled frequencies."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from kevin_jax.sampler import sampling

VOCAB = 48


def _logits(seed=0, rows=1, scale=2.0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(rows, VOCAB)) * scale, jnp.float32)


def _expected(logits_row: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Reference distribution in numpy: softmax(logits / T), top-k, then the smallest top-p set, renormalised."""
    scaled = logits_row.astype(np.float64) / temperature
    order = np.argsort(-scaled, kind="stable")
    keep = np.zeros(VOCAB, bool)
    candidates = order[:top_k] if top_k else order
    p = np.exp(scaled[candidates] - scaled[candidates].max())
    p /= p.sum()
    before = np.cumsum(p) - p
    keep[candidates[before < top_p]] = True
    probs = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    return probs / probs.sum()


def _draw(logits_row, n, temperature, top_k, top_p, seed=0):
    logits = jnp.broadcast_to(logits_row, (n, VOCAB))
    keys = sampling.token_keys(jnp.uint32(seed), jnp.arange(n, dtype=jnp.int32), jnp.zeros(n, jnp.int32))
    return jax.jit(lambda l, k: sampling.sample(l, k, temperature=temperature, top_k=top_k, top_p=top_p))(logits, keys)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.9, 0, 1.0), (0.7, 0, 0.8), (1.3, 12, 0.9), (0.9, 5, 1.0)])
def test_sampled_frequencies_match_the_truncated_distribution(temperature, top_k, top_p):
    row = _logits(1)[0]
    expected = _expected(np.asarray(row), temperature, top_k, top_p)
    n = 40_000
    drawn = _draw(row, n, temperature, top_k, top_p)
    counts = np.bincount(np.asarray(drawn.tokens), minlength=VOCAB)
    assert counts[expected == 0].sum() == 0, "a token outside the top-k/top-p set was sampled"
    support = expected > 0
    stat, pvalue = scipy.stats.chisquare(counts[support], n * expected[support])
    assert pvalue > 1e-3, f"chi-square {stat:.1f} over {support.sum()} tokens, p={pvalue:.2e}"
    # The returned log-probs are those of the truncated distribution, and the policy ones of the raw logits.
    tokens = np.asarray(drawn.tokens)
    np.testing.assert_allclose(np.asarray(drawn.logprobs), np.log(expected[tokens]), atol=1e-5)
    raw = np.asarray(jax.nn.log_softmax(row))
    np.testing.assert_allclose(np.asarray(drawn.policy_logprobs), raw[tokens], atol=1e-5)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = jnp.asarray(np.log(probs)[None], jnp.float32)
    for top_p, kept in [(0.5, 1), (0.51, 2), (0.8, 2), (0.81, 3), (0.96, 4), (1.0, 4)]:
        mask = sampling.truncation_mask(logits, top_k=0, top_p=top_p)
        got = 4 if mask is None else int(np.asarray(mask).sum())
        assert got == kept, f"top_p={top_p}: kept {got}, expected {kept}"
    mask = sampling.truncation_mask(logits, top_k=2, top_p=1.0)
    np.testing.assert_array_equal(np.asarray(mask)[0], [True, True, False, False])


def test_greedy_is_argmax_with_policy_logprobs():
    logits = _logits(2, rows=5)
    keys = sampling.token_keys(jnp.uint32(0), jnp.arange(5, dtype=jnp.int32), jnp.zeros(5, jnp.int32))
    out = sampling.sample(logits, keys, temperature=0.0, top_k=0, top_p=1.0)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.argmax(np.asarray(logits), axis=-1))
    ref = np.max(np.asarray(jax.nn.log_softmax(logits)), axis=-1)
    np.testing.assert_allclose(np.asarray(out.logprobs), ref, atol=1e-6)


def test_keys_depend_on_seed_sequence_and_position_only():
    ids, pos = jnp.array([3, 3, 4], jnp.int32), jnp.array([7, 8, 7], jnp.int32)
    keys = jax.random.key_data(sampling.token_keys(jnp.uint32(11), ids, pos))
    again = jax.random.key_data(sampling.token_keys(jnp.uint32(11), ids[::-1], pos[::-1]))[::-1]
    np.testing.assert_array_equal(np.asarray(keys), np.asarray(again))
    assert len({tuple(np.asarray(k).tolist()) for k in keys}) == 3
    other = jax.random.key_data(sampling.token_keys(jnp.uint32(12), ids, pos))
    assert not np.array_equal(np.asarray(keys), np.asarray(other))
