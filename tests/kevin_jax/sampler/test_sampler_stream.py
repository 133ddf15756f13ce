"""SamplerStream (kevin_jax/sampler/engine.py) on CPU with random tiny weights: requests added between decode calls
share one continuous batch, each drawing exactly the tokens a generate call of its own draws (per-request seeds),
and no slot idles while a sequence waits."""
import numpy as np
import pytest
from flax import nnx

from kevin_jax.model import qwen2
from kevin_jax.model.shapes import named_config
from kevin_jax.sampler import SamplerConfig, SamplerEngine, SamplerPolicy
from kevin_jax.sampler.engine import params_of

FP32 = qwen2.ModelOptions(dtype="float32", param_dtype="float32", remat="none", attention="xla",
                          matmul_precision="highest")
CONFIG = named_config("tiny").replace(vocab_size=256)
SLOTS = 4
STREAM = SamplerConfig(temperature=0.9, max_slots=SLOTS, max_seq_len=64, page_size=4, decode_steps=4,
                       prefill_chunk=16, prefill_tokens=64, attention="xla", num_pages=80)


@pytest.fixture(scope="module")
def model():
    return qwen2.Qwen2ForCausalLM(CONFIG, FP32, rngs=nnx.Rngs(0))


def _request(seed, lengths, limits):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in lengths], limits, 1000 + seed


REQUESTS = [_request(1, [5, 9, 6, 7], [6, 22, 8, 10]),     # a straggler of 22 tokens
            _request(2, [8, 4, 11], [12, 5, 9]),
            _request(3, [6, 6], [14, 7])]


def test_requests_in_one_stream_draw_what_separate_calls_draw_and_keep_the_batch_full(model):
    engine = SamplerEngine(model, STREAM, stop_ids=())
    params = params_of(model)
    separate = [engine.generate(params, prompts, limits, seed) for prompts, limits, seed in REQUESTS]

    stream = engine.stream(params)
    handles = [stream.add(*REQUESTS[0], owner="a"), stream.add(*REQUESTS[1], owner="b")]
    order = [r.owner for r in stream.step()]
    handles.append(stream.add(*REQUESTS[2], owner="c"))       # joins while the others decode
    while stream.busy:
        order += [r.owner for r in stream.step()]
    stream.close()

    for handle, (results, _) in zip(handles, separate):
        got = handle.results()
        assert [r.tokens for r in got] == [r.tokens for r in results]
        assert [r.stop_reason for r in got] == [r.stop_reason for r in results]
        for a, b in zip(got, results):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert sorted(order) == ["a", "b", "c"] and order[0] != "a"    # "a" (the straggler) is not what came first

    live = stream.stats.live_per_step
    # While anything waited, every slot decoded; once nothing waits the batch only drains (one tail, at the end).
    tail = next(i for i, n in enumerate(live) if n < SLOTS)
    assert all(n == SLOTS for n in live[:tail]) and all(a >= b for a, b in zip(live[tail:], live[tail + 1:]))
    # The same tokens in fewer decode steps than one call per request (each of those ends with its longest answer).
    generated = sum(sum(len(r.tokens) for r in results) for results, _ in separate)
    assert stream.stats.generated_tokens == generated
    separate_steps = sum(stats.decode_steps for _, stats in separate)
    assert stream.stats.decode_steps < separate_steps
    assert stream.stats.slot_occupancy > max(stats.slot_occupancy for _, stats in separate)


def test_the_policy_stream_returns_generations_by_owner_and_drops_its_weights_when_dry(model):
    policy = SamplerPolicy(model, STREAM)
    stream = policy.stream()
    assert stream.continuous and not stream.busy
    prompts, limits, seed = REQUESTS[1]
    stream.add(prompts, limits, seed, owner="round")
    done = []
    while stream.busy:
        done += stream.advance()
        if stream.busy:
            assert stream.stream._run.weights is not None
    assert stream.stream._run.weights is None                  # the copy is not held between requests
    [(owner, generations)] = done
    expected = policy.generate(prompts, limits, seed)
    assert owner == "round" and [g.tokens for g in generations] == [g.tokens for g in expected]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        stream.add([[CONFIG.vocab_size]], 4, 0, owner="bad")
    assert not stream.busy                                      # a bad request queues nothing
    stream.close()


class FakeShare:
    """The evaluator's device share: held while the sampler uses the GPU."""

    def __init__(self):
        self.held = False
        self.entered = 0

    def __enter__(self):
        assert not self.held
        self.held, self.entered = True, self.entered + 1

    def __exit__(self, *exc):
        self.held = False


class FakeCheckedFunctions:
    """The engine's step functions, checking that the share is held around every device call."""

    def __init__(self, functions, share):
        self.functions, self.share, self.calls = functions, share, 0

    def __getattr__(self, name):
        return getattr(self.functions, name)

    def prefill(self, *args):
        assert self.share.held
        self.calls += 1
        return self.functions.prefill(*args)

    def decode(self, *args):
        assert self.share.held
        self.calls += 1
        return self.functions.decode(*args)


def test_a_stream_holds_the_evaluators_device_share_around_each_device_call(model):
    from kevin_jax.env.submissions import share_gpus_with_evaluator

    policy = SamplerPolicy(model, STREAM)
    share = FakeShare()
    evaluator = type("FakeSharingEvaluator", (), {"device_share": lambda self, gpu: share})()
    assert share_gpus_with_evaluator(policy, evaluator, [0]) == [share]
    policy.engine.functions = checked = FakeCheckedFunctions(policy.engine.functions, share)
    stream = policy.stream()
    for prompts, limits, seed in REQUESTS[:2]:
        stream.add(prompts, limits, seed, owner=seed)
    while stream.busy:
        stream.advance()
        assert not share.held                                   # handed back between device calls
    stream.close()
    assert checked.calls >= stream.stats.decode_calls + 1 and share.entered >= stream.stats.decode_calls + 1
