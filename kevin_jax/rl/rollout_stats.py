"""Scalars that describe a batch of rollouts (what TensorBoard shows per step, under rollout/ and holdout/).

All functions read Contract-4 trajectories (kevin_jax.env.trajectory); whether a turn compiled, is correct and how
fast it is are the Turn's own properties. Each metric has one name: the speed of correct kernels (mean speedup,
fast_p, per turn too) is speed/... (kevin_jax.rl.speed_metrics), the rest is here.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from kevin_jax.env.trajectory import Trajectory, Turn
from kevin_jax.rl.speed_metrics import speed_scalars


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else float("nan")


# A token the sampler drew with probability below this is a "tail" token: with a memorised policy (per-token NLL
# ~0.01) one such draw is how a long copy of an earlier kernel derails (docs/LOG.md, "reward.baseline=turn_mean,
# both seeds").
TAIL_PROB = 0.05


def sampled_nll(logprobs: Sequence[float]) -> float:
    """Mean negative log-prob per sampled token (at the sampling temperature): how sharp the policy is where it went."""
    return -float(np.mean(logprobs)) if len(logprobs) else 0.0


def drew_tail_token(logprobs: Sequence[float]) -> bool:
    return bool(len(logprobs)) and float(np.min(logprobs)) < math.log(TAIL_PROB)


def thought_of(turn: Turn) -> str:
    thought = turn.parsed.get("thought")
    return turn.response_text if thought is None else thought


def rollout_scalars(trajectories: Sequence[Trajectory], num_turns: int, thought_prefix: str = "Okay") -> dict:
    """Per-turn correctness / score, best-of-trajectory, returns, advantages, lengths, "not okay" ratio, and the
    speed of correct kernels (speed/...)."""
    out: dict[str, float] = {}
    turns = [t for traj in trajectories for t in traj.turns]
    if not turns:
        return {"num_turn_samples": 0.0}
    for i in range(num_turns):
        at = [t for traj in trajectories for t in traj.turns if t.turn == i]
        if not at:
            continue
        out[f"turn{i}/correct_rate"] = _mean(t.correct for t in at)
        out[f"turn{i}/compiled_rate"] = _mean(t.compiled for t in at)
        out[f"turn{i}/format_ok_rate"] = _mean(t.well_formed for t in at)
        out[f"turn{i}/mean_score"] = _mean(t.score for t in at)
        # A turn whose samples are pushed down on average at every step (advantage.baseline, kevin_jax.rl.advantages).
        out[f"turn{i}/advantage_mean"] = _mean(t.advantage for t in at)
        # A turn that un-sharpens during RL: the failed seed's later turns (docs/LOG.md, "reward.baseline=turn_mean").
        out[f"turn{i}/sampled_nll"] = _mean(sampled_nll(t.response_logprobs) for t in at)
        out[f"turn{i}/tail_token_rate"] = _mean(drew_tail_token(t.response_logprobs) for t in at)
        out[f"turn{i}/samples"] = float(len(at))
    best = [max((t.score for t in traj.turns), default=0.0) for traj in trajectories]
    out["best_of_trajectory/score_mean"] = _mean(best)
    out["best_of_trajectory/correct_rate"] = _mean(any(t.correct for t in traj.turns) for traj in trajectories)
    best_speedups = [max((t.speedup or 0.0) for t in traj.turns if t.correct)
                     for traj in trajectories if any(t.correct for t in traj.turns)]
    out["best_of_trajectory/speedup_mean"] = _mean(best_speedups)
    out["best_of_trajectory/faster_than_torch_rate"] = _mean(
        any((t.speedup or 0.0) > 1.0 for t in traj.turns) for traj in trajectories)
    scores = np.array([t.score for t in turns])
    returns = np.array([t.return_ for t in turns])
    adv = np.array([t.advantage for t in turns])
    out.update({"score_mean": float(scores.mean()), "correct_rate": _mean(t.correct for t in turns),
                "compiled_rate": _mean(t.compiled for t in turns),
                "hack_flag_rate": _mean(t.flagged for t in turns),
                # speedups timed while the GPU ran the cached reference REF_DRIFT x slower than when it was cached
                # (another process on the GPU: cuda_eval.judge.job.Job._cached_reference_holds); should stay 0
                "timing_contended_rate": _mean(bool((t.verdict.get("meta") or {}).get("timing_contended"))
                                               for t in turns if t.verdict.get("speedup")),
                "return_mean": float(returns.mean()), "return_std": float(returns.std()),
                "return_max": float(returns.max()),
                "advantage_mean": float(adv.mean()), "advantage_std": float(adv.std()),
                "advantage_min": float(adv.min()), "advantage_max": float(adv.max()),
                "advantage_zero_fraction": float(np.mean(adv == 0.0)),
                "num_turn_samples": float(len(turns)), "num_trajectories": float(len(trajectories))})
    resp = np.array([len(t.response_tokens) for t in turns])
    prompt = np.array([len(t.prompt_tokens) for t in turns])
    out.update({"response_length_mean": float(resp.mean()), "response_length_max": float(resp.max()),
                "response_clipped_fraction": _mean(t.stop_reason == "length" for t in turns),
                "prompt_length_mean": float(prompt.mean()), "prompt_length_max": float(prompt.max()),
                "thought_complete_rate": _mean(bool(t.parsed.get("thought_complete", True)) for t in turns)})
    # Kevin's early warning of collapse: thoughts that no longer start the way the base model's do ("Okay").
    out["not_okay_ratio"] = _mean(not thought_of(t).lstrip().startswith(thought_prefix) for t in turns)
    out.update(speed_scalars(trajectories))
    return {k: v for k, v in out.items() if not math.isnan(v)}   # NaN (e.g. no correct kernel): no point
