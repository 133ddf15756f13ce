"""cuda_eval.api: the pipeline around the pools (order, branches, reference-timing cache, re-timing), plain-data
results, configuration errors, no torch in the trainer process, and compile_only verdicts with the real nvcc."""
import concurrent.futures
import json
import logging
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from cuda_eval.api import EvalConfig, EvalRequest, EvalResult, Evaluator
from cuda_eval.orchestrator.devices import resolve_devices
from cuda_eval.orchestrator.evaluator import crash_message
from cuda_eval.orchestrator.gpu_pool import WorkerOutcome
from sandbox_fixtures import TEST_ARCH, compile_pool, run_lock, shared_dir, toolchain  # noqa: F401  (shared pool)

CORPUS = Path(__file__).parent / "corpus"
RELU_TASK = (CORPUS / "tasks" / "relu.py").read_text()
HONEST = (CORPUS / "honest" / "relu_basic.py").read_text()


def response(code: str) -> str:
    return f"<think>\nlet me write it\n</think>\nHere it is:\n```python\n{code}```\nSummary: a kernel."


class CompilePoolFake:
    """Compiles nothing: a program containing COMPILE_ERROR fails, everything else 'builds' one module."""

    def __init__(self):
        self.submitted = []

    def submit(self, task_source, code):
        self.submitted.append(code)
        f = concurrent.futures.Future()
        if "COMPILE_ERROR" in code:
            f.set_result(types.SimpleNamespace(ok=False, error_kind="compile_error", log="cuda_sources[0]:3: error: "
                                               "boom", modules=[], specs=[], timings={"wall_s": 0.5}, toolchain={}))
        else:
            f.set_result(types.SimpleNamespace(ok=True, error_kind=None, log="", timings={"wall_s": 0.25},
                                               modules=[{"name": "ext", "so_path": "/x.so", "spec_hash": "h",
                                                         "cache_hit": True, "spec_key": "k",
                                                         "kernels": ["_Z9my_kernelv"]}],
                                               specs=[{"cuda_sources": ["// __global__ void in_a_comment() {}\n"
                                                                        "__global__ void my_kernel() {}"]}],
                                               toolchain={"arch": "sm_90"}))
        return f

    def close(self):
        pass


class GpuPoolFake:
    """Answers each job with `script(payload)` -> WorkerOutcome."""

    def __init__(self, script):
        self.script = script
        self.payloads = []

    def submit(self, payload, timeout_s):
        self.payloads.append(payload)
        f = concurrent.futures.Future()
        f.set_result(self.script(payload))
        return f

    def close(self):
        pass


def worker_result(correct=True, cand_ms=1.0, ref_ms=2.0, flags=(), measured=True, **extra) -> dict:
    res = {"status": "ok", "internal_error": None, "correct": correct, "runtime_error": None,
           "trials": [{"trial": i, "passed": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "mismatch_frac": 0.0,
                       "message": None} for i in range(5)],
           "timing": {"median_ms": cand_ms, "mean_ms": cand_ms, "std_ms": 0.0, "min_ms": cand_ms, "n": 20},
           "ref_timing": {"median_ms": ref_ms, "mean_ms": ref_ms, "std_ms": 0.0, "min_ms": ref_ms, "n": 20},
           "ref_timing_measured": measured, "ref_timing_key": "H100 | torch | float32", "hack_flags": list(flags),
           "meta": {"gpu_name": "H100"}}
    res.update(extra)
    return res


def outcome(result=None, **kw) -> WorkerOutcome:
    base = dict(result=result, device="0", wall_s=1.5, queue_s=0.1, worker_info={"gpu_name": "H100",
                                                                                 "torch_version": "2.11"})
    base.update(kw)
    return WorkerOutcome(**base)


def make_evaluator(script, tmp_path, **cfg):
    config = EvalConfig(mode="full", ref_timing_cache_dir=str(tmp_path / "ref"), **cfg)
    return Evaluator(config, compile_pool=CompilePoolFake(), gpu_pool=GpuPoolFake(script))


class SlowGpuPoolFake(GpuPoolFake):
    """Answers each job `delay_s` later, from another thread, as the real pool does."""

    def __init__(self, script, delay_s):
        super().__init__(script)
        self.delay_s = delay_s

    def submit(self, payload, timeout_s):
        self.payloads.append(payload)
        f = concurrent.futures.Future()
        threading.Timer(self.delay_s, lambda: f.set_result(self.script(payload))).start()
        return f


def test_a_slow_batch_says_how_many_verdicts_are_in(tmp_path, caplog):
    config = EvalConfig(mode="full", ref_timing_cache_dir=str(tmp_path / "ref"))
    ev = Evaluator(config, compile_pool=CompilePoolFake(),
                   gpu_pool=SlowGpuPoolFake(lambda p: outcome(worker_result()), delay_s=0.5))
    with caplog.at_level(logging.INFO, logger="cuda_eval.orchestrator.evaluator"):
        results = ev.evaluate([EvalRequest("t", RELU_TASK, "no code here", "a"),
                               EvalRequest("t", RELU_TASK, response(HONEST), "b")], progress_every_s=0.1)
    assert [r.request_id for r in results] == ["a", "b"] and results[1].correct
    progress = [r.getMessage() for r in caplog.records if "verdicts after" in r.getMessage()]
    assert progress and progress[0].startswith("cuda_eval: 1 of 2 verdicts after")


def test_order_and_branches(tmp_path):
    ev = make_evaluator(lambda p: outcome(worker_result()), tmp_path)
    reqs = [EvalRequest("t", RELU_TASK, "no code here", "a"),
            EvalRequest("t", RELU_TASK, response(HONEST), "b"),
            EvalRequest("t", RELU_TASK, response(HONEST.replace("__global__", "__global__ COMPILE_ERROR")), "c"),
            EvalRequest("t", RELU_TASK, response(HONEST.replace("return relu_ext.relu_cuda(x)",
                                                                "return torch.relu(x)")), "d")]
    results = ev.evaluate(reqs)
    assert [r.request_id for r in results] == ["a", "b", "c", "d"]
    a, b, c, d = results
    assert not a.format_ok and "no ```python code block" in a.format_error and a.compiled is None
    assert b.correct and b.speedup == pytest.approx(2.0) and not b.hack_flags and "2.00x" in b.feedback
    assert c.compiled is False and "boom" in c.compile_log and c.correct is None
    assert d.hack_flags[0]["code"] == "torch_in_forward" and d.compiled is None  # rejected before compiling
    assert len(ev.compile_pool.submitted) == 2 and len(ev.gpu_pool.payloads) == 1
    payload = ev.gpu_pool.payloads[0]
    # the kernels of the built binary (mangled and as a trace shows them), not the names its source mentions
    assert payload["kernel_names"] == ["_Z9my_kernelv", "my_kernel()"] and payload["config"]["num_trials"] == 5
    for r in results:
        assert set(r.stage_times) >= {"extract", "queue", "compile", "run", "total"}
        again = EvalResult.from_dict(json.loads(json.dumps(r.to_dict())))
        assert again == r


@pytest.mark.parametrize("share", [True, False])
def test_identical_programs_in_a_batch_share_one_verdict(tmp_path, share):
    ev = make_evaluator(lambda p: outcome(worker_result()), tmp_path, share_identical=share)
    other_task = RELU_TASK.replace("torch.relu(x)", "torch.relu(x) + 0")
    reqs = [EvalRequest("t", RELU_TASK, response(HONEST), "a"),
            EvalRequest("t", RELU_TASK, "other prose\n```python\n" + HONEST + "```", "b"),  # same program
            EvalRequest("u", other_task, response(HONEST), "c"),                             # another task
            EvalRequest("t", RELU_TASK, "no code here", "d"),
            EvalRequest("t", RELU_TASK, "no code here", "e")]
    a, b, c, d, e = ev.evaluate(reqs)
    assert [r.request_id for r in (a, b, c, d, e)] == ["a", "b", "c", "d", "e"]
    assert a.correct and b.correct and c.correct and b.speedup == a.speedup
    assert not d.format_ok and not e.format_ok and "shared_with" not in d.meta | e.meta
    if share:
        assert len(ev.compile_pool.submitted) == 2 and len(ev.gpu_pool.payloads) == 2
        assert b.meta["shared_with"] == "a" and b.stage_times["run"] == 0.0 and a.stage_times["run"] > 0
        assert "shared_with" not in a.meta and "shared_with" not in c.meta
    else:
        assert len(ev.compile_pool.submitted) == 3 and len(ev.gpu_pool.payloads) == 3
        assert "shared_with" not in b.meta


def test_a_shared_verdict_follows_its_primary_across_threads(tmp_path):
    ev = Evaluator(EvalConfig(mode="full", ref_timing_cache_dir=str(tmp_path / "ref")),
                   compile_pool=CompilePoolFake(),
                   gpu_pool=SlowGpuPoolFake(lambda p: outcome(worker_result(cand_ms=0.5)), delay_s=0.2))
    results = ev.evaluate([EvalRequest("t", RELU_TASK, response(HONEST), str(i)) for i in range(6)])
    assert [r.request_id for r in results] == [str(i) for i in range(6)]
    assert all(r.correct and r.speedup == pytest.approx(4.0) for r in results)
    assert [r.meta.get("shared_with") for r in results] == [None] + ["0"] * 5


def test_reference_timing_cache_is_filled_and_reused(tmp_path):
    ev = make_evaluator(lambda p: outcome(worker_result(measured=not p["ref_timing_cache"])), tmp_path)
    first = ev.evaluate([EvalRequest("t", RELU_TASK, response(HONEST), "1")])[0]
    assert first.meta["ref_timing_cached"] is False
    second = ev.evaluate([EvalRequest("t", RELU_TASK, response(HONEST), "2")])[0]
    assert ev.gpu_pool.payloads[1]["ref_timing_cache"] == {"H100 | torch | float32": first.ref_timing}
    assert second.meta["ref_timing_cached"] is True
    # on disk: a new evaluator (new process) sees it too
    ev2 = make_evaluator(lambda p: outcome(worker_result(measured=False)), tmp_path)
    ev2.evaluate([EvalRequest("t", RELU_TASK, response(HONEST), "3")])
    assert ev2.gpu_pool.payloads[0]["ref_timing_cache"]


@pytest.mark.parametrize("fresh_ms,flagged", [(5.0, True), (1.1, False)])
def test_large_speedups_are_retimed_in_a_fresh_process(tmp_path, fresh_ms, flagged):
    def script(payload):
        if payload["kind"] == "retime":
            return outcome(worker_result(cand_ms=fresh_ms, ref_ms=20.0))
        return outcome(worker_result(cand_ms=1.0, ref_ms=20.0))

    ev = make_evaluator(script, tmp_path, retime_speedup_threshold=5.0)
    r = ev.evaluate([EvalRequest("t", RELU_TASK, response(HONEST), "x")])[0]
    assert [p["kind"] for p in ev.gpu_pool.payloads] == ["evaluate", "retime"]
    assert r.meta["retime"]["first_speedup"] == pytest.approx(20.0)
    if flagged:
        assert r.hack_flags[0]["code"] == "speedup_not_reproduced" and "fell to 4.0x" in r.hack_flags[0]["reason"]
    else:
        assert not r.hack_flags and r.speedup == pytest.approx(20.0 / 1.1)


def test_crash_outcomes_become_clear_runtime_errors(tmp_path):
    cases = {
        "sig": outcome(None, signal=11, progress={"phase": "correctness", "trial": 1}, stderr_tail="Fatal Python "
                       "error: Segmentation fault\n  File \"<candidate>\", line 9 in forward"),
        "hang": outcome(None, timed_out=True, wall_s=30.0, progress={"phase": "timing"}),
        "exit": outcome(None, exit_code=7, progress={"phase": "correctness", "trial": 0}),
    }
    ev = make_evaluator(lambda p: cases[p["code"].split("# case: ")[1].split()[0]], tmp_path)
    reqs = [EvalRequest("t", RELU_TASK, response(f"# case: {k}\n" + HONEST), k) for k in cases]
    sig, hang, code = ev.evaluate(reqs)
    assert "SIGSEGV while checking correctness (trial 2)" in sig.runtime_error and "line 9" in sig.runtime_error
    assert "timed out after 30 s while timing" in hang.runtime_error
    assert "exited with code 7" in code.runtime_error
    for r in (sig, hang, code):
        assert r.correct is False and "failed at run time" in r.feedback and r.meta["crash"]


def test_worker_internal_error_is_not_the_candidates_fault(tmp_path):
    ev = make_evaluator(lambda p: outcome({"status": "internal_error", "internal_error": "KeyError: x"}), tmp_path)
    r = ev.evaluate([EvalRequest("t", RELU_TASK, response(HONEST), "x")])[0]
    assert r.meta["internal_error"] and "not the candidate's fault" in r.runtime_error


def test_flags_from_the_worker_reject_correct_results(tmp_path):
    flag = {"code": "cached_output", "reason": "after the inputs were overwritten in place, the output did not follow"}
    ev = make_evaluator(lambda p: outcome(worker_result(flags=[flag])), tmp_path)
    r = ev.evaluate([EvalRequest("t", RELU_TASK, response(HONEST), "x")])[0]
    assert r.correct and r.hack_flags == [flag] and "rejected (score 0)" in r.feedback
    assert "meta" in r.to_dict() and "retime" not in r.meta


def test_config_errors():
    with pytest.raises(TypeError):
        EvalConfig(bogus=1)
    with pytest.raises(ValueError, match="mode"):
        EvalConfig(mode="sometimes")
    with pytest.raises(ValueError, match="static_policy"):
        EvalConfig(static_policy="lenient")
    with pytest.raises(ValueError, match="unknown fields"):
        EvalResult.from_dict({"request_id": "x", "task_id": "t", "mode": "full", "format_ok": True, "extra": 1})
    assert resolve_devices("all", 2) == [0, 1] and resolve_devices("1", 2) == [1] and resolve_devices([0], 1) == [0]
    with pytest.raises(ValueError, match="do not exist"):
        resolve_devices("3", 2)


def test_crash_message_names_signals():
    assert "SIGKILL" in crash_message(outcome(None, signal=9)) and "out of memory" in crash_message(outcome(None, signal=9))


def test_importing_the_api_does_not_import_torch():
    code = "import sys, cuda_eval.api; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.nvcc
@pytest.mark.slow
def test_compile_only_verdicts_with_real_nvcc(compile_pool):  # noqa: F811  (the run's shared pool, TEST_ARCH)
    bad = (CORPUS / "bad" / "compile_error.py").read_text()
    with Evaluator(EvalConfig(mode="compile_only"), compile_pool=compile_pool) as ev:
        ok, broken = ev.evaluate([EvalRequest("L1/relu", RELU_TASK, response(HONEST), "ok"),
                                  EvalRequest("L1/relu", RELU_TASK, response(bad), "bad")])
    assert ok.mode == "compile_only" and ok.compiled is True and ok.correct is None and ok.speedup is None
    assert "not run" in ok.feedback and ok.meta["arch"] == TEST_ARCH
    assert broken.compiled is False and broken.correct is None
    assert "cuda_sources" in broken.compile_log and "error" in broken.compile_log
    assert broken.feedback.startswith("Your kernel failed to compile")
    json.dumps(ok.to_dict())
    json.dumps(broken.to_dict())


def test_reference_timing_cache_on_disk(tmp_path):
    from cuda_eval.orchestrator.ref_timing import ReferenceTimingCache, task_hash
    assert task_hash("a = 1  \r\nb = 2\n") == task_hash("a = 1\nb = 2")
    assert task_hash("a = 1") != task_hash("a = 2")
    one, two = ReferenceTimingCache(str(tmp_path)), ReferenceTimingCache(str(tmp_path))
    one.store("ab12", "H100 | fp32", {"median_ms": 1.0})
    two.store("ab12", "H200 | fp32", {"median_ms": 0.8})
    assert ReferenceTimingCache(str(tmp_path)).entries("ab12") == {"H100 | fp32": {"median_ms": 1.0},
                                                                   "H200 | fp32": {"median_ms": 0.8}}
    # a damaged file (an entry that is not a timing) loses that entry only, never the task's evaluations
    path = ReferenceTimingCache(str(tmp_path))._path("ab12")
    with open(path) as f:
        on_disk = json.load(f)
    with open(path, "w") as f:
        json.dump({**on_disk, "broken": 3, "also": [1]}, f)
    assert ReferenceTimingCache(str(tmp_path)).entries("ab12") == on_disk
    memory = ReferenceTimingCache(None)
    memory.store("cd", "k", {"median_ms": 2.0})
    assert memory.entries("cd") == {"k": {"median_ms": 2.0}} and memory.entries("ef") == {}


def test_gpu_indices_follow_our_visible_devices(monkeypatch):
    from cuda_eval.orchestrator.gpu_pool import _physical_device
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert _physical_device("1") == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _physical_device("1") == "1"


def test_spare_workers_auto_scales_with_the_cores_per_device():
    from cuda_eval.api import auto_spare_workers
    assert auto_spare_workers(1, 16) == 8          # one H200 machine: 16 cores
    assert auto_spare_workers(4, 64) == 8
    assert auto_spare_workers(8, 16) == 2          # never fewer than 2 (the old default)
    assert auto_spare_workers(1, 2) == 2           # CI
    assert auto_spare_workers(1, 256) == 8         # each spare holds a CUDA context: capped
    with pytest.raises(ValueError, match="spare_workers"):
        EvalConfig(spare_workers=-1)


def test_the_compile_pool_builds_with_the_phases_and_headers_the_config_asks_for(monkeypatch):
    """EvalConfig.compile_parallel_phases reaches the compile pool (a host short of memory builds each candidate's
    host and device chains one after the other: ~2.1 GiB a build, not ~4.3), and compile_pch_at_start builds the
    precompiled headers of the default and -O3 flag sets when the evaluator starts, not beside a build later."""
    from cuda_eval.compile import pool as compile_pool
    made, warmed = [], []

    class RecordingPool:                       # a test fake: records the config and the warm() calls, builds nothing
        def __init__(self, config):
            made.append(config)

        def warm(self, extra_cflags=()):
            warmed.append((len(made), tuple(extra_cflags)))
            return True
    monkeypatch.setattr(compile_pool, "CompilePool", RecordingPool)
    for parallel, at_start in ((True, False), (False, True)):
        evaluator = Evaluator.__new__(Evaluator)
        evaluator.config = EvalConfig(compile_parallel_phases=parallel, compile_pch_at_start=at_start)
        evaluator.arch = "sm_90"
        evaluator._make_compile_pool()
    assert [c.parallel_phases for c in made] == [True, False]
    assert warmed == [(2, ()), (2, ("-O3",))]
