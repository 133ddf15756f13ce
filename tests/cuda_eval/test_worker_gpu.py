"""The evaluator on a real GPU: bad inputs (hang, illegal address, OOM, segfault, os._exit, wrong type/shape/values,
exceptions, compile errors) each get a clear verdict and the next candidate runs normally on the same GPU; the timing
protocol, the reference-timing cache, the kernel trace, dtypes and training-mode semantics work."""
import tempfile

import pytest

import corpus_index
from cuda_eval.api import EvalConfig, Evaluator

pytestmark = pytest.mark.gpu

BAD = {c.name: c for c in corpus_index.load("bad")}
HONEST = {c.name: c for c in corpus_index.load("honest")}
CRASHING = ["hang_in_kernel", "illegal_address", "out_of_memory", "host_segfault", "os_exit"]


@pytest.fixture(scope="module")
def gpu_ev():
    with tempfile.TemporaryDirectory() as ref_dir, \
            Evaluator(EvalConfig(devices="0", run_timeout_s=20, ref_timing_cache_dir=ref_dir)) as ev:
        yield ev


def verdict_ok(cand, r) -> bool:
    err = r.runtime_error or ""
    return {
        "timeout": r.correct is False and "timed out" in err,
        "runtime_error": r.correct is False and bool(err) and not r.meta.get("crash"),
        "crash": r.correct is False and bool(r.meta.get("crash")),
        "incorrect": r.correct is False and not err and bool(r.trials),
        "compile_error": r.compiled is False and "error" in r.compile_log,
    }[cand.verdict]


def test_gpu_keeps_working_after_each_crash(gpu_ev):
    """One GPU, requests one after the other: each good candidate runs right after the bad one before it."""
    problems = []
    results = {}
    for name in CRASHING:
        bad = gpu_ev.evaluate([corpus_index.request(BAD[name])])[0]
        good = gpu_ev.evaluate([corpus_index.request(HONEST["relu_basic"], f"after {name}")])[0]
        results[name] = bad
        if not verdict_ok(BAD[name], bad):
            problems.append(f"{name}: expected {BAD[name].verdict}, got correct={bad.correct} "
                            f"error={(bad.runtime_error or '')[:300]!r}")
        if not (good.correct and not good.hack_flags and good.speedup):
            problems.append(f"good candidate after {name}: correct={good.correct} flags={good.hack_flags} "
                            f"error={(good.runtime_error or '')[:300]!r}")
    assert not problems, "\n".join(problems)
    assert "illegal memory access" in results["illegal_address"].runtime_error
    assert "out of memory" in results["out_of_memory"].runtime_error.lower()
    assert "SIGSEGV" in results["host_segfault"].runtime_error
    assert "exited with code 7" in results["os_exit"].runtime_error
    for r in results.values():
        assert "failed at run time" in r.feedback


def test_other_bad_verdicts(gpu_ev):
    names = [n for n in BAD if n not in CRASHING]
    results = gpu_ev.evaluate([corpus_index.request(BAD[n]) for n in names])
    problems = [f"{n}: expected {BAD[n].verdict}, got correct={r.correct} compiled={r.compiled} "
                f"error={(r.runtime_error or '')[:200]!r} log={r.compile_log[:200]!r}"
                for n, r in zip(names, results) if not verdict_ok(BAD[n], r)]
    assert not problems, "\n".join(problems)


def test_timing_reference_cache_and_kernel_trace(gpu_ev):
    cand = HONEST["softmax_rowwise"]  # the only use of the softmax task in this module: its reference is not cached
    first = gpu_ev.evaluate([corpus_index.request(cand, "1")])[0]
    second = gpu_ev.evaluate([corpus_index.request(cand, "2")])[0]
    for r in (first, second):
        assert r.correct and not r.hack_flags, (r.runtime_error, r.hack_flags)
        assert r.timing["n"] >= 20 and r.timing["median_ms"] > 0.05  # 8192 x 8192 floats
        assert 0.2 < r.speedup < 5.0, r.speedup
        assert r.meta["own_kernel_launches"] >= 1 and any("softmax_row_kernel" in k for k in r.meta["kernels"])
        assert r.meta["timer"] in ("native_cuda_timer", "torch_events")
        assert r.meta["gpu_name"] and r.meta["torch_version"]
    assert first.meta["ref_timing_cached"] is False and second.meta["ref_timing_cached"] is True
    assert second.ref_timing == first.ref_timing


def test_dtypes_and_training_mode_semantics(gpu_ev):
    ce, bn = gpu_ev.evaluate([corpus_index.request(HONEST["cross_entropy_rows"]),
                              corpus_index.request(HONEST["batchnorm_train_stats"])])
    assert ce.correct and ce.meta["input_dtypes"] == "float32,int64", ce.runtime_error  # int64 targets kept
    assert bn.correct, (bn.runtime_error, bn.trials)  # training-mode BatchNorm: batch statistics


def test_torch_compile_baseline_leaves_honest_kernels_unflagged():
    """--torch_compile_baseline times torch.compile(reference) in the candidate's worker. torch.compile patches
    torch.nn.Module.__init__/__setstate__ and starts threads; before the fix those changes were pinned on the
    candidate and every honest kernel was flagged (docs/LOG.md, "torch.compile-baseline bug found")."""
    with tempfile.TemporaryDirectory() as ref_dir, \
            Evaluator(EvalConfig(devices="0", run_timeout_s=120, ref_compile=True,
                                 ref_timing_cache_dir=ref_dir)) as ev:
        results = ev.evaluate([corpus_index.request(HONEST[name]) for name in ("relu_basic", "softmax_rowwise")])
    for r in results:
        assert r.correct and not r.hack_flags, (r.runtime_error, r.hack_flags)
        compiled = r.meta["ref_compile_timing"]
        assert "error" not in compiled and compiled["median_ms"] > 0, compiled
