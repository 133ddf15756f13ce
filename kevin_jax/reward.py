"""What a turn is worth: its score, the compile-only proxy score, and its return (config section `reward`).

One module decides it, and a turn is scored once, when the environment plays it (kevin_jax.env.episode, and its
replay of saved or external responses); everything after reads `Turn.score`:
- Score of one kernel: S = w * correct + f(speedup) * correct, w = 0.3, f = identity by default; 0 for a format
  failure (seen by our parse or by the evaluator) or any hack flag (a flagged kernel is not correct, whatever the
  trials said).
- Compile-only proxy: without a GPU nothing runs and every S would be 0, so a training run on compile-only verdicts
  scores a well-formed, unflagged kernel that compiled with rl.compile_only_score (else 0) instead (`scorer`).
- Return of turn t of a trajectory (gamma, return_aggregation): R_t = sum_{i>=t} gamma^(i-t) S_i ("sum", gamma = 0.4
  in Kevin) or R_t = max_{i>=t} gamma^(i-t) S_i ("max"); "single_turn" makes every turn its own sample (R_t = S_t).
Advantages (the `advantage` section) are RL's: kevin_jax.rl.advantages. Pure Python on plain data
(kevin_jax.env.trajectory.Turn, whose properties say what "correct" and "speedup" are), so saved trajectories can be
re-scored without the evaluator (`rescore_turns`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Sequence

import numpy as np

from kevin_jax.env.trajectory import Turn

SPEEDUP_TRANSFORMS = ("identity", "log", "clip")
RETURN_AGGREGATIONS = ("sum", "max", "single_turn")


@dataclasses.dataclass
class RewardConfig:
    """What a turn is worth: its kernel's score and its return (config section `reward`).

    correct_weight: w in S = w * correct + f(speedup) * correct (Kevin: 0.3).
    speedup_transform: f: "identity" (Kevin), "log" (natural log of the speedup; negative below 1x), or "clip"
      (min(speedup, speedup_clip)).
    speedup_clip: the cap of "clip".
    gamma: discount of later turns in the return (Kevin: 0.4).
    return_aggregation: how a turn's return combines its own and the later turns' discounted scores: "sum" (Kevin),
      "max", or "single_turn" (R_t = S_t: every turn its own sample). (How the loss combines tokens is
      rl.loss_aggregation.)
    """
    correct_weight: float = 0.3
    speedup_transform: str = "identity"
    speedup_clip: float = 10.0
    gamma: float = 0.4
    return_aggregation: str = "sum"

    def __post_init__(self):
        if self.speedup_transform not in SPEEDUP_TRANSFORMS:
            raise ValueError(f"reward.speedup_transform must be one of {SPEEDUP_TRANSFORMS}, got "
                             f"{self.speedup_transform!r}")
        if self.return_aggregation not in RETURN_AGGREGATIONS:
            raise ValueError(f"reward.return_aggregation must be one of {RETURN_AGGREGATIONS}, got "
                             f"{self.return_aggregation!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"reward.gamma must be in [0, 1], got {self.gamma}")
        if self.speedup_clip <= 0:
            raise ValueError(f"reward.speedup_clip must be positive, got {self.speedup_clip}")


def transform_speedup(speedup: float | None, config: RewardConfig) -> float:
    """f(speedup); a missing or non-finite speedup contributes 0 (correctness is still credited)."""
    if speedup is None or not math.isfinite(speedup) or speedup <= 0:
        return 0.0
    if config.speedup_transform == "log":
        return math.log(speedup)
    if config.speedup_transform == "clip":
        return min(speedup, config.speedup_clip)
    return float(speedup)


def turn_score(turn: Turn, config: RewardConfig) -> float:
    """S of one turn: w + f(speedup) for a correct kernel (Turn.correct: well formed on both sides, correct, no hack
    flag), else 0."""
    if not turn.correct:
        return 0.0
    return config.correct_weight + transform_speedup(turn.speedup, config)


def compile_only_score(turn: Turn, credit: float) -> float:
    """The proxy score of a compile-only verdict: `credit` for a well-formed, unflagged kernel that compiled, else 0."""
    return credit if turn.ok("compile_only") else 0.0


def scorer(config: RewardConfig, compile_only_credit: float | None = None) -> Callable[[Turn], float]:
    """The score of a turn as the environment gives it: turn_score, or with a `compile_only_credit` (a training run on
    compile-only verdicts) the compile-only proxy."""
    if compile_only_credit is None:
        return lambda turn: turn_score(turn, config)
    return lambda turn: compile_only_score(turn, compile_only_credit)


def rescore_turns(turns: Iterable[Turn], score: Callable[[Turn], float]) -> None:
    """Sets every turn's score from its saved parse and verdict (in place): a replay, or --rescore under another
    reward section."""
    for turn in turns:
        turn.score = float(score(turn))


def discounted_returns(scores: Sequence[float], config: RewardConfig) -> np.ndarray:
    """R_t of one trajectory's per-turn scores."""
    scores = np.asarray(scores, dtype=np.float64)
    if config.return_aggregation == "single_turn":
        return scores.copy()
    returns = np.empty_like(scores)
    later = None
    for t in range(len(scores) - 1, -1, -1):
        if later is None:
            returns[t] = scores[t]
        elif config.return_aggregation == "sum":
            returns[t] = scores[t] + config.gamma * later
        else:  # max_{i>=t} gamma^(i-t) S_i = max(S_t, gamma * R_{t+1})
            returns[t] = max(scores[t], config.gamma * later)
        later = returns[t]
    return returns
