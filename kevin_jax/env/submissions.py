"""The evaluator's work in flight, for the round loop of kevin_jax.env.episode: each group's answers handed over at
once (`Evaluations.submit`: cuda_eval.api's Evaluator.submit, a future per request; compiles on CPU workers, runs on
the GPU pool), and taken back when all of a batch's verdicts are in (`Evaluations.next_done`), each a plain dict; a
failed evaluation (the evaluator raised, or returned something that is not this request's verdict) becomes a failure
verdict, so nothing is lost. Also: the step's timings (PartTiming, StepTiming), the pipeline groups
(`split_groups`), and the GPU the sampler shares with the evaluator (`share_gpus_with_evaluator`: the sampler holds
the evaluator's device share around each device call, so that no kernel is timed while the policy samples).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from cuda_eval.api import INTERNAL_ERROR, EvalRequest, EvalResult

log = logging.getLogger(__name__)

# A wait for verdicts says so in the log at this interval (cold compiles take minutes: not a hang).
PROGRESS_EVERY_S = 30.0


@dataclasses.dataclass
class PartTiming:
    """When the stages of one group's round (a "part" of the step) happened, in seconds from the episode's start."""
    group: int
    round: int
    requests: int = 0
    sample_start: float = 0.0   # the policy call (with decoding and parsing of its answers)
    sample_end: float = 0.0
    submitted: float = 0.0      # the answers handed to the evaluator
    verdicts_in: float = 0.0    # the last verdict of the round arrived
    scored: float = 0.0         # turns recorded, the group's next prompts rendered
    failures: int = 0           # requests whose evaluation failed (they got a failure verdict)

    @property
    def sample_s(self) -> float:
        return self.sample_end - self.sample_start

    @property
    def evaluate_s(self) -> float:
        return self.verdicts_in - self.submitted


@dataclasses.dataclass
class StepTiming:
    """What the overlap bought. sampling_s: the policy busy (sum of its calls); evaluation_s: wall time with at least
    one evaluation outstanding; wall_s: the whole episode. wall_over_max is 1.0 for a perfect overlap, and
    (sampling + evaluation) / max(sampling, evaluation) for none."""
    wall_s: float
    sampling_s: float
    evaluation_s: float
    overlap: bool
    groups: int
    parts: list[PartTiming]

    @property
    def wall_over_max(self) -> float:
        return self.wall_s / max(self.sampling_s, self.evaluation_s, 1e-9)

    @property
    def failures(self) -> int:
        return sum(p.failures for p in self.parts)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "wall_over_max": self.wall_over_max}


def split_groups(items: Sequence[Any], groups: int) -> list[list[Any]]:
    """`items` in at most `groups` contiguous, non-empty runs whose sizes differ by at most one (in order)."""
    n = min(max(1, groups), len(items))
    bounds = [len(items) * g // n for g in range(n + 1)]
    return [list(items[bounds[g]:bounds[g + 1]]) for g in range(n)]


def interval_union(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def failed_verdict(request: EvalRequest, error: str, mode: str = "full", format_ok: bool = True) -> dict:
    """The verdict of a request whose evaluation failed (the evaluator raised, or returned something that is not a
    verdict of this request): an internal error, not the candidate's fault, scored 0 as cuda_eval's own internal
    errors are, with feedback that says the kernel was not judged."""
    result = EvalResult(
        request_id=request.request_id, task_id=request.task_id, mode=mode, format_ok=format_ok,
        runtime_error=f"{INTERNAL_ERROR}the evaluation failed: {error}",
        feedback="The evaluation of this program failed for a reason unrelated to its code (an internal evaluator "
                 "error); it was not judged.",
        meta={"internal_error": True, "evaluation_failed": error[:2000]})
    return result.to_dict()


class _Submitter:
    """Asynchronous evaluation: the evaluator's own `submit` (cuda_eval.api.Evaluator: a future per request), or, for
    an evaluator with only a blocking `evaluate` (test fakes), that call on one background thread."""

    def __init__(self, evaluator: Any):
        self.evaluator = evaluator
        self._submit = getattr(evaluator, "submit", None)
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None

    def submit(self, requests: list[EvalRequest]) -> list[concurrent.futures.Future]:
        if self._submit is not None:
            futures = list(self._submit(requests))
            if len(futures) != len(requests):
                raise RuntimeError(f"evaluator.submit returned {len(futures)} futures for {len(requests)} requests")
            return futures
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kevin-evaluate")
        futures = [concurrent.futures.Future() for _ in requests]
        batch = self._thread.submit(self.evaluator.evaluate, list(requests))

        def fan_out(done: concurrent.futures.Future) -> None:
            try:
                results = list(done.result())
                if len(results) != len(requests):
                    raise RuntimeError(f"evaluator.evaluate returned {len(results)} results for {len(requests)} "
                                       "requests")
            except BaseException as e:  # noqa: BLE001 - becomes each request's failure verdict
                for f in futures:
                    f.set_exception(e)
                return
            for f, r in zip(futures, results):
                f.set_result(r)
        batch.add_done_callback(fan_out)
        return futures

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)


@dataclasses.dataclass(eq=False)
class Submission:
    """One batch of requests in flight (a group's round), for `owner`; `verdicts` (plain dicts, one per request, in
    order) once all are in. Its times go into `timing`."""
    owner: Any
    requests: list[EvalRequest]
    timing: PartTiming
    futures: list[concurrent.futures.Future] = dataclasses.field(default_factory=list, repr=False)
    verdicts: list[dict] = dataclasses.field(default_factory=list)


class Evaluations:
    """Batches of requests in flight. `clock()` gives the times recorded in each batch's PartTiming (the episode's
    seconds); `mode` names the evaluator's mode in failure verdicts."""

    def __init__(self, evaluator: Any, mode: str = "full", clock: Callable[[], float] = time.perf_counter):
        self.mode = mode
        self.clock = clock
        self.in_flight = 0
        self._done: queue.SimpleQueue[Submission] = queue.SimpleQueue()
        self._submitter = _Submitter(evaluator)

    def submit(self, requests: list[EvalRequest], timing: PartTiming, owner: Any = None) -> Submission:
        """Hands the batch to the evaluator (a submission that raises gives each request a failure verdict)."""
        submission = Submission(owner, list(requests), timing)
        timing.submitted = self.clock()
        timing.requests = len(requests)
        try:
            submission.futures = self._submitter.submit(submission.requests)
        except Exception as e:  # noqa: BLE001 - every request of the batch gets a failure verdict
            submission.futures = [_failed_future(e) for _ in submission.requests]
        self.in_flight += 1
        remaining = [len(submission.futures)]
        lock = threading.Lock()

        def on_done(_future) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                timing.verdicts_in = self.clock()
                self._done.put(submission)
        if not submission.futures:
            timing.verdicts_in = self.clock()
            self._done.put(submission)
        for future in submission.futures:
            future.add_done_callback(on_done)
        return submission

    def next_done(self, block: bool) -> Submission | None:
        """A batch whose verdicts are all in, with `verdicts` filled; None when none is and block is False. A long
        wait says so in the log every PROGRESS_EVERY_S (cold compiles take minutes: not a hang)."""
        if not self.in_flight:
            return None
        if block:
            waited = time.perf_counter()
            while True:
                try:
                    submission = self._done.get(timeout=PROGRESS_EVERY_S)
                    break
                except queue.Empty:
                    log.info("waiting for %d evaluation(s) after %.0f s", self.in_flight,
                             time.perf_counter() - waited)
        else:
            try:
                submission = self._done.get_nowait()
            except queue.Empty:
                return None
        self.in_flight -= 1
        self._collect(submission)
        return submission

    def close(self) -> None:
        self._submitter.close()

    def _collect(self, submission: Submission) -> None:
        """The verdicts as plain dicts; a failed or malformed one becomes a failure verdict (nothing lost)."""
        verdicts, errors = [], []
        for request, future in zip(submission.requests, submission.futures):
            try:
                verdict = verdict_dict(future.result())
                if verdict.get("request_id") not in (None, "", request.request_id):
                    raise ValueError(f"a verdict for request {verdict.get('request_id')!r} came back for "
                                     f"{request.request_id!r}")
            except Exception as e:  # noqa: BLE001
                error = f"{type(e).__name__}: {e}"
                errors.append(error)
                verdict = failed_verdict(request, error, self.mode, format_ok=bool(request.response))
            verdicts.append(verdict)
        submission.verdicts = verdicts
        submission.timing.failures = len(errors)
        if errors:
            log.error("round %d, group %d: the evaluation of %d of %d answers failed (they get a failure verdict, "
                      "scored 0); first error: %s", submission.timing.round, submission.timing.group, len(errors),
                      len(verdicts), errors[0])


def _failed_future(error: BaseException) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(error)
    return future


def verdict_dict(verdict: Any) -> dict:
    """A verdict as the plain dict a Turn holds (EvalResult.to_dict(), or a copy of a mapping)."""
    if hasattr(verdict, "to_dict"):
        return verdict.to_dict()
    if isinstance(verdict, Mapping):
        return dict(verdict)
    raise TypeError(f"the evaluator returned a {type(verdict).__name__}, not a verdict")


# ---------------------------------------------------------------------------------------------------------------------
# The GPU shared by the sampler and the evaluator

def share_gpus_with_evaluator(policy: Any, evaluator: Any, gpus: Sequence[int]) -> list:
    """On `gpus` (indices that the sampler and the evaluator both use, kevin_jax.placement.shared_gpus), makes the
    sampler hold the evaluator's device share (cuda_eval.api.Evaluator.device_share) around each of its device calls
    (one prefill or decode call: SamplerEngine's device_guard), so that a kernel is never timed while the policy
    samples and timing waits at most one call (docs/LOG.md, "the GPU shared with a sampler: timing waits for one
    decode call"). Compiles (CPU) overlap with anything. Returns the shares held (empty: no guard); a DeviceShare's
    `waited_s` is the time the sampler waited for timings."""
    device_share = getattr(evaluator, "device_share", None)
    if not gpus or device_share is None:
        return []
    shares = [s for s in (device_share(g) for g in gpus) if not isinstance(s, contextlib.nullcontext)]
    if not shares:          # the evaluator runs nothing on a GPU (compile-only)
        return []
    engine = getattr(policy, "engine", None)
    if engine is None or not hasattr(engine, "device_guard"):
        log.warning("GPU(s) %s are shared with the evaluator but the policy (%s) has no device guard: kernel "
                    "timings may overlap its sampling; set env.overlap=False", list(gpus), type(policy).__name__)
        return []
    engine.device_guard = (lambda: shares[0]) if len(shares) == 1 else (lambda: _hold_all(shares))
    log.info("GPU(s) %s shared by the sampler and the evaluator: the sampler holds the evaluator's device share "
             "around each device call", list(gpus))
    return shares


@contextlib.contextmanager
def _hold_all(shares: Sequence[Any]):
    with contextlib.ExitStack() as stack:
        for share in shares:        # always the same order: no two holders wait for each other
            stack.enter_context(share)
        yield
