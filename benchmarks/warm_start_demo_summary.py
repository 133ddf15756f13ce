"""Issue 9's numbers from RL workdirs: per step, mean score, correct fraction, share of fast kernels among correct ones
(speedup > 1), and kernels evaluated; a table, a JSON file and PNG curves.

    python benchmarks/warm_start_demo_summary.py workdirs/demo/multi_seed0 workdirs/demo/multi_seed1 \
        workdirs/demo/single_seed0 --out /tmp/demo_summary

Reads <workdir>/trajectories/step_*.jsonl (Contract 4), so every number is recomputed from the verdicts themselves.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def step_stats(path: Path) -> dict:
    turns = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                turns += json.loads(line)["turns"]
    verdicts = [t.get("verdict") or {} for t in turns]
    correct = [v for v, t in zip(verdicts, turns)
               if v.get("correct") is True and not v.get("hack_flags") and t["parsed"].get("format_error") is None]
    fast = [v for v in correct if (v.get("speedup") or 0.0) > 1.0]
    n = max(1, len(turns))
    return {"kernels": len(turns), "score_mean": sum(t.get("score", 0.0) for t in turns) / n,
            "correct_fraction": len(correct) / n,
            "compiled_fraction": sum(v.get("compiled") is True for v in verdicts) / n,
            "fast_share_of_correct": len(fast) / len(correct) if correct else None}


def run_stats(workdir: Path) -> list[dict]:
    files = sorted((workdir / "trajectories").glob("step_*.jsonl"),
                   key=lambda p: int(re.search(r"(\d+)", p.stem).group(1)))
    if not files:
        raise SystemExit(f"{workdir}: no trajectories/step_*.jsonl (was the run started with log.trajectories?)")
    out = []
    for p in files:
        stats = step_stats(p)
        stats["step"] = int(re.search(r"(\d+)", p.stem).group(1))
        out.append(stats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {w.name: run_stats(w) for w in args.workdirs}
    print("| run | step | kernels | mean score | correct | compiled | fast among correct |")
    print("|---|---|---|---|---|---|---|")
    for name, steps in runs.items():
        for s in steps:
            fast = "-" if s["fast_share_of_correct"] is None else f"{s['fast_share_of_correct']:.2f}"
            print(f"| {name} | {s['step']} | {s['kernels']} | {s['score_mean']:.3f} | {s['correct_fraction']:.3f} | "
                  f"{s['compiled_fraction']:.3f} | {fast} |")
    (args.out / "summary.json").write_text(json.dumps(runs, indent=1) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG")
        return
    for key, label in (("score_mean", "mean score"), ("correct_fraction", "correct fraction")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, steps in runs.items():
            ax.plot([s["step"] for s in steps], [s[key] for s in steps], marker="o", label=name)
        ax.set_xlabel("RL step")
        ax.set_ylabel(label)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.out / f"{key}.png", dpi=120)
        plt.close(fig)
    print(f"wrote {args.out}/summary.json, score_mean.png, correct_fraction.png")


if __name__ == "__main__":
    main()
