"""The sampler end to end on CPU (fp32, random tiny weights): greedy vs. uncached argmax and vs. transformers'
generate, log-probs vs. the model's token_logprobs, the Pallas kernel (interpret mode) vs. the pure-JAX path,
reproducibility, prefix sharing, preemption, stops, bad input, and a chi-square test of sampled first tokens.

Tolerances are fixed (1e-4 on fp32 log-probs) and never loosened.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx

from kevin_jax.env.policy import Generation, Policy
from kevin_jax.model import hf, qwen2
from kevin_jax.model.shapes import named_config
from kevin_jax.sampler import SamplerConfig, SamplerEngine, SamplerPolicy, StopStringCheck
from kevin_jax.sampler.engine import params_of

TOL = 1e-4
FP32 = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="none", attention="xla",
                          matmul_precision="highest")
CONFIG = named_config("tiny").replace(vocab_size=256)
# Small pages, chunks and slots so that every path runs: page crossings, multi-piece prefill, refills.
SMALL = SamplerConfig(temperature=0.0, max_slots=3, max_seq_len=96, page_size=4, decode_steps=8, prefill_chunk=16,
                      prefill_tokens=64, attention="xla")


@pytest.fixture(scope="module")
def model():
    return qwen2.Qwen2ForCausalLM(CONFIG, FP32, rngs=nnx.Rngs(0))


def _prompts(lengths, seed=0, vocab=CONFIG.vocab_size):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def _argmax_continuation(model, prompt, steps, width=64):
    """Uncached greedy decoding: a full forward pass per token. The sequence sits in a fixed-width buffer (causal
    attention: the trailing filler cannot affect earlier positions), so that this compiles once."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)[0])
    seq = list(prompt)
    for _ in range(steps):
        buffer = np.zeros((1, width), np.int32)
        buffer[0, :len(seq)] = seq
        seq.append(int(jnp.argmax(forward(state, jnp.asarray(buffer))[len(seq) - 1])))
    return seq[len(prompt):]


def _recomputed_logprobs(model, prompt, tokens, temperature, width=64):
    """token_logprobs of the generated tokens (one right-padded fixed-width row: compiles once per temperature)."""
    seq = list(prompt) + list(tokens)
    buffer, segments = np.zeros((1, width), np.int32), np.zeros((1, width), np.int32)
    buffer[0, :len(seq)], segments[0, :len(seq)] = seq, 1
    lp = _token_logprobs(nnx.split(model)[1], nnx.split(model)[0], buffer, segments, temperature)
    return np.asarray(lp)[0, len(prompt) - 1:len(seq) - 1]


@functools.partial(jax.jit, static_argnums=(1, 4))
def _token_logprobs(state, graphdef, tokens, segments, temperature):
    targets = jnp.roll(tokens, -1, axis=1)
    return nnx.merge(graphdef, state).token_logprobs(tokens, None, segments, targets, chunk_size=32,
                                                     temperature=temperature)


def test_greedy_equals_repeated_full_forward_argmax(model):
    prompts = _prompts([5, 9, 30, 3, 12])              # 5 prompts, 3 slots: refills; 30 > prefill_chunk: 2 pieces
    policy = SamplerPolicy(model, SMALL)
    results = policy.sample(prompts, 18, seed=0)
    for prompt, result in zip(prompts, results):
        assert result.tokens == _argmax_continuation(model, prompt, 18)
        assert result.stop_reason == "length"
        assert result.prompt_len == len(prompt)
    stats = policy.last_stats
    assert stats.generated_tokens == 5 * 18 and stats.decode_calls > 1 and stats.prefill_calls >= 2


def test_greedy_matches_transformers_generate(tmp_path):
    import torch
    from qwen2_hf_fixtures import save_random_hf_model

    hf_model = save_random_hf_model(str(tmp_path), seed=3, vocab_size=256, num_hidden_layers=2)
    ours = hf.load_hf_checkpoint(str(tmp_path), FP32)
    prompts = _prompts([7, 13], seed=5)
    new = 72
    config = SMALL.replace(max_seq_len=128, max_slots=2, decode_steps=16)
    results = SamplerPolicy(ours, config).sample(prompts, new, seed=0)
    for prompt, result in zip(prompts, results):
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
                                    pad_token_id=0)
        reference = out[0, len(prompt):].tolist()
        assert len(reference) == new
        first_diff = next((i for i, (a, b) in enumerate(zip(result.tokens, reference)) if a != b), None)
        assert first_diff is None, f"diverges from transformers at token {first_diff}"


@pytest.mark.parametrize("temperature", [0.9, 1.0])
def test_logprobs_equal_recomputed_token_logprobs(model, temperature):
    prompts = _prompts([6, 21, 11], seed=1)
    config = SMALL.replace(temperature=temperature)
    results = SamplerPolicy(model, config).sample(prompts, [24, 10, 17], seed=7)
    worst = 0.0
    for prompt, result in zip(prompts, results):
        sampled = _recomputed_logprobs(model, prompt, result.tokens, temperature)
        policy = _recomputed_logprobs(model, prompt, result.tokens, 1.0)
        worst = max(worst, np.max(np.abs(np.asarray(result.logprobs) - sampled)))
        assert np.max(np.abs(np.asarray(result.policy_logprobs) - policy)) <= TOL
    assert worst <= TOL, f"sampled log-probs differ from token_logprobs by {worst}"
    assert [len(r.tokens) for r in results] == [24, 10, 17]


def test_pallas_kernel_matches_pure_jax(model):
    """Interpret mode on CPU (exact fp32); on a GPU the kernel's fp32 dots run in TF32, hence the wider bound."""
    tolerance = 1e-5 if jax.default_backend() != "gpu" else 2e-3
    prompts = _prompts([9, 22], seed=2)
    config = SMALL.replace(temperature=0.9, max_slots=2, decode_steps=6)
    xla = SamplerPolicy(model, config).sample(prompts, 12, seed=3)
    pallas_policy = SamplerPolicy(model, config.replace(attention="pallas"))
    assert pallas_policy.engine.decode_impl == "pallas"
    pallas = pallas_policy.sample(prompts, 12, seed=3)
    for a, b in zip(xla, pallas):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=tolerance)


def test_pallas_kernel_matches_pure_jax_with_three_query_heads_per_kv_head():
    """small_80m's attention geometry (12 query heads on 4 KV heads, head_dim 64: the warm-start demo's policy), at a
    tiny width: the other tests' shapes have 2 or 7 query heads per KV head."""
    config = CONFIG.replace(num_attention_heads=12, num_key_value_heads=4, head_dim=64)
    gqa = qwen2.Qwen2ForCausalLM(config, FP32, rngs=nnx.Rngs(1))
    tolerance = 1e-5 if jax.default_backend() != "gpu" else 2e-3
    prompts = _prompts([9, 22], seed=4)
    config = SMALL.replace(temperature=0.9, max_slots=2, decode_steps=6)
    xla = SamplerPolicy(gqa, config).sample(prompts, 12, seed=3)
    pallas = SamplerPolicy(gqa, config.replace(attention="pallas")).sample(prompts, 12, seed=3)
    for a, b in zip(xla, pallas):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=tolerance)


def test_same_seed_same_tokens_whatever_the_batching(model):
    prompts = _prompts([4, 12, 7, 19, 9], seed=3)
    base = SMALL.replace(temperature=0.9)
    reference = SamplerPolicy(model, base).sample(prompts, 15, seed=42)
    for changes in (dict(max_slots=5, decode_steps=3, prefill_tokens=16),
                    dict(max_slots=1, prefix_sharing=False, prefill_chunk=8)):
        other = SamplerPolicy(model, base.replace(**changes)).sample(prompts, 15, seed=42)
        assert [r.tokens for r in other] == [r.tokens for r in reference], changes
    # A sequence's tokens depend on its index and the seed, not on its neighbours.
    alone = SamplerPolicy(model, base).sample(prompts[:2], 15, seed=42)
    assert [r.tokens for r in alone] == [r.tokens for r in reference[:2]]
    different = SamplerPolicy(model, base).sample(prompts, 15, seed=43)
    assert [r.tokens for r in different] != [r.tokens for r in reference]


def test_shared_prompt_is_prefilled_once(model):
    prompt = _prompts([37], seed=4)[0]
    config = SMALL.replace(temperature=0.9, max_slots=8)
    policy = SamplerPolicy(model, config)
    shared = policy.sample([prompt] * 8, 10, seed=1)
    stats = policy.last_stats
    # 37 tokens = 9 full pages of 4 + 1: the first prefill computes 37, the 7 others share 9 pages, compute 1 token.
    assert stats.prefill_tokens == 37 + 7 * 1
    assert stats.reused_prefix_tokens == 7 * 36
    unshared = SamplerPolicy(model, config.replace(prefix_sharing=False)).sample([prompt] * 8, 10, seed=1)
    for a, b in zip(shared, unshared):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert len({tuple(r.tokens) for r in shared}) > 1, "trajectories of one prompt must differ"
    # A prompt of whole pages: the last page is recomputed by each sequence (its last token's logits are needed).
    policy.sample([prompt[:36]] * 3, 2, seed=1)
    assert policy.last_stats.prefill_tokens == 36 + 2 * 4 and policy.last_stats.reused_prefix_tokens == 2 * 32


def test_preemption_when_the_pool_runs_dry_changes_nothing(model):
    prompts = _prompts([10, 14, 6, 18], seed=5)
    config = SMALL.replace(temperature=0.9, max_slots=4, decode_steps=4)
    reference = SamplerPolicy(model, config).sample(prompts, 40, seed=9)
    small_pool = SamplerPolicy(model, config.replace(num_pages=30))   # 29 usable pages; 4 sequences want ~60
    results = small_pool.sample(prompts, 40, seed=9)
    assert small_pool.last_stats.preemptions > 0
    for a, b in zip(reference, results):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_stop_ids_and_stop_sequences(model):
    prompts = _prompts([8, 15], seed=6)
    free = SamplerPolicy(model, SMALL).sample(prompts, 30, seed=0)
    stop_id = free[0].tokens[6]
    first = free[0].tokens.index(stop_id)
    eos = SamplerPolicy(model, SMALL.replace(stop_ids=(stop_id,))).sample(prompts[:1], 30, seed=0)[0]
    assert eos.stop_reason == "eos" and eos.tokens == free[0].tokens[:first + 1]

    pair = tuple(free[1].tokens[9:11])
    end = next(i for i in range(1, 30) if tuple(free[1].tokens[i - 1:i + 1]) == pair) + 1
    stopped = SamplerPolicy(model, SMALL.replace(stop_sequences=(pair, (255, 254, 253)))).sample(
        prompts[1:], 30, seed=0)[0]
    assert stopped.stop_reason == "stop" and stopped.tokens == free[1].tokens[:end]
    assert len(stopped.logprobs) == len(stopped.tokens)


def test_host_stop_check_truncates_and_frees_the_slot(model):
    prompts = _prompts([8, 15, 6], seed=6)
    engine = SamplerEngine(model, SMALL)
    free, _ = engine.generate(params_of(model), prompts, 30, seed=0)
    marker = free[0].tokens[7]

    def stop_at_marker_fake(index, tokens, added):          # stands in for StopStringCheck (no tokenizer needed)
        return tokens.index(marker) + 1 if marker in tokens else None

    stopped, _ = engine.generate(params_of(model), prompts, 30, seed=0, stop_check=stop_at_marker_fake)
    for a, b in zip(free, stopped):
        if marker in a.tokens:
            cut = a.tokens.index(marker) + 1
            assert b.stop_reason == "stop" and b.tokens == a.tokens[:cut] and len(b.logprobs) == cut
        else:
            assert b.tokens == a.tokens and b.stop_reason == "length"


def test_stop_on_the_first_token_and_per_sequence_lengths(model):
    prompts = _prompts([5, 5, 9], seed=7)
    free = SamplerPolicy(model, SMALL).sample(prompts, [1, 3, 7], seed=0)
    assert [len(r.tokens) for r in free] == [1, 3, 7] and all(r.stop_reason == "length" for r in free)
    eos = SamplerPolicy(model, SMALL.replace(stop_ids=(free[2].tokens[0],))).sample(prompts[2:], 7, seed=0)[0]
    assert eos.tokens == free[2].tokens[:1] and eos.stop_reason == "eos"


def test_generation_stops_at_the_context_limit(model):
    config = SMALL.replace(max_seq_len=40)
    result = SamplerPolicy(model, config).sample(_prompts([33], seed=8), 100, seed=0)[0]
    assert len(result.tokens) == 40 - 33 and result.stop_reason == "length"


def test_policy_protocol_and_generation_type(model):
    policy = SamplerPolicy(model, SMALL.replace(temperature=0.9))
    assert isinstance(policy, Policy)
    out = policy.generate(_prompts([4, 6], seed=9), 5, seed=0)
    assert all(isinstance(g, Generation) and len(g.tokens) == 5 == len(g.logprobs) for g in out)
    assert policy.generate([], 5, seed=0) == []
    other = qwen2.Qwen2ForCausalLM(CONFIG, FP32, rngs=nnx.Rngs(1))
    policy.set_model(other)                               # new parameters, same graph: allowed
    assert policy.generate(_prompts([4, 6], seed=9), 5, seed=0) != out
    with pytest.raises(ValueError, match="graph"):
        policy.set_model(qwen2.Qwen2ForCausalLM(CONFIG.replace(num_hidden_layers=1), FP32, rngs=nnx.Rngs(1)))


def test_bad_input_is_a_clear_error(model):
    policy = SamplerPolicy(model, SMALL)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        policy.generate([[1, 2], []], 4, seed=0)
    with pytest.raises(ValueError, match="prompt 0 has 96 tokens but the context"):
        policy.generate([[1] * 96], 4, seed=0)
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        policy.generate([[1, 2]], 0, seed=0)
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        policy.generate([[1, 2], [3]], [3, -1], seed=0)
    with pytest.raises(ValueError, match="2 entries for 1 prompts"):
        policy.generate([[1, 2]], [3, 4], seed=0)
    with pytest.raises(ValueError, match="token id 256 outside the vocabulary"):
        policy.generate([[1, 256]], 4, seed=0)
    with pytest.raises(ValueError, match="stop token id 300 is outside the vocabulary"):
        SamplerPolicy(model, SMALL.replace(stop_ids=(300,)))
    with pytest.raises(ValueError, match="stop token id -1|non-negative"):
        SamplerPolicy(model, SMALL.replace(stop_ids=(-1,)))
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        SamplerPolicy(model, SMALL.replace(num_pages=10))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        SamplerPolicy(model, SMALL.replace(stop_strings=("```",)))
    with pytest.raises(ValueError, match="top_p"):
        SMALL.replace(top_p=0.0)


def test_first_token_frequencies_match_the_model_distribution(model):
    """Chi-square: many samples of the first generated token of one prompt vs softmax(logits / T) after top-p."""
    prompt = _prompts([11], seed=10)[0]
    temperature, top_p, n = 0.8, 0.9, 3000
    config = SMALL.replace(temperature=temperature, top_p=top_p, max_slots=512, prefill_tokens=2048)
    results = SamplerPolicy(model, config).sample([prompt] * n, 1, seed=5)
    counts = np.bincount([r.tokens[0] for r in results], minlength=CONFIG.vocab_size)
    logits = np.asarray(model(jnp.asarray([prompt], jnp.int32))[0, -1], np.float64) / temperature
    order = np.argsort(-logits)
    p = np.exp(logits[order] - logits.max())
    p /= p.sum()
    keep = order[(np.cumsum(p) - p) < top_p]
    expected = np.zeros_like(logits)
    expected[keep] = np.exp(logits[keep] - logits.max())
    expected /= expected.sum()
    assert counts[expected == 0].sum() == 0
    # Pool rare tokens so every cell expects >= 5 samples.
    support = np.argsort(-expected)[:int(np.sum(expected > 0))]
    big = [t for t in support if expected[t] * n >= 5]
    rest = [t for t in support if expected[t] * n < 5]
    observed = [counts[t] for t in big] + ([counts[rest].sum()] if rest else [])
    wanted = [expected[t] * n for t in big] + ([expected[rest].sum() * n] if rest else [])
    stat, pvalue = scipy.stats.chisquare(observed, wanted)
    assert pvalue > 1e-3, f"chi-square {stat:.1f} over {len(big)} cells, p={pvalue:.2e}"


def test_stop_string_check_with_the_builtin_tokenizer():
    from kevin_jax.model.tokenizer import load_tokenizer

    tok = load_tokenizer()
    ids = tok.encode("first line\n</think>\nsome code ``` and more text")
    check = StopStringCheck(tok, ["```"])
    cut = None
    for added_upto in range(1, len(ids) + 1):       # tokens arrive one call at a time
        cut = check(0, ids[:added_upto], 1)
        if cut is not None:
            break
    assert cut is not None and "```" in tok.decode(ids[:cut]) and "```" not in tok.decode(ids[:cut - 1])
    assert check(0, tok.encode("no stop here"), 3) is None


def test_engine_reports_stats_and_reuses_its_pool(model):
    engine = SamplerEngine(model, SMALL)
    results, stats = engine.generate(params_of(model), _prompts([6, 7]), 9, seed=0)
    assert stats.generated_tokens == 18 and stats.decode_steps >= 8 and 0 < stats.slot_occupancy <= 1
    assert stats.kv_tokens_read > 0 and stats.peak_pages_in_use > 0
    pool = engine.pool()
    engine.generate(params_of(model), _prompts([5]), 3, seed=0)
    assert engine.pool().k.shape == pool.k.shape


@pytest.mark.parametrize("name,layer_loop", [("qwen2.5_1.5b", "unrolled"), ("qwq_32b", "scan")])
def test_real_shapes_lower_for_cuda_with_the_pallas_kernel(name, layer_loop):
    """Traces decode (with the Pallas Triton kernel) and prefill at a real model's shapes and lowers them for CUDA,
    on abstract arrays: no memory, no GPU needed; catches shape and blocking errors before the device does."""
    from kevin_jax.model.shapes import named_config as config_of
    from kevin_jax.sampler import kv_cache, steps

    config = config_of(name)
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="bfloat16", remat="none")
    abstract = qwen2.abstract_model(config, options)
    state = nnx.split(abstract)[1]
    slots, max_seq, page = 16, 4096, 16
    geometry = kv_cache.make_geometry(config, pages_per_layer=kv_cache.pages_for(slots * max_seq, page) + 1,
                                      page_size=page, max_seq_len=max_seq)
    settings = steps.StepSettings(geometry=geometry, temperature=0.9, top_k=0, top_p=1.0, stop_ids=(1, 2),
                                  stop_patterns=(), decode_impl="pallas",
                                  pallas=kv_cache.pallas_params(geometry, interpret=False), layer_unroll=1,
                                  decode_steps=8, layer_loop=layer_loop)
    functions = steps.StepFunctions(steps.ModelParts.of(abstract), settings)
    sds, width = jax.ShapeDtypeStruct, geometry.table_width
    pool = kv_cache.KVPool(*[sds(kv_cache.pool_shape(geometry), jnp.bfloat16)] * 2)
    ints = lambda *shape: sds(shape, jnp.int32)                                   # noqa: E731
    flags = lambda *shape: sds(shape, jnp.bool_)                                  # noqa: E731
    state_in = steps.SlotState(ints(slots), ints(slots), ints(slots), ints(slots), flags(slots), ints(slots),
                               ints(slots, width), ints(slots, 1))
    allow_triton = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    # unrolled: the per-layer copy; scan: the parameters themselves (one device: already the sampling layout)
    weights = jax.eval_shape(functions.prepare, state) if layer_loop == "unrolled" else functions.view(state)
    assert weights.stacked == (layer_loop == "scan")
    decode = jax.export.export(functions.decode, platforms=["cuda"], disabled_checks=allow_triton)(
        weights, pool, state_in, sds((), jnp.uint32), sds((), jnp.int32))
    module = decode.mlir_module()
    assert "xla.gpu.triton" in module
    # Unrolled: one kernel call per layer in the step (straight-line code); scanned: one in the loop body.
    assert module.count("call @paged_attention") == (config.num_hidden_layers if layer_loop == "unrolled" else 1)
    rows, chunk = 4, 256
    batch = steps.PrefillBatch(ints(rows, chunk), ints(rows, chunk), flags(rows, chunk), ints(rows, width),
                               ints(rows), ints(rows), flags(rows), ints(rows), ints(rows), ints(rows), ints(rows, 1))
    hidden, rope, ctx = jax.eval_shape(functions.prefill_start, weights.embed, batch)
    layer = weights.layers if weights.stacked else weights.layers[0]
    jax.export.export(functions.prefill_layer, platforms=["cuda"])(layer, hidden, rope, ctx, pool, sds((), jnp.int32))
    jax.export.export(functions.prefill_finish, platforms=["cuda"])(weights.final_norm, weights.head_weight(), hidden,
                                                                    batch, sds((), jnp.uint32))


def test_device_guard_wraps_every_device_call_and_changes_no_token(model):
    """On a GPU shared with cuda_eval the engine holds the evaluator's DeviceShare around each prefill and decode
    call (never nested, never across host work between calls); the tokens are the same as without it."""
    import contextlib

    events = []

    @contextlib.contextmanager
    def guard():
        assert not events or events[-1] == "exit", "nested hold"
        events.append("enter")
        yield
        events.append("exit")

    prompts = _prompts([4, 12, 7, 19, 9], seed=5)
    plain = SamplerEngine(model, SMALL)
    guarded = SamplerEngine(model, SMALL, device_guard=guard)
    want, _ = plain.generate(params_of(model), prompts, 12, seed=1)
    got, stats = guarded.generate(params_of(model), prompts, 12, seed=1)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert events.count("enter") == events.count("exit") >= stats.decode_calls + 1
