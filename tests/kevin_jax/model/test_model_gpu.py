"""GPU-only checks of the model: cuDNN flash attention against the XLA path (bf16), through the gradient too, and
remat policies against no remat (fp32 exactly, bf16 within bf16 rounding)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kevin_jax.model import qwen2
from kevin_jax.model.shapes import named_config

pytestmark = pytest.mark.gpu

# head_dim 128 (as QwQ), GQA 4:1, T a multiple of 64.
CONFIG = named_config("tiny").replace(hidden_size=512, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                                      intermediate_size=1024, vocab_size=4096)

# Every policy but "none" (the reference), scanned; and two unrolled.
REMATS = [(remat, True) for remat in qwen2.REMAT_POLICIES if remat != "none"] + [("full", False), ("dots_attn", False)]


def _model(attention, remat="full", *, dtype="bfloat16", precision="default", scan_layers=True):
    options = qwen2.ModelOptions(dtype=dtype, param_dtype="float32", remat=remat, attention=attention,
                                 matmul_precision=precision, scan_layers=scan_layers)
    return qwen2.Qwen2ForCausalLM(CONFIG, options, rngs=nnx.Rngs(0))


def _fp32_model(remat="none", scan_layers=True):
    # cuDNN attention needs bf16/fp16: fp32 runs XLA's attention, with full-precision (not TF32) matmuls.
    return _model("xla", remat, dtype="float32", precision="highest", scan_layers=scan_layers)


def _batch(batch=2, length=256):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CONFIG.vocab_size, (batch, length)).astype(np.int32)
    segments = np.ones((batch, length), np.int32)
    segments[1, 200 * length // 256:] = 0                    # right padding in row 1
    return jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(np.roll(tokens, -1, 1))


def _loss_fn(model, tokens, segments, targets):
    graphdef, state = nnx.split(model)

    def loss(params):
        lp = nnx.merge(graphdef, params).token_logprobs(tokens, None, segments, targets, chunk_size=128,
                                                        right_padded=True)
        return jnp.sum(lp) / jnp.sum(segments), lp

    return jax.jit(jax.value_and_grad(loss, has_aux=True)), state


def _loss_and_grads(model, tokens, segments, targets):
    step, state = _loss_fn(model, tokens, segments, targets)
    (value, lp), grads = step(state)
    return value, lp, [np.asarray(g, np.float32) for g in jax.tree_util.tree_leaves(grads)]


def test_auto_picks_cudnn_on_gpu():
    assert jax.default_backend() == "gpu"
    q = jnp.zeros((1, 128, 4, 128), jnp.bfloat16)
    k = jnp.zeros((1, 128, 1, 128), jnp.bfloat16)
    attention = qwen2.make_segment_attention(qwen2.ModelOptions(attention="auto"))
    ctx = qwen2.SegmentContext(segment_ids=jnp.ones((1, 128), jnp.int32), right_padded=True)
    hlo = jax.jit(lambda q, k: attention(q, k, k, None, ctx)[0]).lower(q, k).as_text()
    assert "cudnn" in hlo.lower(), "auto did not select the cuDNN fused attention"


def test_cudnn_matches_xla_logprobs_and_grads():
    tokens, segments, targets = _batch()
    cudnn = _loss_and_grads(_model("cudnn"), tokens, segments, targets)
    xla = _loss_and_grads(_model("xla"), tokens, segments, targets)
    real = np.asarray(segments) != 0
    lp_c, lp_x = np.asarray(cudnn[1])[real], np.asarray(xla[1])[real]
    # bf16 activations: compare at bf16-level tolerance, relative to the log-prob scale.
    assert np.max(np.abs(lp_c - lp_x)) <= 0.05 * max(1.0, np.max(np.abs(lp_x)) / 10)
    for gc, gx in zip(cudnn[2], xla[2]):
        assert np.all(np.isfinite(gc))
        denom = np.linalg.norm(gx) + 1e-12
        assert np.linalg.norm(gc - gx) / denom < 0.05


def test_chunked_matches_xla_on_gpu():
    tokens, segments, targets = _batch(length=192)
    a = _loss_and_grads(_model("chunked"), tokens, segments, targets)[1]
    b = _loss_and_grads(_model("xla"), tokens, segments, targets)[1]
    real = np.asarray(segments) != 0
    assert np.max(np.abs(np.asarray(a)[real] - np.asarray(b)[real])) <= 0.05


def test_remat_does_not_change_fp32_gradients():
    """Remat only decides what is kept and what is recomputed, never the math: in fp32 the gradients agree to fp32
    rounding, at the same tolerance as the CPU test (test_model_parity.test_remat_policies_give_identical_gradients)."""
    tokens, segments, targets = _batch(length=128)
    reference = _loss_and_grads(_fp32_model(), tokens, segments, targets)[2]
    for remat, scan in REMATS:
        grads = _loss_and_grads(_fp32_model(remat, scan), tokens, segments, targets)[2]
        for g, r in zip(grads, reference):
            np.testing.assert_allclose(g, r, atol=1e-6, rtol=1e-5, err_msg=f"remat={remat} scan_layers={scan}")


def test_remat_keeps_bf16_gradients_within_bf16_rounding():
    """In bf16, remat may legitimately change the last bits: the backward pass recomputes intermediates in fusions
    other than the forward's, and XLA may keep an f32 value that the forward rounded to bf16 (excess precision) or
    round at another point. A remat gradient is therefore another bf16-rounded evaluation of the same exact gradient
    g, as the no-remat gradient g_none is. bf16 keeps 8 significant bits (unit roundoff 2^-8 = 3.9e-3), and after a
    few layers of rounded activations ||g_none - g|| is ~1e-2 of ||g|| (the first H200 run measured a 1.3e-2 relative
    difference between full and none on one leaf). So we calibrate on the measured bf16 error of the no-remat
    gradient, eps = ||g_none - g|| with g the fp32 gradient: two evaluations with errors of that size differ by
    at most ~2 eps (triangle inequality); we allow 3 eps, plus 2^-10 ||g|| so that a leaf whose bf16 error happens
    to be tiny does not fail on noise. A remat bug (a stale or misplaced saved value) changes a gradient by the order
    of ||g|| itself, far above this bound."""
    tokens, segments, targets = _batch(length=128)
    exact = _loss_and_grads(_fp32_model(), tokens, segments, targets)[2]
    reference = _loss_and_grads(_model("cudnn", "none"), tokens, segments, targets)[2]
    eps = [np.linalg.norm(r - e) for r, e in zip(reference, exact)]
    for remat, scan in REMATS:
        grads = _loss_and_grads(_model("cudnn", remat, scan_layers=scan), tokens, segments, targets)[2]
        for i, (g, r, e) in enumerate(zip(grads, reference, exact)):
            bound = 3 * eps[i] + 2 ** -10 * np.linalg.norm(e)
            assert np.linalg.norm(g - r) <= bound, (remat, scan, i, np.linalg.norm(g - r), bound)


def _cudnn_forward_calls(compiled_text: str) -> int:
    targets = re.findall(r'custom_call_target="([^"]+)"', compiled_text)
    return sum(1 for t in targets if "fmha" in t.lower() and "backward" not in t.lower())


@pytest.mark.parametrize("remat, expected", [("none", 1), ("dots_attn", 1), ("qkv_attn", 1), ("attn_out", 1),
                                             ("dots_no_batch", 2), ("full", 2)])
def test_saved_attention_residuals_spare_the_forward_kernel(remat, expected):
    """With the attention residuals saved (qwen2.ATTENTION_RESIDUALS), the backward pass does not run the cuDNN
    forward kernel again: one forward custom call in the scanned module; two when the policy does not save them."""
    tokens, segments, targets = _batch(length=128)
    step, state = _loss_fn(_model("cudnn", remat), tokens, segments, targets)
    assert _cudnn_forward_calls(step.lower(state).compile().as_text()) == expected
