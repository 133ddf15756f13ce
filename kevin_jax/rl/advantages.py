"""Per-task normalised advantages (Kevin) from the returns of the scored turns, and the `advantage` config section.

A turn's score and return are kevin_jax.reward's, set once when the turn is played (Turn.score); here:
- Advantages: per task, over all turn-samples of all its trajectories (16 x 4 = 64 in Kevin): (R - baseline) / std,
  baseline = the group mean, or for each sample the mean of the others ("leave_one_out"), or the mean of the task's
  samples at the same turn ("turn_mean"); std is always the task's; `normalize_std=False` drops the std division
  (Dr. GRPO). Why "turn_mean": with one baseline for all turns, an early turn's return sums more discounted scores
  than a late one's, so the last turn's samples get a negative advantage on average (about -0.3 to -0.6 std at every
  step of the demo runs, while last-turn kernels got worse: docs/LOG.md, "Kevin's one baseline for all turns pushes
  the last turn down at every step"). A per-turn baseline removes that offset and keeps the std (the step size) of
  the whole task.
Pure numpy on plain data, so saved trajectories can be re-scored without the evaluator (`rescore`).
"""
from __future__ import annotations

import dataclasses
from typing import Hashable, Sequence

import numpy as np

from kevin_jax.env.trajectory import Trajectory
from kevin_jax.reward import RewardConfig, discounted_returns, rescore_turns, turn_score

BASELINES = ("mean", "leave_one_out", "turn_mean")


@dataclasses.dataclass
class AdvantageConfig:
    """How a task's returns become advantages (config section `advantage`).

    baseline: subtracted from each return: "mean" of the task's returns (Kevin), "leave_one_out" (the mean of the
      other samples), or "turn_mean" (the mean of the task's samples at the same turn; the module docstring says why).
    normalize_std: divide by the per-task std of returns (Kevin: yes; Dr. GRPO: no).
    std_eps: added to the std before dividing.
    """
    baseline: str = "mean"
    normalize_std: bool = True
    std_eps: float = 1e-6

    def __post_init__(self):
        if self.baseline not in BASELINES:
            raise ValueError(f"advantage.baseline must be one of {BASELINES}, got {self.baseline!r}")


def normalized_advantages(returns: Sequence[float], config: AdvantageConfig,
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
            raise ValueError(f"advantage.baseline='turn_mean' needs the turn index of each of the {n} samples, got "
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


def group_advantages(returns: Sequence[float], groups: Sequence[Hashable], config: AdvantageConfig,
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


def assign_returns(trajectories: Sequence[Trajectory], reward: RewardConfig, advantage: AdvantageConfig) -> None:
    """Fills return and advantage of every turn in place from the scores the turns were given when played
    (Turn.score): returns within each trajectory, advantages over all turn-samples of the same task."""
    returns, groups, turns = [], [], []
    for traj in trajectories:
        for t, r in zip(traj.turns, discounted_returns([t.score for t in traj.turns], reward)):
            t.return_ = float(r)
            returns.append(r)
            groups.append(traj.task_id)
            turns.append(t)
    for t, a in zip(turns, group_advantages(returns, groups, advantage, [t.turn for t in turns])):
        t.advantage = float(a)


def rescore(trajectories: Sequence[Trajectory], reward: RewardConfig,
            advantage: AdvantageConfig) -> list[Trajectory]:
    """Copies of the trajectories, re-scored from their saved verdicts under these sections (no evaluator needed)."""
    out = [t.copy() for t in trajectories]
    rescore_turns((turn for traj in out for turn in traj.turns), lambda turn: turn_score(turn, reward))
    assign_returns(out, reward, advantage)
    return out
