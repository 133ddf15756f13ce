"""The overlapped round loop (kevin_jax/env/episode.py, kevin_jax/env/submissions.py): the same trajectories as the
sequential runner whatever order the verdicts come back in, generation really overlapping evaluation (shown by event
order, not wall-clock bounds), failed evaluations kept as clear verdicts, and the sampler's device guard on a GPU
shared with the evaluator. Fakes are named Fake...; all on the CPU, in seconds."""
import concurrent.futures
import contextlib
import logging
import re
import threading
import time

import numpy as np
import pytest
from kevin_env_fakes import chatml_tokenizer, judge_by_marker, scripted_answer

from cuda_eval.api import EvalResult
from kevin_jax.env.episode import EnvConfig, EpisodeRunner, round_seed
from kevin_jax.env.policy import Generation
from kevin_jax.reward import RewardConfig
from kevin_jax.env.submissions import interval_union, share_gpus_with_evaluator, split_groups
from kevin_jax.tasks import builtin_solutions, load_builtin_tasks

TASKS = load_builtin_tasks()
TASK_IDS = ["L1/1_LeakyReLU", "L1/2_GELU_tanh_", "L2/6_Gemm_ScaledSigmoid_Sum", "L1/6_LayerNorm"]
SOLUTIONS = {(s.task_id, s.kind): s.source for s in builtin_solutions()}


def tasks(n=len(TASK_IDS)):
    by_id = TASKS.by_id()
    return [by_id[i] for i in TASK_IDS[:n]]


def verdict_of(request) -> EvalResult:
    fields = {"mode": "full", "format_ok": True, "compiled": True, "correct": True, "speedup": 1.0,
              **judge_by_marker(request)}
    return EvalResult(request_id=request.request_id, task_id=request.task_id, **fields)


class FakeSeededPolicy:
    """A policy whose answers depend on (seed, index in the call, prompt): per answer a draw picks the task's wrong
    solution, its correct one at a drawn speedup, or one that does not compile. Optionally sleeps per call, and
    records when each call started and ended."""

    def __init__(self, tokenizer, sleep_s=0.0):
        self.tok = tokenizer
        self.sleep_s = sleep_s
        self.calls = []
        self.started = threading.Condition()
        self.count = 0

    def generate(self, prompts, max_new_tokens, seed):
        with self.started:
            self.count += 1
            self.started.notify_all()
        t0 = time.perf_counter()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        out = []
        for i, prompt in enumerate(prompts):
            text = self.tok.decode(list(prompt), skip_special_tokens=False)
            task = next(t for t in TASKS.tasks if t.source.strip() in text)
            turn = len(re.findall(r"^Attempt \d+:$", text, re.MULTILINE))
            rng = np.random.default_rng([seed, i, len(prompt)])
            kind = ("wrong", "correct", "correct", "broken")[rng.integers(4)]
            code = SOLUTIONS[(task.task_id, "wrong" if kind == "wrong" else "correct")]
            if kind == "broken":
                code += "\n# COMPILE_ERROR"
            answer = scripted_answer(code, thought=f"turn {turn} draw {rng.integers(1000)}",
                                     summary=f"try {turn}, SPEEDUP={rng.uniform(0.5, 3):.2f}")
            ids = self.tok(answer, add_special_tokens=False)["input_ids"] + [self.tok.convert_tokens_to_ids(
                "<|im_end|>")]
            out.append(Generation(ids, [float(x) for x in -rng.random(len(ids))], "eos"))
        self.calls.append({"seed": seed, "n": len(prompts), "start": t0, "end": time.perf_counter()})
        return out


class FakeShuffledEvaluator:
    """cuda_eval's asynchronous face (`submit`: a future per request) with every verdict arriving after its own
    random delay, so verdicts come back out of order, across requests and across submissions."""
    mode = "full"

    def __init__(self, max_delay_s=0.03, seed=0):
        self.rng = np.random.default_rng(seed)
        self.max_delay_s = max_delay_s
        self.arrivals = []
        self.lock = threading.Lock()

    def submit(self, requests):
        futures = []
        for r in requests:
            f = concurrent.futures.Future()

            def arrive(f=f, r=r):
                with self.lock:
                    self.arrivals.append(r.request_id)
                f.set_result(verdict_of(r))
            timer = threading.Timer(float(self.rng.uniform(0, self.max_delay_s)), arrive)
            timer.daemon = True
            timer.start()
            futures.append(f)
        return futures

    def evaluate(self, requests):
        return [f.result() for f in self.submit(requests)]


def runner(policy, evaluator, **env):
    config = EnvConfig(**{"num_turns": 3, "num_trajectories": 3, "max_prompt_tokens": 200_000,
                          "max_response_tokens": 100_000, **env})
    return EpisodeRunner(policy, evaluator, chatml_tokenizer(), config, RewardConfig())


def run_dicts(overlap, groups, evaluator=None, **env):
    policy = FakeSeededPolicy(chatml_tokenizer())
    evaluator = evaluator or FakeShuffledEvaluator(seed=int(overlap) + 10 * groups)
    result = runner(policy, evaluator, overlap=overlap, pipeline_groups=groups, **env).run(tasks(), step=5, seed=3)
    return [t.to_dict() for t in result.trajectories], result, policy, evaluator


# ------------------------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("groups,early_stop", [(2, "never"), (3, "never"), (4, "first_correct"),
                                               (2, "no_improvement")])
def test_overlapped_runner_gives_the_sequential_runners_trajectories(groups, early_stop):
    sequential, seq_result, seq_policy, _ = run_dicts(False, groups, early_stop=early_stop)
    overlapped, result, policy, evaluator = run_dicts(True, groups, early_stop=early_stop)
    assert overlapped == sequential                                   # tokens, prompts, verdicts, scores, ids
    # the draws differ between answers: the comparison is not between identical trajectories
    assert len({t["turns"][0]["response_text"] for t in sequential}) > 3
    assert sorted((c["seed"], c["n"]) for c in policy.calls) == sorted((c["seed"], c["n"]) for c in seq_policy.calls)
    submitted = [f"step5/{t['task_id']}/traj{t['traj_index']}/turn{turn['turn']}" for t in sequential
                 for turn in t["turns"]]
    assert sorted(evaluator.arrivals) == sorted(submitted) and evaluator.arrivals != submitted   # out of order
    assert [(r.round, r.live) for r in result.rounds] == [(r.round, r.live) for r in seq_result.rounds]


def test_the_group_count_changes_the_draws_the_overlap_never_does():
    one = run_dicts(False, 1)[0]
    two = run_dicts(True, 2)[0]
    assert [t["turns"][0]["prompt_tokens"] for t in one] == [t["turns"][0]["prompt_tokens"] for t in two]
    # group 0 (the first two tasks) keeps the one-group seed: its first turns are the same draws
    assert [t["turns"][0]["response_tokens"] for t in one[:6]] == [t["turns"][0]["response_tokens"] for t in two[:6]]
    assert [t["turns"][0]["response_tokens"] for t in one[6:]] != [t["turns"][0]["response_tokens"] for t in two[6:]]


# ------------------------------------------------------------------------------------------------ overlap
class FakeGatedEvaluator:
    """Holds the verdicts of the k-th submission until the policy has started its (k+2)-th call (or every call it
    will make): only a runner that samples while an evaluation is outstanding gets them without waiting. A gate
    that had to time out is recorded."""
    mode = "full"

    def __init__(self, policy, total_calls, timeout_s):
        self.policy, self.total_calls, self.timeout_s = policy, total_calls, timeout_s
        self.submissions = 0
        self.timed_out = []

    def submit(self, requests):
        k = self.submissions
        self.submissions += 1
        futures = [concurrent.futures.Future() for _ in requests]

        def release():
            with self.policy.started:
                ok = self.policy.started.wait_for(
                    lambda: self.policy.count >= min(k + 2, self.total_calls), timeout=self.timeout_s)
            if not ok:
                self.timed_out.append(k)
            for f, r in zip(futures, requests):
                f.set_result(verdict_of(r))
        threading.Thread(target=release, daemon=True).start()
        return futures


def test_the_next_group_is_sampled_while_an_evaluation_is_outstanding():
    policy = FakeSeededPolicy(chatml_tokenizer())
    evaluator = FakeGatedEvaluator(policy, total_calls=6, timeout_s=60)
    result = runner(policy, evaluator, pipeline_groups=2).run(tasks(), step=1, seed=0)
    assert evaluator.timed_out == [] and len(policy.calls) == 6
    parts = result.timing.parts
    for earlier, later in zip(parts, parts[1:]):     # every policy call but the first began before the evaluation
        assert later.sample_start < earlier.verdicts_in   # of the part before it was in (scoring order)
    # the sequential runner cannot: each of its gates waits in vain (short timeout here)
    policy = FakeSeededPolicy(chatml_tokenizer())
    evaluator = FakeGatedEvaluator(policy, total_calls=6, timeout_s=0.2)
    runner(policy, evaluator, pipeline_groups=2, overlap=False).run(tasks(), step=1, seed=0)
    assert evaluator.timed_out == [0, 1, 2, 3, 4]


class FakeSlowEvaluator:
    """Takes `seconds` per submitted batch (one thread per batch, so batches can run side by side)."""
    mode = "full"

    def __init__(self, seconds):
        self.seconds = seconds

    def submit(self, requests):
        futures = [concurrent.futures.Future() for _ in requests]

        def work():
            time.sleep(self.seconds)
            for f, r in zip(futures, requests):
                f.set_result(verdict_of(r))
        threading.Thread(target=work, daemon=True).start()
        return futures


def test_overlapped_step_costs_less_than_sampling_plus_evaluation():
    """Policy and evaluator take T each per part (2 groups x 3 rounds). The step's own timestamps show it: the
    sequential runner's sampling and evaluation intervals are disjoint (wall >= their sum); in the overlapped one, the
    second group's policy call starts as soon as the first group's answers are submitted, so they overlap by about T
    at least (later pairs overlap too, less on a loaded machine where scoring and rendering the next prompts take
    longer than T: hence no tighter bound)."""
    T = 0.4
    timings = {}
    for overlap in (False, True):
        policy = FakeSeededPolicy(chatml_tokenizer(), sleep_s=T)
        result = runner(policy, FakeSlowEvaluator(T), pipeline_groups=2, overlap=overlap,
                        num_trajectories=2).run(tasks(2), 1, 0)
        timings[overlap] = result.timing
    seq, ovl = timings[False], timings[True]
    assert seq.sampling_s >= 6 * T and seq.evaluation_s >= 6 * T
    assert seq.wall_s >= seq.sampling_s + seq.evaluation_s
    assert ovl.sampling_s >= 6 * T and ovl.evaluation_s >= 3 * T
    # sampling and evaluation together cover clearly less wall time than their sum: they overlapped
    busy = interval_union([(p.sample_start, p.sample_end) for p in ovl.parts]
                          + [(p.submitted, p.verdicts_in) for p in ovl.parts])
    assert busy <= ovl.sampling_s + ovl.evaluation_s - 0.5 * T and ovl.wall_s >= busy
    part = {(p.group, p.round): p for p in ovl.parts}
    first, second = part[0, 0], part[1, 0]                                 # g0 r0 evaluated while g1 r0 sampled
    assert first.submitted <= second.sample_start < first.verdicts_in
    assert min(first.verdicts_in, second.sample_end) - second.sample_start >= 0.5 * T


# ------------------------------------------------------------------------------------------------ failures
class FakeFailingEvaluator:
    """Fails some requests, by their id (so that both runners see the same failures): traj1 turn 0 -> the future
    raises; traj2 turn 1 -> None instead of a verdict; traj0 turn 2 -> a verdict for another request. With
    fail_submit, the first submission raises outright; with only_evaluate, it has no `submit`."""
    mode = "full"

    def __init__(self, fail_submit=False, fail_all=False):
        self.fail_submit, self.fail_all = fail_submit, fail_all
        self.submissions = 0

    def submit(self, requests):
        self.submissions += 1
        if self.fail_submit and self.submissions == 1:
            raise ConnectionError("compile pool is gone")
        futures = []
        for r in requests:
            f = concurrent.futures.Future()
            if self.fail_all or r.request_id.endswith("traj1/turn0"):
                f.set_exception(RuntimeError("GPU pool lost the worker"))
            elif r.request_id.endswith("traj2/turn1"):
                f.set_result(None)
            elif r.request_id.endswith("traj0/turn2"):
                f.set_result(EvalResult(request_id="someone/else", task_id=r.task_id, mode="full", format_ok=True,
                                        correct=True, speedup=9.0))
            else:
                f.set_result(verdict_of(r))
            futures.append(f)
        return futures


def test_a_failed_evaluation_loses_nothing_and_gets_a_clear_verdict(caplog):
    with caplog.at_level(logging.ERROR):
        trajs, result, _, _ = run_dicts(True, 2, evaluator=FakeFailingEvaluator())
    sequential = run_dicts(False, 2, evaluator=FakeFailingEvaluator())[0]
    assert trajs == sequential
    assert [len(t["turns"]) for t in trajs] == [3] * 12                       # every turn of every trajectory
    failed = {(t["task_id"], t["traj_index"], turn["turn"]): turn for t in trajs for turn in t["turns"]
              if turn["verdict"]["meta"].get("internal_error")}
    assert sorted(k[1:] for k in failed) == sorted([(1, 0)] * 4 + [(2, 1)] * 4 + [(0, 2)] * 4)
    for (task_id, traj, turn_index), turn in failed.items():
        v = turn["verdict"]
        assert v["request_id"] == f"step5/{task_id}/traj{traj}/turn{turn_index}" and v["task_id"] == task_id
        assert v["runtime_error"].startswith("internal evaluator error (not the candidate's fault): the evaluation "
                                             "failed: ")
        assert v["correct"] is None and turn["score"] == 0.0 and "not judged" in v["feedback"]
    by_key = {(t["task_id"], t["traj_index"]): t for t in trajs}
    assert "RuntimeError: GPU pool lost the worker" in failed[(TASK_IDS[0], 1, 0)]["verdict"]["runtime_error"]
    assert "TypeError: the evaluator returned a NoneType" in failed[(TASK_IDS[0], 2, 1)]["verdict"]["runtime_error"]
    assert "'someone/else' came back" in failed[(TASK_IDS[0], 0, 2)]["verdict"]["runtime_error"]
    # the model is told, in its next prompt, that the attempt was not judged
    nxt = chatml_tokenizer().decode(by_key[(TASK_IDS[0], 1)]["turns"][1]["prompt_tokens"])
    assert "it was not judged" in nxt
    assert result.timing.failures == 12 and "evaluation of 2 of 6 answers failed" in caplog.text


def test_a_submission_that_raises_or_an_evaluate_only_evaluator_that_raises_fails_its_part_only():
    trajs, result, _, _ = run_dicts(True, 2, evaluator=FakeFailingEvaluator(fail_submit=True))
    first_part = [t for t in trajs if t["task_id"] in TASK_IDS[:2]]
    assert all("ConnectionError: compile pool is gone" in t["turns"][0]["verdict"]["runtime_error"]
               for t in first_part)
    assert all(len(t["turns"]) == 3 for t in trajs) and result.timing.failures == 6 + 2 + 4 + 4

    class FakeEvaluateOnly:
        mode = "full"

        def __init__(self):
            self.calls = 0

        def evaluate(self, requests):
            self.calls += 1
            if self.calls == 2:
                raise OSError("worker socket closed")
            return [verdict_of(r) for r in requests]
    trajs, result, _, _ = run_dicts(True, 2, evaluator=FakeEvaluateOnly())
    assert result.timing.failures == 6 and all(len(t["turns"]) == 3 for t in trajs)
    assert sum("OSError: worker socket closed" in (turn["verdict"]["runtime_error"] or "")
               for t in trajs for turn in t["turns"]) == 6


def test_an_evaluator_that_fails_everything_stops_the_step():
    with pytest.raises(RuntimeError, match="failed on all 36 requests"):
        run_dicts(True, 2, evaluator=FakeFailingEvaluator(fail_all=True))


def test_a_policy_error_propagates_and_in_flight_evaluations_are_left_to_finish():
    class FakeBrokenPolicy(FakeSeededPolicy):
        def generate(self, prompts, max_new_tokens, seed):
            if self.count == 2:
                raise ValueError("sampler out of memory")
            return super().generate(prompts, max_new_tokens, seed)
    with pytest.raises(ValueError, match="sampler out of memory"):
        runner(FakeBrokenPolicy(chatml_tokenizer()), FakeShuffledEvaluator()).run(tasks(), 1, 0)


# ------------------------------------------------------------------------------------------------ plumbing
def test_split_groups_and_interval_union():
    assert split_groups(list("abcde"), 2) == [["a", "b"], ["c", "d", "e"]]
    assert split_groups(list("abc"), 5) == [["a"], ["b"], ["c"]]
    assert split_groups(list("abcd"), 1) == [list("abcd")]
    assert [len(g) for g in split_groups(list(range(10)), 4)] == [2, 3, 2, 3]
    assert interval_union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == pytest.approx(4.0)
    assert interval_union([]) == 0.0
    assert round_seed(1, 2, 3) == round_seed(1, 2, 3, 0) != round_seed(1, 2, 3, 1)


class FakeShare:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __enter__(self):
        self.log.append(("enter", self.name))

    def __exit__(self, *exc):
        self.log.append(("exit", self.name))


class FakeSharingEvaluator:
    def __init__(self, compile_only=False):
        self.compile_only = compile_only
        self.log = []

    def device_share(self, gpu):
        return contextlib.nullcontext() if self.compile_only else FakeShare(gpu, self.log)


class FakeEnginePolicy:
    def __init__(self):
        self.engine = type("FakeEngine", (), {"device_guard": contextlib.nullcontext})()


def test_the_sampler_holds_the_evaluators_device_share_on_shared_gpus(caplog):
    policy, evaluator = FakeEnginePolicy(), FakeSharingEvaluator()
    assert share_gpus_with_evaluator(policy, evaluator, [0])
    with policy.engine.device_guard():
        pass
    assert evaluator.log == [("enter", 0), ("exit", 0)]
    policy, evaluator = FakeEnginePolicy(), FakeSharingEvaluator()
    assert share_gpus_with_evaluator(policy, evaluator, [1, 0])
    with policy.engine.device_guard():
        pass
    assert evaluator.log == [("enter", 1), ("enter", 0), ("exit", 0), ("exit", 1)]
    # nothing shared, a compile-only evaluator, an evaluator fake without shares: no guard
    for gpus, ev in (([], FakeSharingEvaluator()), ([0], FakeSharingEvaluator(compile_only=True)),
                     ([0], FakeShuffledEvaluator())):
        policy = FakeEnginePolicy()
        assert not share_gpus_with_evaluator(policy, ev, gpus)
        assert policy.engine.device_guard is contextlib.nullcontext
    with caplog.at_level(logging.WARNING):
        assert not share_gpus_with_evaluator(object(), FakeSharingEvaluator(), [0])
    assert "env.overlap=False" in caplog.text
