"""Showing an evaluation: rich console tables (also saved as text), the JSON of every number, TensorBoard scalars and
PNG plots (correctness and performance vs turns, best@k vs k, fixed-budget bars).

All functions but `best_kernel_report` (each task's best kernel with its profile, from the trajectories) read the plain
dict of `metrics.compute_metrics`; percentages are shown for 0/1 metrics (correct, compiled, fast_p) and "1.23x" for
performance (mean over tasks of the fastest correct kernel's speedup, 0 if none).
"""
from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from cuda_eval.api import profile_breakdown
from kevin_jax.env.trajectory import Trajectory
from kevin_jax.evaluation.metrics import fast_name

BASELINE_LABEL = {"eager": "PyTorch eager", "compile": "torch.compile"}


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _x(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def _fmt(metric: str, x: float | None) -> str:
    return _x(x) if metric == "performance" else _pct(x)


def _rows(section: Mapping[str, Any], correct: str, fast_p: Sequence[float]) -> list[tuple[str, str, Mapping]]:
    """(label, metric, {avg, best@k}) rows of an aggregate: correctness, then per baseline performance and fast_p."""
    rows = [(correct, correct, section[correct])]
    for baseline in ("eager", "compile"):
        if baseline not in section:
            continue
        suffix = f" vs {BASELINE_LABEL[baseline]}"
        rows.append(("performance" + suffix, "performance", section[baseline]["performance"]))
        rows += [(fast_name(p) + suffix, fast_name(p), section[baseline][fast_name(p)]) for p in fast_p]
        if "peak_fraction" in section[baseline]:   # the share of the roofline: no baseline of its own
            rows.append(("peak fraction (roofline)", "peak_fraction", section[baseline]["peak_fraction"]))
    return rows


def tables(metrics: Mapping[str, Any], title: str = "evaluation") -> list[Table]:
    correct, ks, fast_p = metrics["metric_correct"], metrics["ks"], metrics["fast_p"]
    n = ks[-1]
    out = []
    main = Table(title=f"Kevin's metrics after all {metrics['turns']} turns (mean over tasks)",
                 box=box.SIMPLE_HEAVY, title_justify="left")
    main.add_column("metric")
    main.add_column("avg", justify="right")
    for k in ks:
        main.add_column(f"best@{k}", justify="right")
    for label, metric, values in _rows(metrics["summary"], correct, fast_p):
        main.add_row(label, _fmt(metric, values.get("avg")), *[_fmt(metric, values.get(f"best@{k}")) for k in ks])
    if "compile" in metrics["summary"]:
        c = metrics["summary"]["compile"]
        main.caption = f"torch.compile baseline over {c['tasks']} task(s) ({c['tasks_excluded']} without its timing)"
    out.append(main)

    serial = Table(title="Serial refinement: the trajectories' first t turns", box=box.SIMPLE_HEAVY,
                   title_justify="left")
    serial.add_column("turns", justify="right")
    serial.add_column(f"{correct} avg", justify="right")
    serial.add_column(f"{correct} best@{n}", justify="right")
    has_speed = metrics["mode"] != "compile_only"
    if has_speed:
        for head in ("perf avg", f"perf best@{n}", f"fast_1 best@{n}"):
            serial.add_column(head, justify="right")
        if any("compile" in row for row in metrics["by_turn"]):
            serial.add_column(f"perf best@{n} vs compile", justify="right")
    serial.add_column(f"turn t's own kernels {correct}", justify="right")
    rates = {r["turn"] + 1: r for r in metrics["kernels_by_turn"]}
    compile_col = has_speed and any("compile" in row for row in metrics["by_turn"])
    for row in metrics["by_turn"]:
        t = row["turns"]
        cells = [str(t), _pct(row[correct]["avg"]), _pct(row[correct].get(f"best@{n}"))]
        if has_speed:
            e = row["eager"]
            cells += [_x(e["performance"]["avg"]), _x(e["performance"].get(f"best@{n}")),
                      _pct(e["fast_1"].get(f"best@{n}"))]
            if compile_col:
                cells.append(_x(row["compile"]["performance"].get(f"best@{n}")) if "compile" in row else "-")
        rate = rates.get(t, {})
        cells.append(f"{_pct(rate.get(f'{correct}_rate'))} of {rate.get('kernels', 0)}")
        serial.add_row(*cells)
    out.append(serial)

    if metrics.get("fixed_budget"):
        budget = Table(title="Fixed budget: k trajectories x t turns = the same number of kernels (best@k after t)",
                       box=box.SIMPLE_HEAVY, title_justify="left")
        for head in ("kernels", "k x t", correct):
            budget.add_column(head, justify="right")
        if has_speed:
            for head in ("performance", "fast_1"):
                budget.add_column(head, justify="right")
        for entry in metrics["fixed_budget"]:
            for p in entry["points"]:
                cells = [str(entry["budget"]), f"{p['trajectories']} x {p['turns']}", _pct(p[correct])]
                if has_speed:
                    cells += [_x(p["eager"]["performance"]), _pct(p["eager"]["fast_1"])]
                budget.add_row(*cells)
        out.append(budget)

    if metrics.get("by_level"):
        levels = Table(title="By KernelBench level (after all turns)", box=box.SIMPLE_HEAVY, title_justify="left")
        for head in ("level", "tasks", f"{correct} avg", f"{correct} best@{n}"):
            levels.add_column(head, justify="right")
        if has_speed:
            levels.add_column("perf avg", justify="right")
            levels.add_column(f"perf best@{n}", justify="right")
        for level, agg in metrics["by_level"].items():
            cells = [level, str(agg["num_tasks"]), _pct(agg[correct]["avg"]), _pct(agg[correct].get(f"best@{n}"))]
            if has_speed:
                cells += [_x(agg["eager"]["performance"]["avg"]), _x(agg["eager"]["performance"].get(f"best@{n}"))]
            levels.add_row(*cells)
        out.append(levels)
    return out


def heading(metrics: Mapping[str, Any], title: str) -> str:
    text = (f"{title}: {metrics['num_tasks']} tasks x {metrics['trajectories_per_task']} trajectories x "
            f"{metrics['turns']} turns")
    if metrics["mode"] == "compile_only":
        text += "\n[compile-only: kernels were compiled, nothing ran; 'compiled' stands in for 'correct']"
    if not metrics.get("parallel_samples", True):
        text += "\n[beam search: the trajectories are not independent samples; best@n is the search's result]"
    return text


def render(metrics: Mapping[str, Any], title: str = "evaluation", notes: Iterable[str] = (),
           console: Console | None = None, width: int = 120) -> str:
    """Prints the tables (and notes: input problems, where things were written) and returns them as plain text."""
    recorder = Console(record=True, width=width, file=io.StringIO())
    recorder.print(heading(metrics, title), markup=False, highlight=False)
    for t in tables(metrics, title):
        # Section titles on their own line: rich would wrap a table title to the table's (narrow) width.
        section, t.title = t.title, None
        recorder.print("\n" + str(section), markup=False, highlight=False, soft_wrap=True)
        recorder.print(t)
    for note in notes:
        recorder.print(note, markup=False, highlight=False, soft_wrap=True)
    text = recorder.export_text()
    (console or Console(width=width)).print(text, markup=False, highlight=False, end="")
    return text


# ------------------------------------------------------------------------------------------------ JSON, TensorBoard
def side_by_side(columns: Mapping[str, str], gap: int = 4) -> str:
    """Texts (e.g. one evaluation table per profile) as columns under their names, line by line."""
    blocks = [[name, "=" * len(name)] + text.rstrip("\n").split("\n") for name, text in columns.items()]
    widths = [max(map(len, b)) for b in blocks]
    lines = []
    for i in range(max(map(len, blocks), default=0)):
        cells = [(b[i] if i < len(b) else "").ljust(w) for b, w in zip(blocks, widths)]
        lines.append((" " * gap).join(cells).rstrip())
    return "\n".join(lines) + "\n"


def write_json(path: str | Path, payload: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite(payload), indent=1, allow_nan=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: they become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _flatten(prefix: str, obj: Any, out: dict[str, float]) -> None:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten(f"{prefix}/{k}", v, out)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and math.isfinite(obj):
        out[prefix] = float(obj)


def scalars(metrics: Mapping[str, Any], prefix: str = "eval") -> dict[str, float]:
    """TensorBoard tags: <prefix>/<metric>/<avg|best@k> after all turns, <prefix>/after_<t>_turns/..., and
    <prefix>/budget_<B>/<k>x<t>/..."""
    out: dict[str, float] = {}
    _flatten(prefix, metrics["summary"], out)
    for row in metrics["by_turn"]:
        _flatten(f"{prefix}/after_{row['turns']}_turns", {k: v for k, v in row.items() if k != "turns"}, out)
    for entry in metrics.get("fixed_budget", []):
        for p in entry["points"]:
            _flatten(f"{prefix}/budget_{entry['budget']}/{p['trajectories']}x{p['turns']}",
                     {k: v for k, v in p.items() if k not in ("trajectories", "turns")}, out)
    return out


def write_tensorboard(logdir: str | Path, step: int, values: Mapping[str, float]) -> None:
    from kevin_jax.logs import TensorBoardWriter

    writer = TensorBoardWriter(logdir)
    try:
        writer.scalars(step, values)
        writer.flush()
    finally:
        writer.close()


# ------------------------------------------------------------------------------------------------ plots
def _figure(ncols: int, title: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * ncols, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    fig.suptitle(title)
    return fig, axes


def _speed_series(metrics, rows, baseline: str, metric: str, key: str):
    return [row[baseline][metric].get(key) if baseline in row else None for row in rows]


def plot_turns(metrics: Mapping[str, Any], path: Path, title: str) -> Path:
    correct, n = metrics["metric_correct"], metrics["ks"][-1]
    rows = metrics["by_turn"]
    turns = [r["turns"] for r in rows]
    has_speed = metrics["mode"] != "compile_only"
    fig, axes = _figure(2 if has_speed else 1, f"{title}: serial refinement")
    ax = axes[0]
    ax.plot(turns, [r[correct].get(f"best@{n}") for r in rows], "o-", label=f"best@{n}")
    ax.plot(turns, [r[correct]["avg"] for r in rows], "s--", label="avg")
    if has_speed:
        ax.plot(turns, [r["eager"]["fast_1"].get(f"best@{n}") for r in rows], "^:", label=f"fast_1 best@{n}")
    ax.set(xlabel="turns", ylabel=f"{correct} (fraction of tasks)", ylim=(-0.02, 1.02), xticks=turns)
    ax.legend()
    ax.grid(alpha=0.3)
    if has_speed:
        ax = axes[1]
        for baseline, style in (("eager", "-"), ("compile", ":")):
            best = _speed_series(metrics, rows, baseline, "performance", f"best@{n}")
            if any(v is not None for v in best):
                ax.plot(turns, best, "o" + style, label=f"best@{n} vs {BASELINE_LABEL[baseline]}")
                ax.plot(turns, _speed_series(metrics, rows, baseline, "performance", "avg"), "s" + style,
                        alpha=0.6, label=f"avg vs {BASELINE_LABEL[baseline]}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="turns", ylabel="performance (mean fastest speedup)", xticks=turns)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    return path


def plot_best_at_k(metrics: Mapping[str, Any], path: Path, title: str) -> Path:
    correct, ks = metrics["metric_correct"], metrics["ks"]
    has_speed = metrics["mode"] != "compile_only"
    fig, axes = _figure(2 if has_speed else 1, f"{title}: parallel sampling (unbiased best@k)")
    rows = metrics["by_turn"]
    chosen = [rows[0], rows[-1]] if len(rows) > 1 else rows
    for row in chosen:
        label = f"after {row['turns']} turn{'s' if row['turns'] > 1 else ''}"
        axes[0].plot(ks, [row[correct].get(f"best@{k}") for k in ks], "o-", label=label)
        if has_speed:
            axes[1].plot(ks, [row["eager"]["performance"].get(f"best@{k}") for k in ks], "o-", label=label)
    axes[0].set(xlabel="k (parallel trajectories)", ylabel=f"{correct} best@k", ylim=(-0.02, 1.02))
    if has_speed:
        axes[1].set(xlabel="k (parallel trajectories)", ylabel="performance best@k (vs eager)")
        axes[1].axhline(1.0, color="gray", lw=0.8)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.legend()
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)
    return path


def plot_fixed_budget(metrics: Mapping[str, Any], path: Path, title: str) -> Path | None:
    entries = [e for e in metrics.get("fixed_budget", []) if e["points"]]
    if not entries:
        return None
    correct = metrics["metric_correct"]
    has_speed = metrics["mode"] != "compile_only"
    fig, axes = _figure(2 if has_speed else 1, f"{title}: fixed kernel budget (k trajectories x t turns)")
    labels, corr, perf = [], [], []
    for e in entries:
        for p in e["points"]:
            labels.append(f"{p['trajectories']} x {p['turns']}\n{e['budget']} kernels")
            corr.append(p[correct])
            perf.append(p["eager"]["performance"] if has_speed else None)
    xs = list(range(len(labels)))
    axes[0].bar(xs, corr, color="tab:blue")
    axes[0].set(ylabel=f"{correct} best@k", ylim=(0, 1.02))
    if has_speed:
        axes[1].bar(xs, perf, color="tab:orange")
        axes[1].axhline(1.0, color="gray", lw=0.8)
        axes[1].set(ylabel="performance best@k (vs eager)")
    for ax in axes:
        ax.set_xticks(xs, labels)
        ax.grid(alpha=0.3, axis="y")
    fig.savefig(path, dpi=110)
    return path


def plot_all(metrics: Mapping[str, Any], out_dir: str | Path, title: str = "evaluation") -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [plot_turns(metrics, out_dir / "turns.png", title)]
    if metrics.get("parallel_samples", True):
        paths.append(plot_best_at_k(metrics, out_dir / "best_at_k.png", title))
        budget = plot_fixed_budget(metrics, out_dir / "fixed_budget.png", title)
        if budget is not None:
            paths.append(budget)
    return paths


def best_kernel_report(trajectories: Iterable[Trajectory]) -> str:
    """Per task, the per-kernel profile (cuda_eval's breakdown of the verdict's meta.kernel_profile) of its best
    kernel: the highest speedup among its correct turns (Turn.correct, Turn.speedup: the one definition the reward
    uses too). launch/eval.py --profile."""
    best: dict[str, tuple[float, Mapping, str]] = {}
    tasks: list[str] = []
    for traj in trajectories:
        if traj.task_id not in tasks:
            tasks.append(traj.task_id)
        for turn in traj.turns:
            if turn.speedup is not None and (traj.task_id not in best or turn.speedup > best[traj.task_id][0]):
                best[traj.task_id] = (turn.speedup, turn.verdict, f"trajectory {traj.traj_index}, turn {turn.turn}")
    blocks = []
    for task in sorted(tasks):
        if task not in best:
            blocks.append(f"{task}: no correct kernel")
            continue
        speedup, verdict, where = best[task]
        timing = (verdict.get("timing") or {}).get("median_ms")
        head = f"{task}: best kernel {speedup:.2f}x ({where}" + (f", {timing:.3g} ms)" if timing else ")")
        body = profile_breakdown((verdict.get("meta") or {}).get("kernel_profile"))
        blocks.append(head + "\n" + "\n".join("  " + line for line in body.splitlines()))
    return "\n\n".join(blocks)
