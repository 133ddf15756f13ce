"""Contract 3: a KV-cache attention plugged into the layer stack through attention_fn / layer_states reproduces the
full forward pass token by token (prefill, then one-token decode steps), with no second copy of the layer."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from kevin_jax.model import qwen2
from kevin_jax.model.shapes import named_config


@struct.dataclass
class CacheContext:
    start: jax.Array          # scalar int32: cache index of the first token of this call


def reference_kv_cache_attention(q, k, v, layer_state, ctx: CacheContext):
    """Writes this call's k/v into the layer's cache slice, attends to everything cached so far (causally)."""
    k_cache, v_cache = layer_state
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, ctx.start, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, ctx.start, 0, 0))
    q_pos = ctx.start + jnp.arange(q.shape[1])
    k_pos = jnp.arange(k_cache.shape[1])
    mask = (k_pos[None, :] <= q_pos[:, None])[None, None]                    # [1, 1, T, S]
    out = jax.nn.dot_product_attention(q, k_cache, v_cache, mask=mask, implementation="xla")
    return out, (k_cache, v_cache)


def test_kv_cache_decode_through_the_hook_matches_full_forward():
    config = named_config("tiny")
    options = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="none", attention="xla")
    model = qwen2.Qwen2ForCausalLM(config, options, rngs=nnx.Rngs(3))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (2, 10)).astype(np.int32))
    full = np.asarray(model(tokens))

    max_len = 16
    cache_shape = (config.num_hidden_layers, 2, max_len, config.num_key_value_heads, config.head_dim)
    cache = (jnp.zeros(cache_shape), jnp.zeros(cache_shape))

    @jax.jit
    def step(cache, chunk, start):
        positions = start + jnp.broadcast_to(jnp.arange(chunk.shape[1]), chunk.shape)
        hidden, cache = model.run_layers(model.embed(chunk), positions, CacheContext(start=start),
                                         attention_fn=reference_kv_cache_attention, layer_states=cache)
        return model.logits(model.final_hidden(hidden)), cache

    logits, cache = step(cache, tokens[:, :6], jnp.int32(0))                  # prefill 6 tokens
    np.testing.assert_allclose(np.asarray(logits), full[:, :6], atol=1e-4, rtol=0)
    assert cache[0].shape == cache_shape
    for t in range(6, 10):                                                     # decode one token at a time
        logits, cache = step(cache, tokens[:, t:t + 1], jnp.int32(t))
        np.testing.assert_allclose(np.asarray(logits[:, 0]), full[:, t], atol=1e-4, rtol=0)
