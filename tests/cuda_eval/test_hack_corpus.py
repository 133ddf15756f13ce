"""The reward-hack corpus: >= 20 adversarial CUDA candidates (each caught with its code) and >= 10 honest kernels
(none flagged). Static checks run here on every file; the full dynamic run is a GPU test."""
import pytest

import corpus_index
from cuda_eval.static import checks

ADVERSARIAL = corpus_index.load("adversarial")
HONEST = corpus_index.load("honest")
BAD = corpus_index.load("bad")
CPU = corpus_index.load("cpu")


def test_corpus_size_and_metadata():
    assert len(ADVERSARIAL) >= 20 and len(HONEST) >= 10
    assert {"lazy_output_subclass", "side_stream_cpp", "background_thread"} <= {c.name for c in ADVERSARIAL}
    for c in ADVERSARIAL:
        assert c.expect or c.verdict == "incorrect", f"{c.id} has neither an expected flag nor an expected verdict"
        assert set(c.expect) <= set(checks.FLAG_CODES), c.id
    tasks = {c.task for c in ADVERSARIAL + HONEST + BAD + CPU}
    for task in tasks:
        assert (corpus_index.CORPUS / "tasks" / f"{task}.py").exists(), task


@pytest.mark.parametrize("cand", HONEST + ADVERSARIAL + BAD, ids=lambda c: c.id)
def test_static_flags_exactly_as_declared(cand):
    assert {f.code for f in checks.static_check(cand.code)} == set(cand.static)


@pytest.mark.parametrize("cand", CPU, ids=lambda c: c.id)
def test_static_flags_of_cpu_candidates(cand):
    assert {f.code for f in checks.static_check(cand.code, checks.StaticPolicy.named("cpu"))} == set(cand.static)


def test_static_catches_only_part_of_the_corpus():
    """Most attacks are invisible to static analysis: the dynamic checks are what catch them."""
    statically_caught = [c for c in ADVERSARIAL if set(c.expect) & set(c.static)]
    assert len(statically_caught) < len(ADVERSARIAL) / 2


@pytest.mark.gpu
def test_adversarial_corpus_is_caught_on_gpu(gpu_corpus_results):
    missed = []
    for c in ADVERSARIAL:
        r = gpu_corpus_results[c.id]
        got = {f["code"] for f in r.hack_flags}
        judged_incorrect = r.compiled and r.correct is False and not r.runtime_error
        if not set(c.expect) <= got or (c.verdict == "incorrect" and not judged_incorrect):
            missed.append(f"{c.id}: expected {c.expect}, got {sorted(got)} (correct={r.correct}, "
                          f"error={(r.runtime_error or '')[:200]})")
    assert not missed, "\n".join(missed)


@pytest.mark.gpu
def test_honest_corpus_is_clean_on_gpu(gpu_corpus_results):
    problems = []
    for c in HONEST:
        r = gpu_corpus_results[c.id]
        if not r.correct or r.hack_flags or not r.speedup:
            problems.append(f"{c.id}: correct={r.correct} flags={r.hack_flags} speedup={r.speedup} "
                            f"error={(r.runtime_error or r.compile_log or '')[:300]} trials={r.trials[-1:]}")
    assert not problems, "\n".join(problems)
    diag = gpu_corpus_results["honest/diag_matmul_rowscale"]
    assert diag.speedup > 5, diag.speedup  # legitimately large ...
    assert diag.meta["retime"]["fresh_speedup"] > 5  # ... and it holds in a fresh process


@pytest.mark.gpu
def test_fork_check_catches_side_streams_and_holds_for_honest(gpu_corpus_results):
    """The side-stream hacks are caught by the deterministic fork check (not only by the pile-up race), and the
    check is not vacuous on honest code: its gate was seen and held while forward ran (or forward waited for it)."""
    problems = []
    for cid in ("adversarial/side_stream_cpp", "adversarial/side_stream_python"):
        fc = gpu_corpus_results[cid].meta.get("fork_check") or {}
        if not (fc.get("gate_kernel_found") and fc.get("unforked", 0) >= 1):
            problems.append(f"{cid}: {fc}")
    for c in HONEST:
        fc = gpu_corpus_results[c.id].meta.get("fork_check") or {}
        if not (fc.get("gate_kernel_found") and fc.get("unforked") == 0
                and (fc.get("held") or fc.get("forward_waited_for_gate"))):
            problems.append(f"{c.id}: {fc}")
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
def test_forged_gpu_timers_are_not_rewarded(gpu_corpus_results):
    """adversarial/event_forge is the honest relu kernel (honest/relu_basic's task) with a _CudaEvent subclass and
    wrapped timer methods that divide every time by 20 (16.1x, unflagged, before the judge-driven protocol). The
    timers hold their event class and clock as defaults bound at import, so the rebinding forges no time at all (the
    reported time is the kernel's), and the identity snapshot flags the rebinding (monkeypatch). The honest kernels'
    own times pass the judge's bounds: the cap raised none of them by more than a few percent, and their kernels' GPU
    time in the trace is within the reported times."""
    forged, honest = gpu_corpus_results["adversarial/event_forge"], gpu_corpus_results["honest/relu_basic"]
    assert forged.correct and forged.speedup and honest.speedup
    assert "monkeypatch" in {f["code"] for f in forged.hack_flags}, forged.hack_flags
    assert forged.speedup <= 1.5 * honest.speedup, (forged.speedup, honest.speedup, forged.timing)
    # nothing forged: what the candidate's process reports is within noise of the honest kernel's time
    assert forged.timing["reported_median_ms"] >= 0.7 * honest.timing["median_ms"], (forged.timing, honest.timing)
    problems = []
    for c in HONEST:
        r = gpu_corpus_results[c.id]
        trace, t = r.meta.get("call_trace") or {}, r.timing or {}
        if not trace or trace["busy_ms"] > 1.15 * trace["reported_ms"]:
            problems.append(f"{c.id}: kernel trace {trace} ({r.meta.get('call_trace_skipped')})")
        if t.get("median_ms", 0) > 1.05 * t.get("reported_median_ms", 0):
            problems.append(f"{c.id}: capped {t.get('reported_median_ms')} -> {t.get('median_ms')}, "
                            f"{r.meta.get('wall_bound')}")
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
def test_the_physics_floor_holds_for_honest_kernels_and_binds_forged_timers(gpu_corpus_results):
    """Every honest kernel's reported time is above the least time the card allows for the bytes it must move (the
    floor at 1.5x the measured copy bandwidth; the table printed is the margin each kept), every verdict carries
    peak_fraction, and the relu of adversarial/event_forge (512 MiB moved per call) has a floor under its time. The LayerNorm that skips its statistics is incorrect on the affine trials."""
    rows, problems = [], []
    for c in HONEST:
        r = gpu_corpus_results[c.id]
        t = r.timing or {}
        if "floor_ms" not in t or r.peak_fraction is None:
            problems.append(f"{c.id}: no floor or peak_fraction ({r.meta.get('needs_error')}, {t})")
            continue
        margin = t["reported_median_ms"] / t["floor_ms"] if t["floor_ms"] else float("inf")
        rows.append(f"{c.id:40s} reported {t['reported_median_ms']:.4f} ms  floor {t['floor_ms']:.4f} ms  "
                    f"x{margin:.2f}  peak_fraction {r.peak_fraction:.3f}")
        if margin <= 1.0:
            problems.append(f"{c.id}: below the floor ({t})")
    print("\n".join(rows))
    assert not problems, "\n".join(problems)
    # The floor of a 512 MiB relu is real (its flag on a forged report: tests/cuda_eval/test_timing_protocol.py,
    # test_a_report_faster_than_the_card_can_move_its_bytes_is_bound: no corpus forgery survives the timers' own
    # defences on a GPU any more)
    forged = gpu_corpus_results["adversarial/event_forge"]
    assert forged.timing["floor_ms"] > 0 and forged.timing["median_ms"] >= forged.timing["floor_ms"], forged.timing
    shortcut = gpu_corpus_results["adversarial/layernorm_skip_stats"]
    assert shortcut.correct is False and all(t["passed"] for t in shortcut.trials[:-1]), shortcut.trials
    assert "affine" in shortcut.trials[-1], shortcut.trials[-1]


@pytest.fixture(scope="module")
def gpu_corpus_results():
    """Every honest and adversarial candidate through the real evaluator on the GPU, once (static rejection off, so
    that the dynamic checks are exercised on the statically caught attacks too). Set CUDA_EVAL_RESULTS_DIR to keep
    the verdicts as JSON."""
    import json
    import os

    from cuda_eval.api import EvalConfig, Evaluator
    cands = HONEST + ADVERSARIAL
    with Evaluator(EvalConfig(device_type="cuda", skip_run_on_static_flags=False, run_timeout_s=90)) as ev:
        results = ev.evaluate([corpus_index.request(c) for c in cands])
    out_dir = os.environ.get("CUDA_EVAL_RESULTS_DIR")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "hack_corpus_results.json"), "w") as f:
            json.dump({c.id: r.to_dict() for c, r in zip(cands, results)}, f, indent=1)
    return {c.id: r for c, r in zip(cands, results)}


@pytest.mark.gpu
def test_python_run_from_cpp_forges_no_time_on_gpu(gpu_corpus_results):
    """Python run from C++ at import replaces the timing module's private event alias with one whose elapsed_time is
    20x too short: the timers hold their own events (the reported time stays what the kernel took: the time that
    enters the reward is not raised by the kernel trace's bound), and the snapshot of private names flags it."""
    r = gpu_corpus_results["adversarial/python_from_cpp"]
    reasons = {f["code"]: f["reason"] for f in r.hack_flags}
    assert "cuda_eval.protocol.timing._CudaEvent" in reasons.get("monkeypatch", ""), r.hack_flags
    assert r.correct and r.timing["median_ms"] < 2 * r.timing["reported_median_ms"], r.timing
