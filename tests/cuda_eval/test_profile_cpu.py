"""Profile feedback through the real judge and worker processes in CPU mode (real g++ builds): the profile is taken
after the verdict is complete and never changes it; a candidate that notices it is being profiled and crashes,
raises or hangs gains and loses nothing (its verdict is the one it gets without a profile, its feedback the plain
text, and the reason is logged and kept in meta)."""
import logging

import pytest

import corpus_index
from cuda_eval.api import EvalConfig, EvalRequest, Evaluator
from sandbox_fixtures import compile_pool, run_lock, shared_dir, toolchain  # noqa: F401  (the run's shared pool)

pytestmark = pytest.mark.slow

CPU = {c.name: c for c in corpus_index.load("cpu")}
SABOTEURS = {c.name: c for c in corpus_index.load("profile")}


def cpu_config(**kw) -> EvalConfig:
    base = dict(device_type="cpu", run_timeout_s=30, skip_run_on_static_flags=False, num_correct_trials=2,
                timing_target_s=0.05, timing_min_reps=5, timing_max_reps=20, timing_input_sets=2, spare_workers=1,
                retime_speedup_threshold=0, worker_memory_bytes=2 << 30, kernel_profile_timeout_s=5.0)
    base.update(kw)
    return EvalConfig(**base)


def request(cand, feedback: str) -> EvalRequest:
    return EvalRequest(cand.task, cand.task_source, cand.response, f"{feedback}:{cand.name}", feedback=feedback)


@pytest.fixture(scope="module")
def verdicts(compile_pool):  # noqa: F811
    cands = [CPU["honest_relu"], CPU["honest_row_sum"], *SABOTEURS.values()]
    with Evaluator(cpu_config(), compile_pool=compile_pool) as ev:
        results = ev.evaluate([request(c, mode) for c in cands for mode in ("kevin", "profile")])
    return {tuple(r.request_id.split(":", 1)): r for r in results}


def _score(r):
    return r.correct, [f["code"] for f in r.hack_flags], r.runtime_error, bool(r.speedup)


@pytest.mark.parametrize("name", ["honest_relu", "honest_row_sum", *sorted(SABOTEURS)])
def test_the_profile_never_changes_the_verdict(verdicts, name):
    plain, profiled = verdicts[("kevin", name)], verdicts[("profile", name)]
    assert _score(plain) == _score(profiled) == (True, [], None, True), (plain.runtime_error, profiled.hack_flags)
    assert "kernel_profile" not in plain.meta and "feedback" not in plain.meta
    assert profiled.meta["phase_s"].get("profile") is not None
    # the profile step comes after the final checks: the verdict was complete before it began
    phases = list(profiled.meta["phase_s"])
    assert phases.index("profile") > phases.index("final_checks")


def test_an_honest_candidate_gets_its_profile(verdicts):
    r = verdicts[("profile", "honest_relu")]
    prof = r.meta["kernel_profile"]
    assert not prof.get("error") and prof["device"]["type"] == "cpu" and prof["device"]["copy_gbps"] > 0
    fwd = prof["forward"]
    assert fwd["input_bytes"] == fwd["output_bytes"] == 128 * 512 * 4 and fwd["time_ms"] == r.timing["median_ms"]
    assert r.meta["feedback"] == "profile" and "feedback_fallback" not in r.meta
    assert r.feedback.startswith(verdicts[("kevin", "honest_relu")].feedback.split(" It runs in")[0])
    assert "Profile of one forward" in r.feedback and "- memory: your forward moves >= 524 KB" in r.feedback


@pytest.mark.parametrize("name,reason", [("exit_when_profiled", "the worker did not profile the candidate"),
                                         ("raise_when_profiled", "no profiling, please"),
                                         ("hang_when_profiled", "the worker did not profile the candidate")])
def test_a_failed_profile_gives_the_plain_text_and_a_reason(verdicts, name, reason):
    plain, profiled = verdicts[("kevin", name)], verdicts[("profile", name)]
    assert profiled.meta["kernel_profile"]["error"] and reason in profiled.meta["kernel_profile"]["error"]
    assert profiled.meta["feedback"] == "kevin" and reason in profiled.meta["feedback_fallback"]
    assert "Profile" not in profiled.feedback
    assert profiled.feedback.split(" It runs in")[0] == plain.feedback.split(" It runs in")[0]


def test_the_fallback_is_logged(compile_pool, caplog):  # noqa: F811
    with caplog.at_level(logging.INFO, logger="cuda_eval.orchestrator.evaluator"), \
            Evaluator(cpu_config(), compile_pool=compile_pool) as ev:
        r = ev.evaluate([request(SABOTEURS["raise_when_profiled"], "profile")])[0]
    assert r.correct and not r.hack_flags
    assert any("no profile in the feedback" in rec.getMessage() and "no profiling, please" in rec.getMessage()
               for rec in caplog.records)


def test_kernel_profile_collects_without_changing_the_text(compile_pool):  # noqa: F811
    """EvalConfig.kernel_profile (launch/eval.py --profile): profiles in meta, the feedback as asked."""
    with Evaluator(cpu_config(kernel_profile=True), compile_pool=compile_pool) as ev:
        r = ev.evaluate([request(CPU["honest_relu"], "kevin")])[0]
    assert r.correct and not r.meta["kernel_profile"].get("error") and "Profile" not in r.feedback
