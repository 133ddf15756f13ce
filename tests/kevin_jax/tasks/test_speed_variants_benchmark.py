"""benchmarks/builtin_speed_variants.py's bookkeeping on hand-built verdicts (the GPU run must not fail on a typo):
median speedup over repeats, a solution incorrect in any repeat is not correct, pairs below 1.5x flagged, and a
compile-only run records no speedup."""
import importlib.util
from pathlib import Path

import pytest

from cuda_eval.api import EvalResult

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("builtin_speed_variants",
                                              REPO / "benchmarks" / "builtin_speed_variants.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def result(task, name, repeat, speedup, correct=True, ref_ms=1.0):
    return EvalResult(request_id=f"{task}/{name}/r{repeat}", task_id=task, mode="full", format_ok=True, compiled=True,
                      correct=correct, speedup=speedup if correct else None,
                      timing={"median_ms": ref_ms / speedup} if correct else None, ref_timing={"median_ms": ref_ms})


def test_repeats_pairs_and_flags():
    a, b = "L1/1_LeakyReLU", "L1/7_HingeLoss"
    repeats = [[result(a, "correct_naive", k, s1), result(a, "correct_uncoalesced", k, s2),
                result(b, "correct_naive", k, 3.0), result(b, "correct_unfused", k, 2.4, correct=k != 1)]
               for k, (s1, s2) in enumerate(((0.95, 0.30), (1.0, 0.32), (0.97, 0.29)))]
    sols = bench.summarise(repeats, "full")
    assert sols[a]["correct_naive"]["speedup"] == pytest.approx(0.97)          # the median of 0.95, 1.0, 0.97
    assert sols[a]["correct_uncoalesced"]["speedups"] == [0.30, 0.32, 0.29]
    assert sols[a]["correct_naive"]["ref_median_ms"] == 1.0
    assert sols[b]["correct_unfused"]["correct"] is False and sols[b]["correct_unfused"]["speedup"] is None
    pairs = bench.pairs(sols, 1.5)
    assert pairs[a]["slow"] == "correct_uncoalesced" and pairs[a]["fast"] == "correct_naive" and pairs[a]["apart"]
    assert pairs[a]["ratio"] == pytest.approx(0.97 / 0.30)
    assert not pairs[b]["apart"] and pairs[b]["ratio"] is None       # one measured-correct solution only
    text = bench.table(sols, pairs, "full", 1.5)
    assert "| L1/7_HingeLoss | None | None | - | **NO** (1 measured-correct solution(s)) |" in text


def test_compile_only_records_no_speedup():
    rows = [[EvalResult(request_id="L1/1_LeakyReLU/correct_naive/r0", task_id="L1/1_LeakyReLU", mode="compile_only",
                        format_ok=True, compiled=True)]]
    sols = bench.summarise(rows, "compile_only")
    assert sols["L1/1_LeakyReLU"]["correct_naive"] == {**sols["L1/1_LeakyReLU"]["correct_naive"], "compiled": True,
                                                       "correct": None, "speedup": None}
    assert "| L1/1_LeakyReLU | correct_naive | True |" in bench.table(sols, {}, "compile_only", 1.5)
    assert len(bench.requests({"L1/1_LeakyReLU"}, 0)) >= 2
