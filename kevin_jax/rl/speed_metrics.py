"""Is the policy learning to write faster kernels, not only correct ones? The speed of a batch of scored turns.

One function, `speed_metrics(turns)`, over scored turns (env.episode's Turn objects or their Contract-4 dicts, so
the trainer and analysis/warm_start_demo_summary.py compute the same numbers), all kernels and per turn index:
- score_mean: the mean turn score (Kevin's S = 0.3 * correct + speedup * correct; 0 for anything not correct);
- correct_rate: the share of kernels that are correct (well formed, correct, no hack flag:
  env.reward.counts_as_correct);
- mean_speedup: the mean speedup over PyTorch eager of the correct kernels that have one (a correct kernel is always
  timed by the full evaluator; compile-only verdicts are never correct, so there is nothing to average there);
- fast_1, fast_1.5: the share of correct kernels whose speedup is >= 1.0x / >= 1.5x (Kevin's fast_p thresholds, here
  per kernel and among correct kernels: how much of what the policy gets right is also fast; a correct kernel without
  a speedup counts as not fast);
- correct_kernels: how many correct kernels the rates above are over.
A metric with nothing to average (no kernel, no correct kernel) is None. `speed_scalars` is the same for a step's
trajectories as flat floats under "speed/" (None dropped), which the trainer writes to TensorBoard; `log_text` is the
short form of the per-step log line.

Pure functions on plain data: no JAX, no evaluator.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from kevin_jax.env.reward import counts_as_correct
from kevin_jax.evaluation.metrics import fast_name as fast_key  # "fast_1", "fast_1.5": one naming for both

FAST_P = (1.0, 1.5)
PREFIX = "speed/"




def _get(obj: Any, key: str, default=None):
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def is_correct(turn: Any) -> bool:
    """Well formed by our parse and by the evaluator, correct, no hack flag (what scores above 0)."""
    parsed = _get(turn, "parsed") or {}
    return parsed.get("format_error") is None and counts_as_correct(_get(turn, "verdict") or {})


def speedup_of(turn: Any) -> float | None:
    """The speedup of a correct kernel, None for a kernel that is not correct or has no usable timing."""
    if not is_correct(turn):
        return None
    s = _get(_get(turn, "verdict") or {}, "speedup")
    return float(s) if isinstance(s, (int, float)) and s > 0 and s != float("inf") else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _group(turns: Sequence[Any], thresholds: Sequence[float]) -> dict[str, float | None]:
    correct = [t for t in turns if is_correct(t)]
    speedups = [s for s in map(speedup_of, correct) if s is not None]
    out = {"score_mean": _mean([float(_get(t, "score", 0.0) or 0.0) for t in turns]),
           "correct_rate": _mean([float(is_correct(t)) for t in turns]),
           "mean_speedup": _mean(speedups)}
    for p in thresholds:
        out[fast_key(p)] = _mean([float((speedup_of(t) or 0.0) >= p) for t in correct])
    out["correct_kernels"] = float(len(correct))
    return out


def speed_metrics(turns: Iterable[Any], thresholds: Sequence[float] = FAST_P) -> dict[str, float | None]:
    """{metric: value} over all the turns, and {"turn{i}/metric": value} per turn index (see the module docstring)."""
    turns = list(turns)
    out = _group(turns, thresholds)
    for i in sorted({int(_get(t, "turn", 0)) for t in turns}):
        out.update({f"turn{i}/{k}": v for k, v in _group([t for t in turns if int(_get(t, "turn", 0)) == i],
                                                           thresholds).items()})
    return out


def turns_of(trajectories: Iterable[Any]) -> list[Any]:
    """The scored turns of trajectories (Trajectory objects or Contract-4 dicts)."""
    return [t for traj in trajectories for t in (_get(traj, "turns") or [])]


def speed_scalars(trajectories: Iterable[Any], thresholds: Sequence[float] = FAST_P) -> dict[str, float]:
    """speed_metrics over the trajectories' turns as {"speed/<metric>": float}, undefined metrics left out."""
    return {PREFIX + k: float(v) for k, v in speed_metrics(turns_of(trajectories), thresholds).items()
            if v is not None}


def log_text(values: Mapping[str, float], prefix: str = PREFIX) -> str:
    """"speedup 0.84x, fast_1 0.21, fast_1.5 0.05" from speed_scalars' keys under `prefix` ("-" where undefined)."""
    def num(key: str, fmt: str) -> str:
        v = values.get(prefix + key)
        return "-" if v is None else format(v, fmt)

    return (f"speedup {num('mean_speedup', '.2f')}x, " + ", ".join(f"{fast_key(p)} {num(fast_key(p), '.2f')}"
                                                                   for p in FAST_P))
