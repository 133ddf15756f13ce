"""The round loop with a continuous sampler stream (env.stream_rounds, kevin_jax/env/episode.py): each group's round
joins the decode batch as soon as it is ready, so the batch stays full while rounds' longest answers finish, and the
trajectories are those of one sampler call per round, whatever order the verdicts come back in. The decode batch is
a scripted fake (FakeBatchPolicy: `slots` sequences, one token each per step, freed slots refilled first come first
served), so the live sequences per decode step are exact; all on the CPU, in seconds."""
import collections
import concurrent.futures

import numpy as np
from kevin_env_fakes import chatml_tokenizer, scripted_answer
from test_overlap import SOLUTIONS, TASKS, FakeShuffledEvaluator, tasks, verdict_of

from kevin_jax.env.episode import EnvConfig, EpisodeRunner
from kevin_jax.env.policy import CallPerRequest, Generation, open_stream
from kevin_jax.reward import RewardConfig

SLOTS = 6


class FakeBatchPolicy:
    """Answers that depend only on (seed, index in the request, prompt), of varied lengths (a thought of 0-400 words),
    decoded by a fake batch of `slots`: `generate` is one batch per call (it ends with its longest answer),
    `stream()` one batch that every request added joins. `traces` holds the live sequences per decode step of each
    call or stream."""

    def __init__(self, tokenizer, slots=SLOTS):
        self.tok = tokenizer
        self.slots = slots
        self.traces = []

    def answer(self, prompt, seed, i) -> Generation:
        text = self.tok.decode(list(prompt), skip_special_tokens=False)
        task = next(t for t in TASKS.tasks if t.source.strip() in text)
        rng = np.random.default_rng([seed, i, len(prompt)])
        kind = ("wrong", "correct", "correct", "broken")[rng.integers(4)]
        code = SOLUTIONS[(task.task_id, "wrong" if kind == "wrong" else "correct")]
        if kind == "broken":
            code += "\n# COMPILE_ERROR"
        thought = " ".join(["hmm"] * int(rng.integers(0, 400)))
        answer = scripted_answer(code, thought=thought, summary=f"SPEEDUP={rng.uniform(0.5, 3):.2f}")
        ids = self.tok(answer, add_special_tokens=False)["input_ids"] + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        return Generation(ids, [float(x) for x in -rng.random(len(ids))], "eos")

    def generate(self, prompts, max_new_tokens, seed):
        stream = FakeBatchStream(self)
        stream.add(prompts, max_new_tokens, seed, owner=None)
        while stream.busy:
            [(_, generations)] = stream.advance() or [(None, None)]
        return generations

    def stream(self):
        return FakeBatchStream(self)


class FakeBatchStream:
    """The fake decode batch: each advance is one decode step (admit waiting sequences into free slots, oldest
    request first; every live sequence emits one token; finished ones free their slots)."""
    continuous = True

    def __init__(self, policy):
        self.policy = policy
        self.waiting = collections.deque()
        self.live = []
        self.requests = []                      # [owner, generations, sequences left], in the order added
        self.trace = []
        policy.traces.append(self.trace)

    def add(self, prompts, max_new_tokens, seed, owner):
        request = [owner, [self.policy.answer(p, seed, i) for i, p in enumerate(prompts)], len(prompts)]
        self.requests.append(request)
        self.waiting.extend([request, len(g.tokens)] for g in request[1])

    @property
    def busy(self):
        return bool(self.requests)

    def advance(self):
        while self.waiting and len(self.live) < self.policy.slots:
            self.live.append(self.waiting.popleft())
        self.trace.append(len(self.live))
        for seq in self.live:
            seq[1] -= 1
            if seq[1] == 0:
                seq[0][2] -= 1
        self.live = [seq for seq in self.live if seq[1] > 0]
        done = [(r[0], r[1]) for r in self.requests if r[2] == 0]
        self.requests = [r for r in self.requests if r[2] > 0]
        return done

    def close(self):
        self.waiting.clear()
        self.live = []


class FakeInstantEvaluator:
    """Every verdict in at submission (a completed future): a group's next round is ready as soon as its round's
    answers are, so the decode trace depends on nothing but the answers' lengths."""
    mode = "full"

    def submit(self, requests):
        futures = []
        for r in requests:
            f = concurrent.futures.Future()
            f.set_result(verdict_of(r))
            futures.append(f)
        return futures


def play(evaluator, groups=2, **env):
    policy = FakeBatchPolicy(chatml_tokenizer())
    config = EnvConfig(**{"num_turns": 3, "num_trajectories": 3, "max_prompt_tokens": 200_000,
                          "max_response_tokens": 100_000, "pipeline_groups": groups, **env})
    result = EpisodeRunner(policy, evaluator, chatml_tokenizer(), config, RewardConfig()).run(tasks(), step=5, seed=3)
    return [t.to_dict() for t in result.trajectories], result, policy


def test_streamed_rounds_keep_the_decode_batch_full_and_draw_the_same_trajectories():
    per_call, per_call_result, calls = play(FakeInstantEvaluator(), stream_rounds=False)
    streamed, streamed_result, stream = play(FakeInstantEvaluator())
    assert streamed == per_call                         # tokens, prompts, request ids, verdicts, scores
    assert len(calls.traces) == 3 * 2 and len(stream.traces) == 1      # a call per group's round; one stream
    trace = stream.traces[0]
    tokens = sum(len(t["response_tokens"]) for tr in streamed for t in tr["turns"])
    assert sum(trace) == tokens == sum(map(sum, calls.traces))
    # Streamed, a slot idles only in the last rounds' tail: the batch is full until the last round was added ...
    tail = next(i for i, n in enumerate(trace) if n < SLOTS)
    assert tail >= 0.7 * len(trace) and all(n == SLOTS for n in trace[:tail])
    occupancy = sum(trace) / (SLOTS * len(trace))
    per_call_steps = sum(len(t) for t in calls.traces)
    per_call_occupancy = tokens / (SLOTS * per_call_steps)
    # ... while one call per round decodes a shrinking batch at the end of every call.
    assert occupancy >= 0.85 and per_call_occupancy <= 0.78 and len(trace) <= 0.87 * per_call_steps, (
        occupancy, per_call_occupancy, len(trace), per_call_steps)
    # The policy is busy as long as there is something to decode: sampling time is the union of the requests'.
    assert streamed_result.timing.sampling_s <= streamed_result.timing.wall_s


def test_streamed_rounds_give_the_sequential_runners_trajectories_whatever_order_verdicts_arrive_in():
    sequential, _, _ = play(FakeShuffledEvaluator(seed=1), groups=3, overlap=False, stream_rounds=False)
    for seed in (2, 3):
        streamed, _, policy = play(FakeShuffledEvaluator(seed=seed), groups=3)
        assert streamed == sequential and len(policy.traces) == 1
    # early stop drops trajectories between rounds: still the same
    a, _, _ = play(FakeShuffledEvaluator(seed=4), groups=2, overlap=False, stream_rounds=False,
                   early_stop="first_correct")
    b, _, _ = play(FakeShuffledEvaluator(seed=5), groups=2, early_stop="first_correct")
    assert a == b


def test_open_stream_falls_back_to_one_call_per_request():
    policy = FakeBatchPolicy(chatml_tokenizer())
    assert isinstance(open_stream(policy, continuous=False), CallPerRequest)
    assert isinstance(open_stream(object.__new__(FakeInstantEvaluator)), CallPerRequest)    # no stream(): per call
    assert isinstance(open_stream(policy), FakeBatchStream)
