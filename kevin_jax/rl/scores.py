"""What each turn is worth: kernel scores, multi-turn returns and per-task normalised advantages (Kevin).

- Score of one kernel: S = w * correct + f(speedup) * correct, w = 0.3, f = identity by default; 0 for a format
  failure or any hack flag (a flagged kernel is not correct, whatever the trials said).
- Return of turn t of a trajectory: R_t = sum_{i>=t} gamma^(i-t) S_i ("sum", gamma = 0.4 in Kevin) or
  R_t = max_{i>=t} gamma^(i-t) S_i ("max"); "single_turn" makes every turn its own sample (R_t = S_t).
- Advantages: per task, over all turn-samples of all its trajectories (16 x 4 = 64 in Kevin): (R - baseline) / std,
  baseline = the group mean, or for each sample the mean of the others ("leave_one_out"), or the mean of the task's
  samples at the same turn ("turn_mean"); std is always the task's; `normalize_std=False` drops the std division
  (Dr. GRPO). Why "turn_mean": with one baseline for all turns, an early turn's return sums more discounted scores
  than a late one's, so the last turn's samples get a negative advantage on average (about -0.3 to -0.6 std at
  every step of the demo runs, while last-turn kernels got worse: docs/LOG.md, "Kevin's one baseline for all turns
  pushes the last turn down at every step"). A per-turn baseline removes
  that offset and keeps the std (the step size) of the whole task.
Pure numpy on plain data: verdicts are `EvalResult.to_dict()` dicts (or anything with the same attributes), so saved
trajectories can be re-scored without the evaluator.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

SPEEDUP_TRANSFORMS = ("identity", "log", "clip")
AGGREGATIONS = ("sum", "max", "single_turn")
BASELINES = ("mean", "leave_one_out", "turn_mean")


@dataclasses.dataclass
class RewardConfig:
    """Rewards, returns and advantages (config section `reward`).

    correct_weight: w in S = w * correct + f(speedup) * correct (Kevin: 0.3).
    speedup_transform: f: "identity" (Kevin), "log" (natural log of the speedup; negative below 1x), or "clip"
      (min(speedup, speedup_clip)).
    speedup_clip: the cap of "clip".
    gamma: discount of later turns in the return (Kevin: 0.4).
    aggregation: "sum" (Kevin) or "max" over discounted later scores, or "single_turn" (R_t = S_t).
    normalize_std: divide advantages by the per-task std of returns (Kevin: yes; Dr. GRPO: no).
    baseline: "mean" of the task's returns (Kevin), "leave_one_out" (the mean of the other samples), or "turn_mean"
      (the mean of the task's samples at the same turn; see the module docstring).
    std_eps: added to the std before dividing.
    """
    correct_weight: float = 0.3
    speedup_transform: str = "identity"
    speedup_clip: float = 10.0
    gamma: float = 0.4
    aggregation: str = "sum"
    normalize_std: bool = True
    baseline: str = "mean"
    std_eps: float = 1e-6

    def __post_init__(self):
        if self.speedup_transform not in SPEEDUP_TRANSFORMS:
            raise ValueError(f"reward.speedup_transform must be one of {SPEEDUP_TRANSFORMS}, got "
                             f"{self.speedup_transform!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"reward.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"reward.baseline must be one of {BASELINES}, got {self.baseline!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"reward.gamma must be in [0, 1], got {self.gamma}")
        if self.speedup_clip <= 0:
            raise ValueError(f"reward.speedup_clip must be positive, got {self.speedup_clip}")


def _get(verdict: Any, key: str, default=None):
    if isinstance(verdict, Mapping):
        return verdict.get(key, default)
    return getattr(verdict, key, default)


def counts_as_correct(verdict: Any) -> bool:
    """Correct, well formed and with no hack flag."""
    return (_get(verdict, "correct") is True and _get(verdict, "format_ok", True) is True
            and not _get(verdict, "hack_flags"))


def transform_speedup(speedup: float | None, config: RewardConfig) -> float:
    """f(speedup); a missing or non-finite speedup contributes 0 (correctness is still credited)."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return 0.0
    if config.speedup_transform == "log":
        return math.log(speedup)
    if config.speedup_transform == "clip":
        return min(speedup, config.speedup_clip)
    return float(speedup)


def kernel_score(verdict: Any, config: RewardConfig) -> float:
    if not counts_as_correct(verdict):
        return 0.0
    return config.correct_weight + transform_speedup(_get(verdict, "speedup"), config)


def discounted_returns(scores: Sequence[float], config: RewardConfig) -> np.ndarray:
    """R_t of one trajectory's per-turn scores."""
    scores = np.asarray(scores, dtype=np.float64)
    if config.aggregation == "single_turn":
        return scores.copy()
    returns = np.empty_like(scores)
    later = None
    for t in range(len(scores) - 1, -1, -1):
        if later is None:
            returns[t] = scores[t]
        elif config.aggregation == "sum":
            returns[t] = scores[t] + config.gamma * later
        else:  # max_{i>=t} gamma^(i-t) S_i = max(S_t, gamma * R_{t+1})
            returns[t] = max(scores[t], config.gamma * later)
        later = returns[t]
    return returns


def normalized_advantages(returns: Sequence[float], config: RewardConfig,
                          turns: Sequence[int] | None = None) -> np.ndarray:
    """Advantages of one group (all turn-samples of one task); `turns` (each sample's turn index) is needed by the
    "turn_mean" baseline only."""
    r = np.asarray(returns, dtype=np.float64)
    n = len(r)
    if n == 0:
        return r.copy()
    if config.baseline == "leave_one_out":
        baseline = (r.sum() - r) / (n - 1) if n > 1 else r  # one sample: nothing to compare with, advantage 0
    elif config.baseline == "turn_mean":
        if turns is None or len(turns) != n:
            raise ValueError(f"reward.baseline='turn_mean' needs the turn index of each of the {n} samples, got "
                             f"{None if turns is None else len(turns)}")
        t = np.asarray(turns)
        baseline = np.empty(n)
        for turn in np.unique(t):
            baseline[t == turn] = r[t == turn].mean()
    else:
        baseline = np.full(n, r.mean())
    adv = r - baseline
    if config.normalize_std:
        adv = adv / (r.std() + config.std_eps)
    return adv


def group_advantages(returns: Sequence[float], groups: Sequence[Hashable], config: RewardConfig,
                     turns: Sequence[int] | None = None) -> np.ndarray:
    """Advantages of a flat batch of turn-samples, normalised within each group (task id); `turns` as in
    normalized_advantages."""
    r = np.asarray(returns, dtype=np.float64)
    if len(r) != len(groups):
        raise ValueError(f"{len(r)} returns but {len(groups)} group labels")
    if turns is not None and len(turns) != len(r):
        raise ValueError(f"{len(r)} returns but {len(turns)} turn indices")
    out = np.empty_like(r)
    index: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    for idx in index.values():
        out[idx] = normalized_advantages(r[idx], config, None if turns is None else [turns[i] for i in idx])
    return out
