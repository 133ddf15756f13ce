"""The one-GPU demo's numbers (configs/warm_start_demo.py) from RL workdirs: per step, mean score, correct fraction,
share of fast kernels among correct ones (speedup > 1), kernels evaluated, format-ok share, stop reasons and the
commonest format errors; a table, a JSON file, PNG curves and samples_<run>.txt (the first responses of the first and
last step). Then the demo's criterion, fixed before the runs it judged (docs/LOG.md, "both multi-turn seeds learn the
first turn"): per run, all-kernel correct fraction and mean score, mean of the last 3 steps against step 1, each
higher by >= 0.05; first-turn correct fraction alongside; and how noisy that test is (the correct fraction's slope,
its standard error and the scatter around the trend). Last, per turn index, correct fraction, format-ok share, mean
advantage, the sampled tokens' mean NLL and the share of responses with a token drawn from the tail, at step 1 and
over the last 3 steps: a turn that gets worse while another gets better, a turn whose samples are pushed down on
average (docs/LOG.md, "Kevin's one baseline for all turns pushes the last turn down"), and a turn that un-sharpens
(docs/LOG.md, "reward.baseline=turn_mean, both seeds").
Speed (kevin_jax.rl.speed_metrics, the numbers the trainer logs as rollout/speed/*): per step the mean speedup of
correct kernels, the share of correct kernels at >= 1.0x and >= 1.5x (fast_1, fast_1.5), overall and per turn; their
slopes with standard errors; and the speed criterion written before the speed demo (docs/LOG.md, "speed variants"):
per run, the mean of the last 3 steps against step 1, mean speedup of correct kernels up by >= 0.15, fast_1 up by
>= 0.15, and the all-kernel correct fraction down by no more than 0.05. PNG curves of the mean speedup and of fast_1
(all kernels, and per turn). Last, the pace of each run on equal terms (gain per step over the steps every run
has, gain per minute of RL wall time from TensorBoard's time/step over the minutes every run has, and where each ends
up), with the same curves against wall minutes (speed_minutes.png): multi-turn against single-turn at the same kernels
per step.

    python analysis/warm_start_demo_summary.py workdirs/demo/multi_seed0 workdirs/demo/multi_seed1 \
        workdirs/demo/single_seed0 --out /tmp/demo_summary

Reads <workdir>/trajectories/step_*.jsonl (Contract 4, kevin_jax.env.trajectory: the one reader, and the Turn's own
words for compiled, correct and speedup), so every number is recomputed from the verdicts themselves.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout
from kevin_jax.env.trajectory import Turn, read_trajectories  # noqa: E402
from kevin_jax.rl.rollout_stats import TAIL_PROB, drew_tail_token, sampled_nll  # noqa: E402
from kevin_jax.rl.speed_metrics import speed_metrics  # noqa: E402


def load_turns(path: Path) -> list[tuple[str, Turn]]:
    """Every turn of a step file, with its task id."""
    trajectories, _ = read_trajectories(path)
    return [(traj.task_id, t) for traj in trajectories for t in traj.turns]


def fast_thresholds(measured: dict | None, min_ratio: float = 1.5) -> dict[str, float]:
    """Per task with a measured slow/fast pair (benchmarks/builtin_speed_variants.py's JSON; the pairs the corpus
    generator gives the speed mix): the geometric mean of the slowest and fastest measured-correct speedups. A correct
    kernel at or above it counts as the fast variant."""
    out = {}
    for task_id, sols in ((measured or {}).get("solutions") or {}).items():
        speeds = sorted(e["speedup"] for e in sols.values() if e.get("correct") is True and (e.get("speedup") or 0) > 0)
        if len(speeds) >= 2 and speeds[-1] >= min_ratio * speeds[0]:
            out[task_id] = (speeds[0] * speeds[-1]) ** 0.5
    return out


def fast_variant_share(turns: list[tuple[str, Turn]], thresholds: dict[str, float],
                       turn: int | None = None) -> float | None:
    """Among correct kernels of the tasks in `thresholds` (all turns, or one turn index): the share at or above their
    task's threshold, i.e. the fast variant (None without such a kernel)."""
    ok = [(task_id, t) for task_id, t in turns
          if task_id in thresholds and t.correct and (turn is None or t.turn == turn)]
    if not ok:
        return None
    return sum((t.speedup or 0.0) >= thresholds[task_id] for task_id, t in ok) / len(ok)


def step_stats(path: Path, thresholds: dict[str, float] | None = None) -> dict:
    with_tasks = load_turns(path)
    turns = [t for _, t in with_tasks]
    correct = [t for t in turns if t.correct]
    fast = [t for t in correct if (t.speedup or 0.0) > 1.0]
    n = max(1, len(turns))
    # why answers never reached the compiler: a run with no compiled kernel is diagnosed from these (docs/LOG.md)
    format_errors = Counter((t.parsed.get("format_error") or "")[:80] for t in turns
                            if t.parsed.get("format_error") is not None)
    per_turn = {}
    for i in sorted({t.turn for t in turns}):
        at = [t for t in turns if t.turn == i]
        per_turn[str(i)] = {"correct_fraction": sum(t.correct for t in at) / len(at),
                            "format_ok_fraction": sum(t.well_formed for t in at) / len(at),
                            "advantage_mean": sum(t.advantage for t in at) / len(at),
                            "sampled_nll": sum(sampled_nll(t.response_logprobs) for t in at) / len(at),
                            "tail_token_fraction": sum(drew_tail_token(t.response_logprobs) for t in at) / len(at)}
    return {"kernels": len(turns), "score_mean": sum(t.score for t in turns) / n,
            "correct_fraction": len(correct) / n,
            "first_turn_correct_fraction": per_turn.get("0", {}).get("correct_fraction", 0.0),
            "compiled_fraction": sum(t.compiled for t in turns) / n,
            "fast_share_of_correct": len(fast) / len(correct) if correct else None,
            "format_ok_fraction": sum(t.well_formed for t in turns) / n,
            "format_errors": dict(format_errors.most_common(5)),
            "stop_reasons": dict(Counter(t.stop_reason for t in turns)),
            "response_tokens_mean": sum(len(t.response_tokens) for t in turns) / n,
            "per_turn": per_turn, "speed": {**speed_metrics(turns), **_fast_variant(with_tasks, thresholds or {})}}


def _fast_variant(turns: list[tuple[str, Turn]], thresholds: dict[str, float]) -> dict:
    if not thresholds:
        return {}
    out = {"fast_variant": fast_variant_share(turns, thresholds)}
    for i in sorted({t.turn for _, t in turns}):
        out[f"turn{i}/fast_variant"] = fast_variant_share(turns, thresholds, i)
    return out


CRITERION_LAST_STEPS = 3
CRITERION_MARGIN = 0.05


def criterion(steps: list[dict], last: int = CRITERION_LAST_STEPS, margin: float = CRITERION_MARGIN) -> dict:
    """Step 1 against the mean of the last `last` steps, for all-kernel correct fraction and mean score (and the
    first turn's correct fraction, reported only); passes when both all-kernel values rose by >= `margin`. A run
    needs more than `last` steps to be judged."""
    out = {"steps": len(steps), "judged": len(steps) > last}
    for key in ("correct_fraction", "score_mean", "first_turn_correct_fraction"):
        start, tail = steps[0][key], [s[key] for s in steps[-last:]]
        out[key] = {"step_1": start, f"last_{last}_mean": sum(tail) / len(tail), "delta": sum(tail) / len(tail) - start}
    out["passed"] = out["judged"] and all(out[k]["delta"] >= margin for k in ("correct_fraction", "score_mean"))
    return out


def trend_noise(values: list[float], last: int = CRITERION_LAST_STEPS) -> dict:
    """How much one step's value scatters around the run's straight-line trend (least squares; residual SD with 2
    degrees of freedom spent), the slope per step with its standard error (SD / sqrt(sum (x - mean x)^2): a test of
    the rise that uses every step, not only the first and the last three), and the standard error that scatter puts
    on the criterion's "mean of the last `last` steps minus step 1" (SD * sqrt(1 + 1/last)). Needs more than 2 steps."""
    y = np.asarray(values, float)
    if len(y) < 3:
        return {"slope_per_step": None, "slope_se": None, "residual_sd": None, "criterion_se": None}
    x = np.arange(len(y))
    fit = np.polyfit(x, y, 1)
    sd = float((y - np.polyval(fit, x)).std(ddof=2))
    return {"slope_per_step": float(fit[0]), "slope_se": sd / float(((x - x.mean()) ** 2).sum()) ** 0.5,
            "residual_sd": sd, "criterion_se": sd * (1 + 1 / last) ** 0.5}


SPEED_MARGINS = {"mean_speedup": 0.15, "fast_share": 0.15}     # both must rise by at least this much
CORRECT_DROP_ALLOWED = 0.05                                 # the all-kernel correct fraction may fall this much
SPEED_KEYS = ("mean_speedup", "fast_share", "fast_1", "fast_1.5", "score_mean")


def speed_series(steps: list[dict], key: str, turn: int | None = None) -> list[float | None]:
    """A speed metric per step (None where undefined: no correct kernel), all turns or one turn index."""
    if key == "fast_share":     # the fast-variant share where measured pairs are known, else fast_1
        key = "fast_variant" if any("fast_variant" in s["speed"] for s in steps) else "fast_1"
    name = key if turn is None else f"turn{turn}/{key}"
    return [s["speed"].get(name) for s in steps]


def speed_criterion(steps: list[dict], last: int = CRITERION_LAST_STEPS) -> dict:
    """The speed demo's criterion (fixed before its run, docs/LOG.md): step 1 against the mean of the last `last`
    steps; passes when the mean speedup of correct kernels and the fast share each rose by >= SPEED_MARGINS and the
    all-kernel correct fraction fell by no more than CORRECT_DROP_ALLOWED. Needs more than `last` steps, and a
    defined value at step 1 and in the last steps."""
    out = {"steps": len(steps), "judged": len(steps) > last,
           "fast_share_is": "fast_variant" if any("fast_variant" in s["speed"] for s in steps) else "fast_1"}
    for key in SPEED_KEYS:
        values = speed_series(steps, key)
        tail = [v for v in values[-last:] if v is not None]
        start = values[0]
        mean_tail = sum(tail) / len(tail) if tail else None
        out[key] = {"step_1": start, f"last_{last}_mean": mean_tail,
                    "delta": None if start is None or mean_tail is None else mean_tail - start}
    c = criterion(steps, last)["correct_fraction"]
    out["correct_fraction"] = c
    out["judged"] = out["judged"] and all(out[k]["delta"] is not None for k in SPEED_MARGINS)
    out["passed"] = (out["judged"] and all(out[k]["delta"] >= m for k, m in SPEED_MARGINS.items())
                     and c["delta"] >= -CORRECT_DROP_ALLOWED)
    return out


def speed_noise(steps: list[dict]) -> dict:
    """trend_noise (slope per step with its SE) of the mean speedup and fast_1, over the steps where defined."""
    return {key: trend_noise([v for v in speed_series(steps, key) if v is not None])
            for key in ("mean_speedup", "fast_share", "fast_1")}


def per_turn_change(steps: list[dict], last: int = CRITERION_LAST_STEPS) -> dict:
    """{turn: {metric: (step 1, mean of the last `last` steps)}} over the turns present at step 1."""
    tail = steps[-last:]
    out = {}
    for turn, first in steps[0]["per_turn"].items():
        rows = [s["per_turn"][turn] for s in tail if turn in s["per_turn"]]
        out[turn] = {k: (v, sum(r[k] for r in rows) / len(rows) if rows else None) for k, v in first.items()}
    return out


def step_files(workdir: Path) -> list[tuple[int, Path]]:
    files = sorted((int(re.search(r"(\d+)", p.stem).group(1)), p)
                   for p in (workdir / "trajectories").glob("step_*.jsonl"))
    if not files:
        raise SystemExit(f"{workdir}: no trajectories/step_*.jsonl (was the run started with log.trajectories?)")
    return files


def run_stats(workdir: Path, thresholds: dict[str, float] | None = None) -> list[dict]:
    return [{**step_stats(p, thresholds), "step": step} for step, p in step_files(workdir)]


def step_minutes(workdir: Path) -> dict[int, float]:
    """Wall minutes of RL at the end of each step: the running sum of the trainer's `time/step` scalar (TensorBoard
    files under <workdir>/tensorboard); {} where there are none. A resumed step's later value replaces the earlier."""
    if not (workdir / "tensorboard").is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(workdir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    if "time/step" not in acc.Tags().get("scalars", []):
        return {}
    seconds = {e.step: e.value for e in acc.Scalars("time/step")}
    out, total = {}, 0.0
    for step in sorted(seconds):
        total += seconds[step]
        out[step] = total / 60
    return out


def pace(runs: dict[str, list[dict]], minutes: dict[str, dict[int, float]]) -> dict:
    """How fast each run raises speed, on equal terms: the gain of the mean speedup and of the fast share from step 1
    per step over the steps that every run has, and per minute of RL wall time over the minutes that every run has
    (to the last step finished within them); the RL minutes until it first stood SPEED_MARGINS above step 1 (the
    speed criterion's bar; None if never); and the level of the last CRITERION_LAST_STEPS steps (where a run
    ends up, not how fast). Runs at the same kernels per step differ in minutes per step (a multi-turn step waits
    for each turn's feedback), so the two rates can rank them differently."""
    common_steps = min(len(steps) for steps in runs.values())
    timed = all(minutes.get(name) for name in runs)
    common_minutes = min(max(minutes[name].values()) for name in runs) if timed else None
    out = {"common_steps": common_steps, "common_minutes": common_minutes, "runs": {}}
    for name, steps in runs.items():
        at = minutes.get(name) or {}
        within = [i for i, s in enumerate(steps) if timed and at.get(s["step"], float("inf")) <= common_minutes]
        row = {"steps": len(steps), "minutes": max(at.values()) if at else None,
               "minutes_per_step": max(at.values()) / len(at) if at else None}
        for key in ("mean_speedup", "fast_share"):
            values = speed_series(steps, key)
            start, end = values[0], values[common_steps - 1]
            row[f"{key}/per_step"] = (None if start is None or end is None or common_steps < 2
                                      else (end - start) / (common_steps - 1))
            last = within[-1] if within else None
            row[f"{key}/per_minute"] = (None if last in (None, 0) or start is None or values[last] is None
                                        else (values[last] - start) / at[steps[last]["step"]])
            reached = [s["step"] for s, v in zip(steps, values)
                       if start is not None and v is not None and v - start >= SPEED_MARGINS[key]]
            row[f"{key}/minutes_to_margin"] = at.get(reached[0]) if reached else None
            tail = [v for v in values[-CRITERION_LAST_STEPS:] if v is not None]
            row[f"{key}/last_{CRITERION_LAST_STEPS}"] = sum(tail) / len(tail) if tail else None
        out["runs"][name] = row
    return out


def print_pace(p: dict) -> None:
    minutes = "-" if p["common_minutes"] is None else f"{p['common_minutes']:.1f}"
    parts = (("per_step", "+.3f"), ("per_minute", "+.4f"), ("minutes_to_margin", ".1f"),
             (f"last_{CRITERION_LAST_STEPS}", ".3f"))
    print(f"\n| run | steps | RL minutes | minutes per step | mean speedup: gain per step "
          f"(steps 1-{p['common_steps']}) | "
          f"per minute (first {minutes} min) | minutes to +{SPEED_MARGINS['mean_speedup']} | last "
          f"{CRITERION_LAST_STEPS} steps | fast share: gain per step | per minute | minutes to "
          f"+{SPEED_MARGINS['fast_share']} | last {CRITERION_LAST_STEPS} steps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in p["runs"].items():
        cells = [_fmt(r[f"{key}/{part}"], f) for key in ("mean_speedup", "fast_share") for part, f in parts]
        print(f"| {name} | {r['steps']} | {_fmt(r['minutes'], '.1f')} | {_fmt(r['minutes_per_step'], '.2f')} | "
              + " | ".join(cells) + " |")


def plot_speed_minutes(runs: dict[str, list[dict]], minutes: dict[str, dict[int, float]], out: Path, plt) -> None:
    """speed_minutes.png: the mean speedup of correct kernels and the fast share against RL wall minutes."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "mean_speedup", "mean speedup of correct kernels"),
                           (axes[1], "fast_share", "fast share of correct kernels")):
        for name, steps in runs.items():
            at = minutes.get(name) or {}
            points = [(at[s["step"]], v) for s, v in zip(steps, speed_series(steps, key))
                      if s["step"] in at and v is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        ax.set_xlabel("RL wall minutes (end of step)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "speed_minutes.png", dpi=120)
    plt.close(fig)


def write_samples(workdir: Path, out: Path, per_step: int = 3, chars: int = 2500) -> None:
    """The first responses of the first and the last step, cut to `chars`: what the policy actually wrote."""
    files = [p for _, p in step_files(workdir)]
    lines = []
    for p in dict.fromkeys([files[0], files[-1]]):
        for _, t in load_turns(p)[:per_step]:
            lines += [f"===== {workdir.name} {p.stem} turn {t.turn}: stop {t.stop_reason}, "
                      f"{len(t.response_tokens)} tokens, format_error {t.parsed.get('format_error')!r}, "
                      f"compiled {t.verdict.get('compiled')}, correct {t.verdict.get('correct')} ({t.status})",
                      t.response_text[:chars], ""]
    (out / f"samples_{workdir.name}.txt").write_text("\n".join(lines))


def _fmt(v, f: str) -> str:
    return "-" if v is None else format(v, f)


def print_speed(runs: dict[str, list[dict]]) -> dict:
    """The speed tables (per step, criterion, slopes, per turn); returns their numbers for summary.json."""
    print("\n| run | step | mean speedup of correct kernels | fast_1 | fast_1.5 | correct kernels | "
          "per turn: mean speedup | per turn: fast_1 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, steps in runs.items():
        turns = sorted({int(k[4:].split("/")[0]) for s in steps for k in s["speed"] if k.startswith("turn")})
        for s in steps:
            sp = s["speed"]
            per_speed = " ".join(_fmt(sp.get(f"turn{t}/mean_speedup"), ".2f") for t in turns)
            per_fast = " ".join(_fmt(sp.get(f"turn{t}/fast_1"), ".2f") for t in turns)
            print(f"| {name} | {s['step']} | {_fmt(sp.get('mean_speedup'), '.3f')} | {_fmt(sp.get('fast_1'), '.3f')} | "
                  f"{_fmt(sp.get('fast_1.5'), '.3f')} | {sp.get('correct_kernels', 0):.0f} | {per_speed} | "
                  f"{per_fast} |")
    criteria = {name: speed_criterion(steps) for name, steps in runs.items()}
    margins = ", ".join(f"{k} >= +{m}" for k, m in SPEED_MARGINS.items())
    print(f"\n| run | steps | metric | step 1 | mean of last {CRITERION_LAST_STEPS} | change | speed criterion "
          f"({margins}; correct fraction >= -{CORRECT_DROP_ALLOWED}) |")
    print("|---|---|---|---|---|---|---|")
    for name, v in criteria.items():
        verdict = (("passed" if v["passed"] else "failed") if v["judged"]
                   else f"not judged (<= {CRITERION_LAST_STEPS} steps or no correct kernel)")
        share = "fast-variant share" if v["fast_share_is"] == "fast_variant" else "fast share (fast_1)"
        for key, label in (("mean_speedup", "mean speedup of correct kernels"), ("fast_share", share),
                           ("fast_1", "fast_1 among correct"),
                           ("fast_1.5", "fast_1.5 among correct"), ("correct_fraction", "correct, all kernels")):
            m = v[key]
            print(f"| {name} | {v['steps']} | {label} | {_fmt(m['step_1'], '.3f')} | "
                  f"{_fmt(m[f'last_{CRITERION_LAST_STEPS}_mean'], '.3f')} | {_fmt(m['delta'], '+.3f')} | "
                  f"{verdict if key == 'mean_speedup' else ''} |")
    noise = {name: speed_noise(steps) for name, steps in runs.items()}
    print("\n| run | metric | slope per step | its SE | t | SD around the trend |")
    print("|---|---|---|---|---|---|")
    for name, per in noise.items():
        for key, m in per.items():
            t = (m["slope_per_step"] / m["slope_se"] if m["slope_se"] else None) if m["slope_per_step"] is not None \
                else None
            print(f"| {name} | {key} | {_fmt(m['slope_per_step'], '+.4f')} | {_fmt(m['slope_se'], '.4f')} | "
                  f"{_fmt(t, '+.1f')} | {_fmt(m['residual_sd'], '.3f')} |")
    per_turn = {}
    for name, steps in runs.items():
        turns = sorted({int(k[4:].split("/")[0]) for k in steps[0]["speed"] if k.startswith("turn")})
        tail = steps[-CRITERION_LAST_STEPS:]
        per_turn[name] = {}
        for t in turns:
            row = {}
            for key in ("mean_speedup", "fast_share", "fast_1", "fast_1.5", "correct_rate"):
                vals = [v for v in speed_series(tail, key, t) if v is not None]
                row[key] = (speed_series(steps[:1], key, t)[0], sum(vals) / len(vals) if vals else None)
            per_turn[name][str(t)] = row
    print(f"\n| run | turn | mean speedup: step 1 -> last {CRITERION_LAST_STEPS} | fast share | fast_1 | fast_1.5 | "
          f"correct |")
    print("|---|---|---|---|---|---|---|")
    for name, per in per_turn.items():
        for t, row in per.items():
            print(f"| {name} | {t} | " + " | ".join(f"{_fmt(a, '.2f')} -> {_fmt(b, '.2f')}" for a, b in row.values())
                  + " |")
    return {"speed_criterion": criteria, "speed_noise": noise, "speed_per_turn": per_turn}


def plot_speed(runs: dict[str, list[dict]], out: Path, plt) -> None:
    """speed.png: mean speedup of correct kernels and fast_1, all kernels (solid) and per turn (faint)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "mean_speedup", "mean speedup of correct kernels"),
                           (axes[1], "fast_share", "fast share of correct kernels")):
        for name, steps in runs.items():
            x = [s["step"] for s in steps]
            line, = ax.plot(x, [float("nan") if v is None else v for v in speed_series(steps, key)], marker="o",
                            label=name)
            turns = sorted({int(k[4:].split("/")[0]) for s in steps for k in s["speed"] if k.startswith("turn")})
            for t in turns:
                ax.plot(x, [float("nan") if v is None else v for v in speed_series(steps, key, t)], alpha=0.3,
                        color=line.get_color(), linestyle=":")
        ax.set_xlabel("RL step")
        ax.set_title(f"{label} (faint: per turn)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "speed.png", dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--speedups", type=Path, help="benchmarks/builtin_speed_variants.py's JSON: the speed "
                        "criterion's fast share is then the fast-variant share, else fast_1")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    thresholds = fast_thresholds(json.loads(args.speedups.read_text()) if args.speedups else None)
    if args.speedups:
        print(f"fast variant: a correct kernel at >= the geometric mean of its task's measured slow and fast "
              f"speedups ({len(thresholds)} tasks with a pair >= 1.5x apart in {args.speedups})")
    runs = {w.name: run_stats(w, thresholds) for w in args.workdirs}
    print("| run | step | kernels | mean score | correct | compiled | fast among correct |")
    print("|---|---|---|---|---|---|---|")
    for name, steps in runs.items():
        for s in steps:
            fast = "-" if s["fast_share_of_correct"] is None else f"{s['fast_share_of_correct']:.2f}"
            print(f"| {name} | {s['step']} | {s['kernels']} | {s['score_mean']:.3f} | {s['correct_fraction']:.3f} | "
                  f"{s['compiled_fraction']:.3f} | {fast} |")
    print("\n| run | step | format ok | response tokens (mean) | stop reasons | top format errors |")
    print("|---|---|---|---|---|---|")
    for name, steps in runs.items():
        for s in (steps[0], steps[-1]) if len(steps) > 1 else steps:
            print(f"| {name} | {s['step']} | {s['format_ok_fraction']:.3f} | {s['response_tokens_mean']:.0f} | "
                  f"{s['stop_reasons']} | {s['format_errors']} |")
    criteria = {name: criterion(steps) for name, steps in runs.items()}
    print(f"\n| run | steps | metric | step 1 | mean of last {CRITERION_LAST_STEPS} | change | "
          f"criterion (both all-kernel changes >= {CRITERION_MARGIN}) |")
    print("|---|---|---|---|---|---|---|")
    for name, v in criteria.items():
        verdict = (("passed" if v["passed"] else "failed") if v["judged"]
                   else f"not judged (<= {CRITERION_LAST_STEPS} steps)")
        for key, label in (("correct_fraction", "correct, all kernels"), ("score_mean", "mean score, all kernels"),
                           ("first_turn_correct_fraction", "first-turn correct")):
            m = v[key]
            tail = m[f"last_{CRITERION_LAST_STEPS}_mean"]
            print(f"| {name} | {v['steps']} | {label} | {m['step_1']:.3f} | {tail:.3f} | {m['delta']:+.3f} | "
                  f"{verdict if key == 'correct_fraction' else ''} |")
    noise = {name: trend_noise([s["correct_fraction"] for s in steps]) for name, steps in runs.items()}
    print("\n| run | all-kernel correct: slope per step | its SE | SD around the trend | SE of the criterion's change |")
    print("|---|---|---|---|---|")
    formats = {"slope_per_step": "+.4f", "slope_se": ".4f"}  # the rest: ".3f"
    for name, m in noise.items():
        print(f"| {name} | " + " | ".join("-" if v is None else f"{v:{formats.get(k, '.3f')}}"
                                          for k, v in m.items()) + " |")
    turns = {name: per_turn_change(steps) for name, steps in runs.items()}
    columns = (("correct_fraction", ".2f"), ("format_ok_fraction", ".2f"), ("advantage_mean", ".2f"),
               ("sampled_nll", ".4f"), ("tail_token_fraction", ".2f"))
    print(f"\n| run | turn | correct: step 1 -> last {CRITERION_LAST_STEPS} | format ok | mean advantage | "
          f"sampled NLL per token | share with a token drawn at p < {TAIL_PROB} |")
    print("|---|---|---|---|---|---|---|")
    for name, per in turns.items():
        for turn, m in per.items():
            cells = " | ".join("-" if b is None else f"{a:{f}} -> {b:{f}}" for (a, b), f in
                               ((m[k], f) for k, f in columns))
            print(f"| {name} | {turn} | {cells} |")
    speed = print_speed(runs)
    minutes = {w.name: step_minutes(w) for w in args.workdirs}
    speed["pace"] = pace(runs, minutes)
    print_pace(speed["pace"])
    (args.out / "summary.json").write_text(json.dumps({"steps": runs, "criterion": criteria, "noise": noise,
                                                       "per_turn": turns, **speed}, indent=1) + "\n")
    for w in args.workdirs:
        write_samples(w, args.out)
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
    plot_speed(runs, args.out, plt)
    plot_speed_minutes(runs, minutes, args.out, plt)
    print(f"wrote {args.out}/summary.json, score_mean.png, correct_fraction.png, speed.png, speed_minutes.png")


if __name__ == "__main__":
    main()
