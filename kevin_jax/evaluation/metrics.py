"""Kevin's evaluation metrics over multi-turn trajectories, and the unbiased best@k estimator (Chen et al. 2021).

Definitions (Kevin, arXiv 2507.11948):
- A kernel is correct when it is well formed, correct and carries no hack flag (kevin_jax.env.trajectory.Turn.correct).
  Where nothing ran (compile-only verdicts) the only thing known is whether it compiled (Turn.ok("compile_only")):
  the metric is then called "compiled" and there is no performance.
- A trajectory after t turns (its first t kernels) is correct if any of them is; its performance is the speedup of its
  fastest correct kernel (0 if none); it is fast_p if one of its correct kernels has speedup >= p (p in 1, 1.5, 2).
- Over k parallel trajectories of a task: best@k is the max and avg@k the mean of those values. With n > k samples,
  best@k is the unbiased estimate of E[max over a random k-subset of the n] (for 0/1 values: pass@k =
  1 - C(n-c, k) / C(n, k)); avg@k is then the mean over all n (its unbiased estimate for every k). Task values are
  averaged over tasks.
- Serial-refinement curve: every metric after t = 1..T turns. Fixed budget: the same number of kernels spent as
  k trajectories x t turns, e.g. 16 = 16 x 1 = 8 x 2 = 4 x 4.
- peak_fraction: the share of the roofline (bytes at the card's copy bandwidth, FLOPs at its tensor-core peak) that a
  trajectory's best correct kernel reached (EvalResult.peak_fraction; 0 if none), averaged like performance; unlike a
  speedup it does not depend on how fast the reference is. It is reported with the eager numbers.
- Speedups are against PyTorch eager ("eager": EvalResult.speedup) and, when the evaluator also timed
  torch.compile(reference) (EvalConfig.ref_compile: meta.ref_compile_timing), against it ("compile"). A task whose
  correct kernels lack a torch.compile timing is left out of the "compile" numbers (counted in `tasks_excluded`).

Everything here is numpy on plain data (Contract-4 trajectories: kevin_jax.env.trajectory), so saved trajectories can
be re-scored without a model or an evaluator.
"""
from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from kevin_jax.env.trajectory import Trajectory, Turn
from kevin_jax.rl.speed_metrics import fast_key as fast_name   # one naming for both

FAST_P = (1.0, 1.5, 2.0)
BASELINES = ("eager", "compile")
MODES = ("full", "compile_only")


def correct_name(mode: str) -> str:
    return "compiled" if mode == "compile_only" else "correct"


# -------------------------------------------------------------------------------------------- the estimator
def expected_best_of_k(values: Sequence[float], k: int) -> float:
    """Unbiased estimate of E[max of k values drawn without replacement] from n observed samples (Chen et al. 2021,
    generalised from pass@k to real values): with v_(1) <= ... <= v_(n), sum_i v_(i) C(i-1, k-1) / C(n, k).
    k = n gives the plain max; k = 1 the mean."""
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"best@{k} needs 1 <= k <= n, and there are n={n} samples")
    ordered = sorted(float(v) for v in values)
    total = math.comb(n, k)
    # Exact integer weights (n is at most a few hundred): no cancellation in the ratio of binomials.
    return float(sum(Fraction(math.comb(i, k - 1), total) * Fraction(v) for i, v in enumerate(ordered) if i >= k - 1))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The closed form for 0/1 values (c successes of n): 1 - C(n-c, k) / C(n, k)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# -------------------------------------------------------------------------------------------- kernels
@dataclasses.dataclass(frozen=True)
class KernelOutcome:
    """What one turn's kernel counts for. `speedups[b]` is None when not ok or when baseline b was not measured."""
    ok: bool
    speedups: Mapping[str, float | None]
    peak_fraction: float | None = None


def kernel_outcome(turn: Turn, mode: str) -> KernelOutcome:
    """A turn's kernel in an evaluation of this mode: ok = Turn.ok(mode); speeds only for an ok kernel of "full"."""
    if mode == "compile_only" or not turn.ok(mode):
        return KernelOutcome(turn.ok(mode), {"eager": None, "compile": None})
    return KernelOutcome(True, {"eager": turn.speedup, "compile": turn.compile_speedup}, turn.peak_fraction)


def infer_mode(verdicts: Iterable[Mapping]) -> str:
    """"compile_only" when every verdict says so, else "full" (a mix is an error: the numbers would mean nothing)."""
    modes = {v.get("mode") for v in verdicts} - {None}
    if len(modes) > 1:
        raise ValueError(f"verdicts come from different evaluator modes {sorted(modes)}: re-evaluate them together")
    mode = modes.pop() if modes else "full"
    if mode not in MODES:
        raise ValueError(f"unknown evaluator mode {mode!r} in the verdicts (expected one of {MODES})")
    return mode


@dataclasses.dataclass
class TaskKernels:
    """All kernels of one task: kernels[j][i] = trajectory j's kernel at turn i (None: that turn was not taken,
    e.g. the trajectory stopped early)."""
    task_id: str
    kernels: list[list[KernelOutcome | None]]

    @property
    def level(self) -> str:
        head = self.task_id.split("/", 1)[0]
        return head[1:] if head.startswith("L") and head[1:].isdigit() else "?"

    @property
    def num_trajectories(self) -> int:
        return len(self.kernels)

    @property
    def max_turns(self) -> int:
        return max((len(k) for k in self.kernels), default=0)


def collect(trajectories: Sequence[Trajectory], mode: str | None = None) -> tuple[list[TaskKernels], str]:
    """Groups trajectories by task, in first-seen task order. Returns the tasks and the mode (given, or inferred
    from the verdicts)."""
    if mode is None:
        mode = infer_mode(t.verdict for tr in trajectories for t in tr.turns)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    by_task: dict[str, list[list[KernelOutcome | None]]] = {}
    for traj in trajectories:
        length = max((t.turn for t in traj.turns), default=-1) + 1
        row: list[KernelOutcome | None] = [None] * length
        for t in traj.turns:
            row[t.turn] = kernel_outcome(t, mode)
        by_task.setdefault(traj.task_id, []).append(row)
    return [TaskKernels(task_id, rows) for task_id, rows in by_task.items()], mode


# -------------------------------------------------------------------------------------------- trajectories
def trajectory_values(kernels: Sequence[KernelOutcome | None], turns: int, baseline: str,
                      fast_p: Sequence[float] = FAST_P) -> dict[str, float] | None:
    """Kevin's values of one trajectory after its first `turns` kernels: correct (0/1), performance (fastest correct
    speedup, 0 if none) and fast_p (0/1). None when a correct kernel lacks this baseline's speedup (only possible for
    "compile": the baseline was not measured) - the caller leaves the task out."""
    seen = [k for k in kernels[:turns] if k is not None and k.ok]
    speedups = [k.speedups.get(baseline) for k in seen]
    if baseline != "eager" and any(s is None for s in speedups):
        return None
    speedups = [s or 0.0 for s in speedups]
    best = max(speedups, default=0.0)
    out = {"correct": float(bool(seen)), "performance": float(best)}
    for p in fast_p:
        out[fast_name(p)] = float(best >= p)
    if baseline == "eager":
        out["peak_fraction"] = float(max((k.peak_fraction or 0.0 for k in seen), default=0.0))
    return out


def task_values(task: TaskKernels, turns: int, baseline: str,
                fast_p: Sequence[float] = FAST_P) -> dict[str, np.ndarray] | None:
    """{metric: values of the task's n trajectories after `turns` turns}, or None if the baseline is missing."""
    rows = [trajectory_values(k, turns, baseline, fast_p) for k in task.kernels]
    if not rows or any(r is None for r in rows):
        return None
    return {name: np.array([r[name] for r in rows]) for name in rows[0]}


def summarize(values: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """{"avg": mean, "best@k": unbiased best@k for each k <= n}."""
    out = {"avg": float(np.mean(values))}
    for k in ks:
        if k <= len(values):
            out[f"best@{k}"] = expected_best_of_k(values, k)
    return out


def aggregate(tasks: Sequence[TaskKernels], turns: int, ks: Sequence[int], mode: str,
              fast_p: Sequence[float] = FAST_P) -> dict[str, Any]:
    """Task-averaged avg/best@k of every metric after `turns` turns, per baseline.

    {"correct" | "compiled": {"avg", "best@k"...},
     "eager": {"performance": {...}, "fast_1": {...}, ...}, "compile": {..., "tasks": m, "tasks_excluded": x}}
    The compile section is absent when no task has a torch.compile timing; compile_only has no speed at all."""
    if not tasks:
        raise ValueError("no tasks to aggregate")
    name = correct_name(mode)
    per_task_eager = [task_values(t, turns, "eager", fast_p) for t in tasks]
    out: dict[str, Any] = {name: _mean_of(summarize(v["correct"], ks) for v in per_task_eager)}
    if mode == "compile_only":
        return out
    speed_metrics = ["performance"] + [fast_name(p) for p in fast_p]
    out["eager"] = {m: _mean_of(summarize(v[m], ks) for v in per_task_eager)
                    for m in speed_metrics + ["peak_fraction"]}
    if not any(k is not None and k.speedups.get("compile") is not None
               for t in tasks for row in t.kernels for k in row[:turns]):
        return out   # torch.compile was not timed (EvalConfig.ref_compile off)
    per_task_compile = [task_values(t, turns, "compile", fast_p) for t in tasks]
    covered = [v for v in per_task_compile if v is not None]
    if covered:
        out["compile"] = {m: _mean_of(summarize(v[m], ks) for v in covered) for m in speed_metrics}
        out["compile"]["tasks"] = len(covered)
        out["compile"]["tasks_excluded"] = len(tasks) - len(covered)
    return out


def _mean_of(summaries: Iterable[Mapping[str, float]]) -> dict[str, float]:
    summaries = list(summaries)
    keys = [k for k in summaries[0] if all(k in s for s in summaries)]
    return {k: float(np.mean([s[k] for s in summaries])) for k in keys}


# -------------------------------------------------------------------------------------------- the whole report
def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n >= 1 else []


def budget_points(budget: int, max_trajectories: int, max_turns: int) -> list[tuple[int, int]]:
    """(trajectories, turns) pairs spending exactly `budget` kernels that the data can estimate, most parallel
    first."""
    return [(budget // t, t) for t in range(1, max_turns + 1)
            if budget % t == 0 and 1 <= budget // t <= max_trajectories]


def kernel_rates_by_turn(tasks: Sequence[TaskKernels], mode: str) -> list[dict[str, float]]:
    """Per turn index: how many kernels were written and the share that were ok (not cumulative: the raw rate of
    that turn's kernels), with the mean eager speedup of the ok ones."""
    out = []
    for i in range(max(t.max_turns for t in tasks)):
        at = [row[i] for t in tasks for row in t.kernels if i < len(row) and row[i] is not None]
        oks = [k for k in at if k.ok]
        speedups = [k.speedups["eager"] for k in oks if k.speedups.get("eager")]
        entry = {"turn": i, "kernels": len(at), f"{correct_name(mode)}_rate": len(oks) / len(at) if at else 0.0}
        if mode == "full":
            entry["mean_speedup_of_correct"] = float(np.mean(speedups)) if speedups else 0.0
        out.append(entry)
    return out


def compute_metrics(trajectories: Sequence[Trajectory], *, ks: Sequence[int] | None = None,
                    budgets: Sequence[int] | None = None, mode: str | None = None,
                    fast_p: Sequence[float] = FAST_P, parallel_samples: bool = True) -> dict[str, Any]:
    """Every number of an evaluation, as plain data (JSON-ready).

    ks: best@k values to report (default 1, 2, 4, ..., n; those above the smallest n are dropped).
    budgets: kernel budgets of the fixed-budget comparison (default: n, the trajectories per task).
    parallel_samples: the trajectories of a task are independent samples (False for beam search: then only best@n,
      the best of all of them, means anything, and there is no best@k curve or fixed-budget comparison).
    """
    if not trajectories:
        raise ValueError("no trajectories to compute metrics on")
    tasks, mode = collect(trajectories, mode)
    counts = sorted({t.num_trajectories for t in tasks})
    n = counts[0]
    max_turns = max(t.max_turns for t in tasks)
    if max_turns == 0:
        raise ValueError("the trajectories hold no turns")
    if not parallel_samples:
        ks = [n]
    ks = sorted({int(k) for k in (ks or default_ks(n))})
    if any(k < 1 for k in ks):
        raise ValueError(f"best@k needs k >= 1, got {ks}")
    dropped = [k for k in ks if k > n]
    ks = [k for k in ks if k <= n]
    out: dict[str, Any] = {
        "mode": mode, "metric_correct": correct_name(mode), "num_tasks": len(tasks),
        "trajectories_per_task": n if len(counts) == 1 else {"min": counts[0], "max": counts[-1]},
        "turns": max_turns, "ks": ks, "ks_dropped_above_n": dropped, "fast_p": list(fast_p),
        "parallel_samples": parallel_samples,
        "summary": aggregate(tasks, max_turns, ks, mode, fast_p),
        "by_turn": [{"turns": t, **aggregate(tasks, t, ks, mode, fast_p)} for t in range(1, max_turns + 1)],
        "kernels_by_turn": kernel_rates_by_turn(tasks, mode),
    }
    levels = sorted({t.level for t in tasks})
    if len(levels) > 1:
        out["by_level"] = {lv: {"num_tasks": sum(t.level == lv for t in tasks),
                                **aggregate([t for t in tasks if t.level == lv], max_turns, ks, mode, fast_p)}
                           for lv in levels}
    if parallel_samples:
        out["fixed_budget"] = fixed_budget(tasks, budgets or [n], mode, fast_p)
    out["per_task"] = {t.task_id: {"trajectories": t.num_trajectories,
                                   **aggregate([t], max_turns, [t.num_trajectories], mode, fast_p)} for t in tasks}
    return out


def fixed_budget(tasks: Sequence[TaskKernels], budgets: Sequence[int], mode: str,
                 fast_p: Sequence[float] = FAST_P) -> list[dict[str, Any]]:
    """For each budget B: best@k after t turns for every k x t = B the data allows (unbiased best@k)."""
    n = min(t.num_trajectories for t in tasks)
    max_turns = max(t.max_turns for t in tasks)
    out = []
    for budget in budgets:
        if budget < 1:
            raise ValueError(f"kernel budgets must be positive, got {budget}")
        points = []
        for k, t in budget_points(budget, n, max_turns):
            agg = aggregate(tasks, t, [k], mode, fast_p)
            points.append({"trajectories": k, "turns": t, **_only_best(agg, k)})
        out.append({"budget": budget, "points": points})
    return out


def _only_best(agg: Mapping[str, Any], k: int) -> dict[str, Any]:
    """The best@k entries of an aggregate, flattened to {metric: value} per section."""
    out: dict[str, Any] = {}
    for key, value in agg.items():
        if isinstance(value, Mapping) and f"best@{k}" in value:
            out[key] = value[f"best@{k}"]
        elif isinstance(value, Mapping):
            out[key] = {m: (v[f"best@{k}"] if isinstance(v, Mapping) else v) for m, v in value.items()}
    return out
