"""kevin_jax Qwen2 vs transformers' Qwen2ForCausalLM (torch, CPU, fp32): layer by layer, logits, log-probs, padding.

Tolerances are fixed (levanter habit) and never loosened: 1e-4 max abs difference in fp32.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.model import hf, qwen2
from qwen2_hf_fixtures import hf_logits_and_hidden, save_random_hf_model

TOL = 1e-4
FP32 = dict(dtype="float32", param_dtype="float32", remat="none", matmul_precision="highest")

# (name, shape overrides): GQA with several group sizes, MHA, MQA, tied and untied embeddings.
CONFIGS = [
    ("gqa2_untied", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    ("gqa4_tied", dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=64, tie_word_embeddings=True)),
    ("mha_untied", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)),
    ("mqa_tied", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True, num_hidden_layers=2)),
]


CONFIG_NAMES = [c[0] for c in CONFIGS]


@pytest.fixture(scope="module", params=CONFIG_NAMES)
def pair(request, tmp_path_factory):
    """(HF torch model, kevin_jax model imported from its saved checkpoint)."""
    name, shape = request.param, dict(CONFIGS)[request.param]
    directory = str(tmp_path_factory.mktemp(name))
    hf_model = save_random_hf_model(directory, seed=len(name), **shape)
    ours = hf.load_hf_checkpoint(directory, qwen2.ModelOptions(attention="xla", **FP32))
    return hf_model, ours


def _jit_logprobs(model, **kwargs):
    """token_logprobs under jax.jit (one compilation per shape instead of op-by-op dispatch)."""
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens, segments, targets):
        return nnx.merge(graphdef, state).token_logprobs(tokens, None, segments, targets, **kwargs)

    return lambda tokens, segments, targets: run(state, jnp.asarray(tokens),
                                                  None if segments is None else jnp.asarray(segments),
                                                  jnp.asarray(targets))


def _tokens(vocab, batch=2, length=13, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, (batch, length), dtype=np.int32)


def test_layer_by_layer_and_logits_match_transformers(pair):
    hf_model, ours = pair
    tokens = _tokens(ours.config.vocab_size)
    ref_logits, ref_hidden = hf_logits_and_hidden(hf_model, tokens)
    logits, per_layer = ours(jnp.asarray(tokens), collect_hidden=True)
    num_layers = ours.config.num_hidden_layers
    embedded = ours.embed(jnp.asarray(tokens))
    np.testing.assert_allclose(np.asarray(embedded), ref_hidden[0], atol=TOL, rtol=0)
    # HF's hidden_states: [embeddings, layer 1 .. layer L-1 outputs, final-normed layer L output].
    for layer in range(num_layers - 1):
        diff = np.max(np.abs(np.asarray(per_layer[layer]) - ref_hidden[layer + 1]))
        assert diff <= TOL, f"layer {layer} output differs by {diff}"
    final = ours.final_hidden(per_layer[num_layers - 1])
    assert np.max(np.abs(np.asarray(final) - ref_hidden[num_layers])) <= TOL
    diff = np.max(np.abs(np.asarray(logits) - ref_logits))
    assert diff <= TOL, f"logits differ by {diff}"
    assert np.max(np.abs(ref_logits)) > 1.0, "logits too small for the tolerance to mean anything"


# Every config with XLA attention; the chunked kernel (which shares everything else) on one config.
@pytest.mark.parametrize("pair, attention", [(name, "xla") for name in CONFIG_NAMES] + [("gqa2_untied", "chunked")],
                         indirect=["pair"])
def test_token_logprobs_match_transformers(pair, attention):
    hf_model, ours = pair
    ours = _with_options(ours, qwen2.ModelOptions(attention=attention, attention_chunk=4, **FP32))
    tokens = _tokens(ours.config.vocab_size, length=13, seed=1)
    targets = np.roll(tokens, -1, axis=1)
    ref_logits, _ = hf_logits_and_hidden(hf_model, tokens)
    ref = jax.nn.log_softmax(jnp.asarray(ref_logits), axis=-1)
    ref = np.take_along_axis(np.asarray(ref), targets[..., None], axis=-1)[..., 0]
    # chunk_size 5 does not divide 13: the padded tail chunk must not leak into the result.
    logprobs, entropy = _jit_logprobs(ours, chunk_size=5, return_entropy=True)(tokens, None, targets)
    assert np.max(np.abs(np.asarray(logprobs) - ref)) <= TOL
    p = jax.nn.softmax(jnp.asarray(ref_logits), axis=-1)
    ref_entropy = -np.sum(np.asarray(p) * np.asarray(jax.nn.log_softmax(jnp.asarray(ref_logits))), axis=-1)
    assert np.max(np.abs(np.asarray(entropy) - ref_entropy)) <= TOL


def test_temperature_scales_logits(pair):
    _, ours = pair
    tokens = _tokens(ours.config.vocab_size, batch=1, length=9, seed=2)
    targets = np.roll(tokens, -1, axis=1)
    logits = ours(jnp.asarray(tokens)) / 0.7
    ref = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits, -1)), targets[..., None], -1)[..., 0]
    got = _jit_logprobs(ours, chunk_size=4, temperature=0.7)(tokens, None, targets)
    assert np.max(np.abs(np.asarray(got) - ref)) <= TOL


def _with_options(model, options):
    from flax import nnx

    graphdef, state = nnx.split(qwen2.abstract_model(model.config, options))
    return nnx.merge(graphdef, nnx.state(model))


@pytest.mark.parametrize("pair, attention", [("gqa2_untied", "xla"), ("gqa2_untied", "chunked"), ("mqa_tied", "xla"),
                                             ("mqa_tied", "chunked")], indirect=["pair"])
def test_padding_and_packing_do_not_change_real_tokens(pair, attention):
    hf_model, ours = pair
    ours = _with_options(ours, qwen2.ModelOptions(attention=attention, attention_chunk=8, **FP32))
    logprobs = _jit_logprobs(ours, chunk_size=8)

    def _single_logprobs(_, seq):
        seq = np.asarray(seq, np.int32)[None]
        return np.asarray(logprobs(seq, None, np.roll(seq, -1, 1)))[0]

    rng = np.random.default_rng(3)
    vocab = ours.config.vocab_size
    a, b = rng.integers(0, vocab, 11), rng.integers(0, vocab, 6)
    ref_a, ref_b = _single_logprobs(ours, a), _single_logprobs(ours, b)
    # The reference itself: HF on the unpadded sequence.
    hf_logits, _ = hf_logits_and_hidden(hf_model, a[None].astype(np.int32))
    hf_lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(jnp.asarray(hf_logits), -1)),
                               np.roll(a, -1)[None, :, None], -1)[0, :, 0]
    assert np.max(np.abs(ref_a - hf_lp)) <= TOL

    length = 16
    pad_id = 0
    junk = rng.integers(0, vocab, length)            # padding positions hold arbitrary tokens: must not matter

    def run(tokens, segments, targets):
        return np.asarray(logprobs(tokens, segments, targets))

    # right padding
    tokens = np.stack([np.r_[a, junk[:length - 11]], np.r_[b, junk[:length - 6]]]).astype(np.int32)
    segments = np.stack([np.r_[np.ones(11), np.zeros(5)], np.r_[np.ones(6), np.zeros(10)]]).astype(np.int32)
    targets = np.stack([np.r_[np.roll(a, -1), np.full(5, pad_id)], np.r_[np.roll(b, -1), np.full(10, pad_id)]])
    got = run(tokens, segments, targets.astype(np.int32))
    assert np.max(np.abs(got[0, :10] - ref_a[:10])) <= TOL
    assert np.max(np.abs(got[1, :5] - ref_b[:5])) <= TOL
    assert np.all(got[segments == 0] == 0.0)

    # left padding (positions restart at the first real token)
    tokens = np.stack([np.r_[junk[:5], a], np.r_[junk[:10], b]]).astype(np.int32)
    segments = np.stack([np.r_[np.zeros(5), np.ones(11)], np.r_[np.zeros(10), np.ones(6)]]).astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    got = run(tokens, segments, targets)
    assert np.max(np.abs(got[0, 5:15] - ref_a[:10])) <= TOL
    assert np.max(np.abs(got[1, 10:15] - ref_b[:5])) <= TOL

    # packing: a and b in one row, then padding
    tokens = np.r_[a, b, junk[:length - 17 + 8]][None, :24].astype(np.int32)
    segments = np.r_[np.ones(11), 2 * np.ones(6), np.zeros(7)][None].astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    got = run(tokens, segments, targets)
    assert np.max(np.abs(got[0, :10] - ref_a[:10])) <= TOL
    assert np.max(np.abs(got[0, 11:16] - ref_b[:5])) <= TOL


def test_right_padded_fast_path_matches_masked_path(pair):
    _, ours = pair
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, ours.config.vocab_size, (2, 12)).astype(np.int32)
    segments = np.array([[1] * 12, [1] * 7 + [0] * 5], np.int32)
    targets = np.roll(tokens, -1, 1)
    args = (jnp.asarray(tokens), None, jnp.asarray(segments), jnp.asarray(targets))
    masked = np.asarray(ours.token_logprobs(*args, chunk_size=4))
    fast = np.asarray(ours.token_logprobs(*args, chunk_size=4, right_padded=True))
    real = segments != 0
    assert np.max(np.abs(masked[real] - fast[real])) <= TOL
    with pytest.raises(ValueError, match="right_padded"):
        bad = np.array([[0] * 3 + [1] * 9, [1] * 12], np.int32)
        ours.token_logprobs(jnp.asarray(tokens), None, jnp.asarray(bad), jnp.asarray(targets), right_padded=True)


def test_positions_from_segments():
    segments = jnp.array([[0, 0, 1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0, 0, 0]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(qwen2.positions_from_segments(segments)),
                                  [[0, 1, 0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1, 2, 3]])


def test_remat_policies_give_identical_gradients():
    from flax import nnx

    from kevin_jax.model.shapes import named_config

    config = named_config("tiny")
    rng = np.random.default_rng(5)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 12)).astype(np.int32))
    targets = jnp.roll(tokens, -1, 1)
    grads = {}
    # jax's own policies are jax's business; these exercise our checkpoint_name wiring (qkv_attn, attn_out,
    # dots_attn) and the unrolled layer loop.
    for remat, scan in [("none", True), ("full", True), ("qkv_attn", True), ("attn_out", True), ("dots_attn", True),
                        ("full", False), ("dots_attn", False)]:
        options = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat=remat, attention="xla",
                                     scan_layers=scan)
        graphdef, state = nnx.split(qwen2.Qwen2ForCausalLM(config, options, rngs=nnx.Rngs(0)))
        loss = lambda p: jnp.sum(nnx.merge(graphdef, p).token_logprobs(tokens, None, None, targets, chunk_size=4))
        grads[(remat, scan)] = jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(state))
    for key, leaves in grads.items():
        for g, r in zip(leaves, grads[("none", True)]):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-6, rtol=1e-5, err_msg=str(key))


def test_save_residuals_as_keeps_math_and_lets_a_policy_skip_the_recompute():
    """qwen2.save_residuals_as (used on the cuDNN attention, checked here on XLA's): same value and gradient, and a
    remat policy saving the name stops the backward pass from recomputing the wrapped forward."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(2, 16, 4, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, 16, 2, 8)), jnp.float32) for _ in range(2))
    attention = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    wrapped = qwen2.save_residuals_as("test_residuals", attention)
    # Linear in the output, so the backward pass needs the attention's residuals only (not its output).
    weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    loss = lambda f: (lambda q, k, v: jnp.sum(f(q, k, v) * weights))
    np.testing.assert_array_equal(np.asarray(wrapped(q, k, v)), np.asarray(attention(q, k, v)))
    for g, r in zip(jax.grad(loss(wrapped), argnums=(0, 1, 2))(q, k, v),
                    jax.grad(loss(attention), argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-6, rtol=1e-5)

    def dots_in_value_and_gradient(policy):
        remat = jax.checkpoint(loss(wrapped), policy=policy)
        lowered = jax.jit(jax.value_and_grad(remat, argnums=(0, 1, 2))).lower(q, k, v)
        return lowered.as_text().count("stablehlo.dot_general")

    saved = dots_in_value_and_gradient(jax.checkpoint_policies.save_only_these_names("test_residuals"))
    recomputed = dots_in_value_and_gradient(jax.checkpoint_policies.nothing_saveable)
    assert saved == 2 + 4                 # forward QK^T, PV; backward dQ, dK, dP, dV
    assert recomputed > saved             # without the names the backward pass runs QK^T again


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprob_head_gradient_matches_autodiff_of_dense_logits(temperature):
    """chunked_logprobs' hand-written backward (float32 here) against jax autodiff of the plain [B, T, V] formula, for
    log-prob and entropy cotangents together, with a chunk that does not divide T."""
    rng = np.random.default_rng(1)
    h = jnp.asarray(rng.normal(size=(2, 13, 16)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(50, 16)) * 0.5, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 50, (2, 13)), jnp.int32)
    a, b = (jnp.asarray(rng.normal(size=(2, 13)), jnp.float32) for _ in range(2))
    highest = jax.lax.Precision.HIGHEST

    def dense(h, head):
        logp = jax.nn.log_softmax(jnp.einsum("bth,vh->btv", h, head, precision=highest) / temperature, axis=-1)
        return (jnp.take_along_axis(logp, targets[..., None], -1)[..., 0], -jnp.sum(jnp.exp(logp) * logp, -1))

    chunked = lambda h, head: qwen2.chunked_logprobs(h, head, targets, chunk_size=5, temperature=temperature,
                                                     precision=highest)
    objective = lambda f: (lambda h, head: jnp.sum(a * f(h, head)[0]) + jnp.sum(b * f(h, head)[1]))
    for ours, ref in zip(chunked(h, head), dense(h, head)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=TOL)
    ours = jax.jit(jax.grad(objective(chunked), argnums=(0, 1)))(h, head)
    ref = jax.grad(objective(dense), argnums=(0, 1))(h, head)
    for g, r in zip(ours, ref):
        assert np.linalg.norm(np.asarray(g) - np.asarray(r)) <= 1e-6 * np.linalg.norm(np.asarray(r))
