"""Kevin's evaluation metrics against hand-computed examples, and the unbiased best@k estimator (Chen et al. 2021)
against the closed form for 0/1 values and against brute force over every k-subset."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kevin_jax.env.trajectory import Trajectory, Turn
from kevin_jax.evaluation.metrics import (budget_points, compute_metrics, default_ks, expected_best_of_k, infer_mode,
                                          kernel_outcome, pass_at_k)


# ----------------------------------------------------------------------------------------------- plain-data helpers
def verdict(correct=True, speedup=1.0, compiled=True, mode="full", hack=False, ref_compile_ms=None,
            cand_ms=1.0):
    meta = {} if ref_compile_ms is None else {"ref_compile_timing": {"median_ms": ref_compile_ms}}
    return {"mode": mode, "format_ok": True, "compiled": compiled, "correct": correct,
            "speedup": speedup if correct else None, "timing": {"median_ms": cand_ms} if correct else None,
            "hack_flags": [{"code": "torch_op", "reason": "x"}] if hack else [], "meta": meta}


def turn(i, format_error=None, **kw):
    return {"turn": i, "parsed": {"format_error": format_error}, "verdict": verdict(**kw)}


def kernel(parsed: dict, verdict: dict) -> Turn:
    return Turn.from_dict({"turn": 0, "parsed": parsed, "verdict": verdict})


def compile_speedup(verdict: dict) -> float | None:
    return kernel({"format_error": None}, verdict).compile_speedup


WRONG = dict(correct=False)
COMPILE_ERROR = dict(correct=None, compiled=False)


def ok(speedup, **kw):
    return dict(correct=True, speedup=speedup, **kw)


def traj(task_id, j, *turn_specs):
    """turn_specs: dicts of verdict fields, or None for a turn that was not taken (only at the end)."""
    turns = [turn(i, **spec) for i, spec in enumerate(turn_specs) if spec is not None]
    return Trajectory.from_dict({"task_id": task_id, "traj_index": j, "turns": turns})


def hand_example():
    """Two tasks x 4 trajectories x 2 turns (values after 1 and 2 turns worked out in the tests)."""
    a, b = "L1/1_A", "L2/2_B"
    return [
        traj(a, 0, WRONG, ok(1.2)),
        traj(a, 1, ok(0.5), ok(2.5)),
        traj(a, 2, COMPILE_ERROR, dict(ok(3.0), format_error="no code block")),   # our parse failed: not correct
        traj(a, 3, ok(1.6, hack=True), WRONG),                                     # flagged: not correct
        traj(b, 0, ok(0.9), ok(0.8)),
        traj(b, 1, WRONG, WRONG),
        traj(b, 2, ok(3.0), None),                                                 # stopped after turn 0
        traj(b, 3, WRONG, ok(1.0)),
    ]


# ----------------------------------------------------------------------------------------------- the estimator
def test_expected_best_of_k_by_hand():
    # subsets of 2 of {0,1,2,3}: maxima 1,2,3,2,3,3 -> 14/6
    assert expected_best_of_k([3, 0, 2, 1], 2) == pytest.approx(14 / 6)
    assert expected_best_of_k([3, 0, 2, 1], 1) == pytest.approx(1.5)        # k = 1: the mean
    assert expected_best_of_k([3, 0, 2, 1], 4) == pytest.approx(3.0)        # k = n: the max
    assert expected_best_of_k([0.0, 0.0, 1.2, 2.5], 2) == pytest.approx((2 * 1.2 + 3 * 2.5) / 6)


def test_binary_values_give_pass_at_k():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert expected_best_of_k([1, 0, 0, 1, 0], 2) == pytest.approx(0.7)
    for n, c, k in [(16, 3, 4), (16, 0, 8), (16, 16, 1), (10, 9, 2), (128, 5, 32)]:
        values = [1.0] * c + [0.0] * (n - c)
        assert expected_best_of_k(values, k) == pytest.approx(pass_at_k(n, c, k), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=7), st.integers(1, 7))
def test_expected_best_of_k_equals_brute_force_over_all_subsets(values, k):
    k = min(k, len(values))
    brute = np.mean([max(c) for c in itertools.combinations(values, k)])
    assert expected_best_of_k(values, k) == pytest.approx(brute, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("k", [0, 5])
def test_best_of_k_outside_1_to_n_is_an_error(k):
    with pytest.raises(ValueError, match="1 <= k <= n"):
        expected_best_of_k([1, 2, 3, 4], k)


# ----------------------------------------------------------------------------------------------- kernels
def test_kernel_outcome_follows_the_reward_rules():
    fine = {"format_error": None}
    assert kernel_outcome(kernel(fine, verdict(speedup=1.7)), "full").speedups["eager"] == 1.7
    assert not kernel_outcome(kernel(fine, verdict(hack=True)), "full").ok
    assert not kernel_outcome(kernel({"format_error": "no code"}, verdict()), "full").ok
    assert not kernel_outcome(kernel(fine, verdict(correct=None)), "full").ok                  # not checked
    # compile-only: ok = compiled, clean and well formed; no speed is known
    compiled = kernel_outcome(kernel(fine, verdict(correct=None, mode="compile_only")), "compile_only")
    assert compiled.ok and compiled.speedups == {"eager": None, "compile": None}
    assert not kernel_outcome(kernel(fine, verdict(correct=None, compiled=False)), "compile_only").ok
    assert not kernel_outcome(kernel(fine, verdict(correct=None, hack=True)), "compile_only").ok


def test_speedup_over_torch_compile_is_its_median_over_the_candidates():
    assert compile_speedup(verdict(ref_compile_ms=1.5, cand_ms=0.5)) == pytest.approx(3.0)
    assert compile_speedup(verdict()) is None
    failed = verdict()
    failed["meta"]["ref_compile_timing"] = {"error": "torch.compile failed"}
    assert compile_speedup(failed) is None


def test_infer_mode():
    assert infer_mode([verdict(), verdict()]) == "full"
    assert infer_mode([verdict(mode="compile_only")]) == "compile_only"
    with pytest.raises(ValueError, match="different evaluator modes"):
        infer_mode([verdict(), verdict(mode="compile_only")])


def test_default_ks_and_budget_points():
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12) == [1, 2, 4, 8, 12]
    assert default_ks(1) == [1]
    # Kevin's 128 kernels: 128 x 1, 64 x 2, 32 x 4, 16 x 8 (with 128 trajectories of 8 turns)
    assert budget_points(128, 128, 8) == [(128, 1), (64, 2), (32, 4), (16, 8)]
    assert budget_points(16, 16, 4) == [(16, 1), (8, 2), (4, 4)]
    assert budget_points(16, 4, 4) == [(4, 4)]


# ----------------------------------------------------------------------------------------------- the whole report
def test_summary_after_all_turns_by_hand():
    m = compute_metrics(hand_example())
    assert (m["mode"], m["num_tasks"], m["trajectories_per_task"], m["turns"], m["ks"]) == ("full", 2, 4, 2,
                                                                                           [1, 2, 4])
    s = m["summary"]
    # correct: A [1,1,0,0] (best@2 = 1 - C(2,2)/C(4,2) = 5/6), B [1,0,1,1] (best@2 = 1)
    assert s["correct"] == pytest.approx({"avg": 0.625, "best@1": 0.625, "best@2": 11 / 12, "best@4": 1.0})
    # performance: A [1.2, 2.5, 0, 0] -> best@2 9.9/6; B [0.9, 0, 3, 1] -> best@2 (0.9 + 2 + 9)/6
    perf = s["eager"]["performance"]
    assert perf == pytest.approx({"avg": (0.925 + 1.225) / 2, "best@1": 1.075,
                                  "best@2": (9.9 / 6 + 11.9 / 6) / 2, "best@4": 2.75})
    assert s["eager"]["fast_1"] == pytest.approx({"avg": 0.5, "best@1": 0.5, "best@2": 5 / 6, "best@4": 1.0})
    assert s["eager"]["fast_1.5"] == pytest.approx({"avg": 0.25, "best@1": 0.25, "best@2": 0.5, "best@4": 1.0})
    assert s["eager"]["fast_2"] == pytest.approx({"avg": 0.25, "best@1": 0.25, "best@2": 0.5, "best@4": 1.0})
    assert "compile" not in s          # torch.compile was never timed


def test_serial_refinement_curve_by_hand():
    m = compute_metrics(hand_example())
    one, two = m["by_turn"]
    assert (one["turns"], two["turns"]) == (1, 2)
    # after 1 turn: correct A [0,1,0,0], B [1,0,1,0]; performance A [0,.5,0,0], B [.9,0,3,0]
    assert one["correct"] == pytest.approx({"avg": 0.375, "best@1": 0.375, "best@2": (0.5 + 5 / 6) / 2,
                                            "best@4": 1.0})
    assert one["eager"]["performance"]["best@4"] == pytest.approx((0.5 + 3.0) / 2)
    assert one["eager"]["fast_1"]["best@4"] == pytest.approx(0.5)
    assert two["correct"] == m["summary"]["correct"]


def test_fixed_budget_by_hand():
    m = compute_metrics(hand_example())
    (entry,) = m["fixed_budget"]
    assert entry["budget"] == 4
    wide, deep = entry["points"]
    assert (wide["trajectories"], wide["turns"], deep["trajectories"], deep["turns"]) == (4, 1, 2, 2)
    assert wide["correct"] == pytest.approx(1.0)
    assert wide["eager"]["performance"] == pytest.approx(1.75)
    assert deep["correct"] == pytest.approx(11 / 12)
    assert deep["eager"]["performance"] == pytest.approx((9.9 / 6 + 11.9 / 6) / 2)
    m8 = compute_metrics(hand_example(), budgets=[2, 8])
    assert [[(p["trajectories"], p["turns"]) for p in e["points"]] for e in m8["fixed_budget"]] == \
        [[(2, 1), (1, 2)], [(4, 2)]]


def test_kernel_rates_levels_and_per_task():
    m = compute_metrics(hand_example())
    t0, t1 = m["kernels_by_turn"]
    assert (t0["kernels"], t0["correct_rate"]) == (8, pytest.approx(3 / 8))
    assert t0["mean_speedup_of_correct"] == pytest.approx((0.5 + 0.9 + 3.0) / 3)
    assert (t1["kernels"], t1["correct_rate"]) == (7, pytest.approx(4 / 7))       # B's traj 2 stopped
    assert m["by_level"]["1"]["num_tasks"] == 1
    assert m["by_level"]["1"]["correct"]["best@2"] == pytest.approx(5 / 6)
    assert m["by_level"]["2"]["eager"]["performance"]["avg"] == pytest.approx(1.225)
    assert m["per_task"]["L1/1_A"]["eager"]["performance"] == pytest.approx({"avg": 0.925, "best@4": 2.5})


def test_ks_above_n_are_dropped_and_reported():
    m = compute_metrics(hand_example(), ks=[1, 3, 16])
    assert m["ks"] == [1, 3] and m["ks_dropped_above_n"] == [16]
    # best@3 of A's correctness [1,1,0,0]: 1 - C(2,3)/C(4,3) = 1
    assert m["summary"]["correct"]["best@3"] == pytest.approx((1.0 + 1.0) / 2)


def test_torch_compile_baseline_side_by_side():
    c, d, e = "L1/3_C", "L1/4_D", "L1/5_E"
    trajs = [
        traj(c, 0, ok(2.0, ref_compile_ms=1.5, cand_ms=0.5)),    # 2x eager, 3x torch.compile
        traj(c, 1, ok(0.5, ref_compile_ms=0.25, cand_ms=0.5)),   # 0.5x eager, 0.5x torch.compile
        traj(d, 0, ok(1.0)),                                     # correct, torch.compile not timed: left out
        traj(d, 1, WRONG),
        traj(e, 0, WRONG),                                       # nothing correct: 0 under any baseline
        traj(e, 1, COMPILE_ERROR),
    ]
    s = compute_metrics(trajs)["summary"]
    assert s["eager"]["performance"]["best@2"] == pytest.approx((2.0 + 1.0 + 0.0) / 3)
    comp = s["compile"]
    assert (comp["tasks"], comp["tasks_excluded"]) == (2, 1)
    assert comp["performance"]["best@2"] == pytest.approx((3.0 + 0.0) / 2)
    assert comp["performance"]["avg"] == pytest.approx((1.75 + 0.0) / 2)
    assert comp["fast_2"]["best@1"] == pytest.approx((0.5 + 0.0) / 2)


def test_compile_only_reports_compiled_and_no_speed():
    trajs = [traj("L1/1_A", j, *specs) for j, specs in enumerate([
        [dict(correct=None, mode="compile_only"), dict(correct=None, compiled=False, mode="compile_only")],
        [dict(correct=None, compiled=False, mode="compile_only")] * 2])]
    m = compute_metrics(trajs)
    assert m["mode"] == "compile_only" and m["metric_correct"] == "compiled"
    assert m["summary"] == {"compiled": pytest.approx({"avg": 0.5, "best@1": 0.5, "best@2": 1.0})}
    assert m["kernels_by_turn"][0]["compiled_rate"] == pytest.approx(0.5)
    assert m["fixed_budget"][0]["points"][0]["compiled"] == pytest.approx(1.0)


def test_dependent_samples_report_only_the_best_of_all():
    m = compute_metrics(hand_example(), parallel_samples=False)
    assert m["ks"] == [4] and "fixed_budget" not in m
    assert set(m["summary"]["correct"]) == {"avg", "best@4"}


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="no trajectories"):
        compute_metrics([])
    with pytest.raises(ValueError, match="different evaluator modes"):
        compute_metrics([traj("L1/1_A", 0, ok(1.0)), traj("L1/1_A", 1, dict(correct=None, mode="compile_only"))])
    with pytest.raises(ValueError, match="k >= 1"):
        compute_metrics(hand_example(), ks=[0, 2])
    with pytest.raises(ValueError, match="budgets must be positive"):
        compute_metrics(hand_example(), budgets=[0])
    with pytest.raises(ValueError, match="hold no turns"):
        compute_metrics([Trajectory("L1/1_A", 0, 0, 0, [])])


def test_trajectories_read_back_from_their_json_give_the_same_metrics(tmp_path):
    from kevin_jax.env.trajectory import read_trajectories, write_trajectories
    path = write_trajectories(tmp_path / "hand.jsonl", hand_example())
    objects, _ = read_trajectories(path)
    assert compute_metrics(objects)["summary"] == compute_metrics(hand_example())["summary"]
    assert math.isclose(compute_metrics(objects)["summary"]["correct"]["best@2"], 11 / 12)


def test_tables_side_by_side():
    from kevin_jax.evaluation.report import side_by_side
    text = side_by_side({"profile kevin": "correct 40%\nfast_1 10%", "profile kernelbench": "correct 75%"})
    lines = text.splitlines()
    assert lines[0].startswith("profile kevin") and lines[0].endswith("profile kernelbench")
    assert lines[2].startswith("correct 40%") and lines[2].endswith("correct 75%")
    assert lines[3] == "fast_1 10%"
    assert lines[0].index("profile kernelbench") == lines[2].index("correct 75%")


def test_peak_fraction_is_the_best_correct_kernels_share_of_the_roofline():
    """Per trajectory the largest peak_fraction of its correct kernels (0 if none; a flagged kernel's is not
    counted), averaged like performance; the eval table shows it as a percentage."""
    from kevin_jax.evaluation.report import render

    def with_peak(speedup, peak, **kw):
        spec = ok(speedup, **kw)
        spec["peak"] = peak
        return spec

    def make(task_id, j, *specs):
        turns = []
        for i, spec in enumerate(specs):
            spec = dict(spec)
            peak = spec.pop("peak", None)
            t = turn(i, **spec)
            t["verdict"]["peak_fraction"] = peak if t["verdict"]["correct"] else None
            turns.append(t)
        return Trajectory.from_dict({"task_id": task_id, "traj_index": j, "turns": turns})
    trajs = [make("L1/1_A", 0, with_peak(1.0, 0.2), with_peak(2.0, 0.4)),
             make("L1/1_A", 1, WRONG, with_peak(3.0, 0.9, hack=True)),
             make("L1/2_B", 0, with_peak(0.5, 0.1), WRONG),
             make("L1/2_B", 1, WRONG, WRONG)]
    m = compute_metrics(trajs)
    assert m["summary"]["eager"]["peak_fraction"]["avg"] == pytest.approx(((0.4 + 0.0) / 2 + (0.1 + 0.0) / 2) / 2)
    assert m["summary"]["eager"]["peak_fraction"]["best@2"] == pytest.approx((0.4 + 0.1) / 2)
    assert "peak fraction (roofline)" in render(m) and "25.0%" in render(m)
