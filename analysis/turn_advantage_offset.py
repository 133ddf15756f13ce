"""How far each turn's samples sit from Kevin's one all-turn baseline, from RL runs' TensorBoard logs alone (runs
logged before `rollout/turn{i}/advantage_mean` existed; newer runs log it, and the demo summary prints it).

    python analysis/turn_advantage_offset.py $OUT/tensorboard_multi_seed0 $OUT/tensorboard_multi_seed1

With "sum" returns the expected return of turn t is the discounted sum of the later turns' mean scores (linearity),
so per step: E[R_t] from rollout/turn{t}/mean_score, minus the mean of E[R_t] over turns (every turn has the same
number of samples), in units of rollout/return_std. An approximation of the logged advantages: the real baseline
and std are per task, and trajectories cut short change the turn counts (docs/LOG.md,
"Kevin's one baseline for all turns pushes the last turn down").
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from demo_curves import run_name       # sibling analysis script (this file's folder is sys.path[0])
from kevin_jax.reward import RewardConfig
from kevin_jax.logs import read_scalars
from kevin_jax.reward import discounted_returns


def turn_offsets(scalars: dict, gamma: float) -> np.ndarray:
    """[turn, step] offsets of E[R_t] from the all-turn mean, in return-std units."""
    turns = sorted(int(k.split("/")[1][4:]) for k in scalars
                   if k.startswith("rollout/turn") and k.endswith("/mean_score"))
    if not turns:
        raise SystemExit("no rollout/turn*/mean_score scalars: not an RL run's tensorboard dir?")
    scores = np.array([[v for _, v in sorted(scalars[f"rollout/turn{t}/mean_score"])] for t in turns])
    returns = np.stack([discounted_returns(col, RewardConfig(gamma=gamma)) for col in scores.T], axis=1)
    std = np.array([v for _, v in sorted(scalars["rollout/return_std"])])
    return (returns - returns.mean(axis=0)) / std


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logdirs", nargs="+", type=Path)
    p.add_argument("--gamma", type=float, default=0.4, help="reward.gamma of the runs")
    args = p.parse_args()
    print("| run | turn | offset / return std, per step | min | max |")
    print("|---|---|---|---|---|")
    for d in args.logdirs:
        offsets = turn_offsets(read_scalars(d), args.gamma)
        for t, row in enumerate(offsets):
            per_step = " ".join(f"{x:+.2f}" for x in row)
            print(f"| {run_name(d)} | {t} | {per_step} | {row.min():+.2f} | {row.max():+.2f} |")


if __name__ == "__main__":
    main()
