"""The one-GPU demo's first-turn and per-trajectory curves from RL runs' TensorBoard logs: a table of block means (one
block = one pass over the task permutation, so that the task mix averages out) and a PNG.

    python analysis/demo_curves.py workdirs/demo/multi_seed0/tensorboard ... --block 3 --out docs/img/demo.png
    python analysis/demo_curves.py tensorboard_speed_seed0 tensorboard_speed_seed1 --block 1 --plot speed \
        --out docs/img/demo_speed.png       # mean speedup and fast_1 of correct kernels, all and per turn

Works on a run's <workdir>/tensorboard (named by the workdir; runs/demo.sh's runs are in workdirs/demo) or on a copied
tensorboard_<run> dir (named with the tensorboard_ prefix dropped).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from kevin_jax.logs import read_scalars

METRICS = {"first-turn correct": "rollout/turn0/correct_rate", "first-turn mean score": "rollout/turn0/mean_score",
           "first-turn parse rate": "rollout/turn0/format_ok_rate",
           "trajectories with a correct kernel": "rollout/best_of_trajectory/correct_rate",
           "correct, all kernels": "rollout/correct_rate", "mean score, all kernels": "rollout/score_mean",
           "second-turn parse rate": "rollout/turn1/format_ok_rate", "entropy (update 0)": "update0/entropy",
           # speed (kevin_jax.rl.speed_metrics): correct kernels only
           "mean speedup of correct kernels": "rollout/speed/mean_speedup",
           "fast_1 (correct kernels >= 1.0x)": "rollout/speed/fast_1",
           "fast_1.5 (correct kernels >= 1.5x)": "rollout/speed/fast_1.5",
           "first-turn mean speedup": "rollout/speed/turn0/mean_speedup",
           "first-turn fast_1": "rollout/speed/turn0/fast_1",
           "later-turn mean speedup (turn 2)": "rollout/speed/turn1/mean_speedup",
           "later-turn fast_1 (turn 2)": "rollout/speed/turn1/fast_1"}
PLOTS = {"correct": ("first-turn correct", "first-turn parse rate", "entropy (update 0)"),
         "speed": ("mean speedup of correct kernels", "fast_1 (correct kernels >= 1.0x)", "first-turn fast_1",
                   "later-turn fast_1 (turn 2)")}
PLOTTED = PLOTS["correct"]


def run_name(logdir: Path) -> str:
    return logdir.parent.name if logdir.name == "tensorboard" else logdir.name.removeprefix("tensorboard_")


def block_means(points: list[tuple[int, float]], block: int) -> list[float]:
    values = [v for _, v in sorted(points)]
    return [sum(values[i:i + block]) / len(values[i:i + block]) for i in range(0, len(values), block)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logdirs", nargs="+", type=Path)
    p.add_argument("--block", type=int, default=3, help="steps per block (steps per epoch of the task sampler)")
    p.add_argument("--out", type=Path, help="PNG of the plotted metrics (3-step means, faint: per step)")
    p.add_argument("--plot", choices=sorted(PLOTS), default="correct",
                   help="which metrics the PNG shows: correctness (default) or speed")
    args = p.parse_args()
    runs = {}
    for d in args.logdirs:
        if not d.is_dir():
            raise SystemExit(f"not a directory: {d}")
        runs[run_name(d)] = read_scalars(d)
    print(f"| run | metric | block means ({args.block} steps each) |\n|---|---|---|")
    for name, scalars in runs.items():
        for label, tag in METRICS.items():
            if tag in scalars:
                print(f"| {name} | {label} | {' '.join(f'{v:.2f}' for v in block_means(scalars[tag], args.block))} |")
    if args.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plotted = PLOTS[args.plot]
        fig, axes = plt.subplots(1, len(plotted), figsize=(5 * len(plotted), 4))
        for ax, label in zip(axes, plotted):
            for name, scalars in runs.items():
                points = sorted(scalars.get(METRICS[label], []))
                steps, values = [s for s, _ in points], [v for _, v in points]
                means = [sum(values[max(0, i - args.block + 1):i + 1]) / len(values[max(0, i - args.block + 1):i + 1])
                         for i in range(len(values))]
                line, = ax.plot(steps, means, label=name)
                ax.plot(steps, values, alpha=0.25, color=line.get_color())
            ax.set_title(f"{label} ({args.block}-step mean; faint: per step)")
            ax.set_xlabel("RL step")
            if label.startswith("entropy"):
                ax.set_yscale("log")
        axes[0].legend()
        fig.tight_layout()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=80)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
