"""Is the policy learning to write faster kernels, not only correct ones? The speed of a batch of scored turns.

One function, `speed_metrics(turns)`, over scored turns (kevin_jax.env.trajectory.Turn, so that the trainer and
analysis/warm_start_demo_summary.py compute the same numbers), all kernels and per turn index:
- score_mean: the mean turn score (Kevin's S = 0.3 * correct + speedup * correct; 0 for anything not correct);
- correct_rate: the share of kernels that are correct (Turn.correct: well formed, correct, no hack flag);
- mean_speedup: the mean speedup over PyTorch eager of the correct kernels that have one (Turn.speedup; a correct
  kernel is always timed by the full evaluator; compile-only verdicts are never correct, so there is nothing to
  average there);
- fast_1, fast_1.5: the share of correct kernels whose speedup is >= 1.0x / >= 1.5x (Kevin's fast_p thresholds, here
  per kernel and among correct kernels: how much of what the policy gets right is also fast; a correct kernel without
  a speedup counts as not fast);
- correct_kernels: how many correct kernels the rates above are over.
A metric with nothing to average (no kernel, no correct kernel) is None. `speed_scalars` is what the trainer writes
to TensorBoard for a step's trajectories, as flat floats under "speed/" (None dropped): the speed metrics only, since
score_mean and correct_rate are logged once, by kevin_jax.rl.rollout_stats (rollout/score_mean, rollout/correct_rate,
rollout/turn{i}/mean_score, rollout/turn{i}/correct_rate); `log_text` is the short form of the per-step log line.

Pure functions on plain data: no JAX, no evaluator.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from kevin_jax.env.trajectory import Trajectory, Turn, turns_of

FAST_P = (1.0, 1.5)
PREFIX = "speed/"
# Logged by rollout_stats under their own names: not repeated under speed/.
LOGGED_ELSEWHERE = ("score_mean", "correct_rate")


def fast_key(p: float) -> str:
    """"fast_1", "fast_1.5", "fast_2": the one name of a fast_p metric (kevin_jax.evaluation.metrics uses it too)."""
    return f"fast_{p:g}"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _group(turns: Sequence[Turn], thresholds: Sequence[float]) -> dict[str, float | None]:
    correct = [t for t in turns if t.correct]
    speedups = [t.speedup for t in correct if t.speedup is not None]
    out = {"score_mean": _mean([float(t.score) for t in turns]),
           "correct_rate": _mean([float(t.correct) for t in turns]),
           "mean_speedup": _mean(speedups)}
    for p in thresholds:
        out[fast_key(p)] = _mean([float((t.speedup or 0.0) >= p) for t in correct])
    out["correct_kernels"] = float(len(correct))
    return out


def speed_metrics(turns: Iterable[Turn], thresholds: Sequence[float] = FAST_P) -> dict[str, float | None]:
    """{metric: value} over all the turns, and {"turn{i}/metric": value} per turn index (see the module docstring)."""
    turns = list(turns)
    out = _group(turns, thresholds)
    for i in sorted({t.turn for t in turns}):
        out.update({f"turn{i}/{k}": v for k, v in _group([t for t in turns if t.turn == i], thresholds).items()})
    return out


def speed_scalars(trajectories: Iterable[Trajectory], thresholds: Sequence[float] = FAST_P) -> dict[str, float]:
    """The speed metrics over the trajectories' turns as {"speed/<metric>": float}, undefined metrics left out, and
    score_mean / correct_rate left to rollout_stats (one name per metric)."""
    return {PREFIX + k: float(v) for k, v in speed_metrics(turns_of(trajectories), thresholds).items()
            if v is not None and k.rpartition("/")[2] not in LOGGED_ELSEWHERE}


def log_text(values: Mapping[str, float], prefix: str = PREFIX) -> str:
    """"speedup 0.84x, fast_1 0.21, fast_1.5 0.05" from speed_scalars' keys under `prefix` ("-" where undefined)."""
    def num(key: str, fmt: str) -> str:
        v = values.get(prefix + key)
        return "-" if v is None else format(v, fmt)

    return (f"speedup {num('mean_speedup', '.2f')}x, " + ", ".join(f"{fast_key(p)} {num(fast_key(p), '.2f')}"
                                                                   for p in FAST_P))
