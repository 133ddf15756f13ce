"""GPU-only checks of the model: cuDNN flash attention against the XLA path (bf16), through the gradient too."""
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


def _model(attention, remat="full"):
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="float32", remat=remat, attention=attention)
    return qwen2.Qwen2ForCausalLM(CONFIG, options, rngs=nnx.Rngs(0))


def _batch(batch=2, length=256):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CONFIG.vocab_size, (batch, length)).astype(np.int32)
    segments = np.ones((batch, length), np.int32)
    segments[1, 200:] = 0                                   # right padding in row 1
    return jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(np.roll(tokens, -1, 1))


def _loss_and_grads(model, tokens, segments, targets):
    graphdef, state = nnx.split(model)

    def loss(params):
        lp = nnx.merge(graphdef, params).token_logprobs(tokens, None, segments, targets, chunk_size=128,
                                                        right_padded=True)
        return jnp.sum(lp) / jnp.sum(segments), lp

    (value, lp), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    return value, lp, grads


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
    for gc, gx in zip(jax.tree_util.tree_leaves(cudnn[2]), jax.tree_util.tree_leaves(xla[2])):
        gc, gx = np.asarray(gc, np.float32), np.asarray(gx, np.float32)
        assert np.all(np.isfinite(gc))
        denom = np.linalg.norm(gx) + 1e-12
        assert np.linalg.norm(gc - gx) / denom < 0.05


def test_chunked_matches_xla_on_gpu():
    tokens, segments, targets = _batch(length=192)
    a = _loss_and_grads(_model("chunked"), tokens, segments, targets)[1]
    b = _loss_and_grads(_model("xla"), tokens, segments, targets)[1]
    real = np.asarray(segments) != 0
    assert np.max(np.abs(np.asarray(a)[real] - np.asarray(b)[real])) <= 0.05


def test_remat_policies_give_same_gradients():
    tokens, segments, targets = _batch(length=128)
    reference = _loss_and_grads(_model("cudnn", remat="none"), tokens, segments, targets)[2]
    for remat in ("full", "dots", "dots_no_batch", "qkv_attn", "attn_out"):
        grads = _loss_and_grads(_model("cudnn", remat=remat), tokens, segments, targets)[2]
        for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference)):
            g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
            assert np.linalg.norm(g - r) / (np.linalg.norm(r) + 1e-12) < 1e-2, remat
