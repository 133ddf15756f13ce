"""The speed of every correct built-in solution: does each task have a slow and a fast correct variant, 1.5x apart?

    python benchmarks/builtin_speed_variants.py --out $OUT/builtin_speedups.json           # GPU: ~4-6 min, one H100
    python benchmarks/builtin_speed_variants.py --out /tmp/compile_check.json --repeats 1  # no GPU: compile-only

Every correct_*.py of every built-in task (kevin_jax/tasks/builtin_solutions) goes through cuda_eval.api, the
evaluator RL uses (the kevin profile: correctness trials, gated timing against PyTorch eager, hack checks), --repeats
times in separate batches (a repeat is timed afresh; within a batch identical programs would share one verdict). Per
(task, solution): correct (every repeat), the median speedup over the repeats and each repeat's, the candidate's and
the reference's median times, flags. Per task: the slowest and fastest measured-correct solutions and their ratio,
flagged when below --min-ratio (1.5). A table is printed; the JSON is what scripts/make_warm_start_corpus.py reads
(`--speedups`, or committed as kevin_jax/data/builtin_speedups.json).

Without a GPU the evaluator only compiles (mode compile_only): the table says "compiled", the JSON has no speedup and
"mode": "compile_only", and the corpus generator treats it as unmeasured (it never makes up a speedup). That is the
compile check of the solutions through the evaluator's own build path (record, nvcc, the .so) on a CPU machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuda_eval.api import EvalConfig, EvalRequest, Evaluator  # noqa: E402
from kevin_jax.tasks import builtin_solutions, load_builtin_tasks  # noqa: E402

MIN_RATIO = 1.5


def answer(code: str) -> str:
    return f"Here is the kernel.\n\n```python\n{code}\n```\n\nSummary: a built-in solution."


def requests(task_ids: set[str] | None, repeat: int) -> list[EvalRequest]:
    sources = {t.task_id: t.source for t in load_builtin_tasks().tasks}
    return [EvalRequest(task_id=s.task_id, task_source=sources[s.task_id], response=answer(s.source),
                        request_id=f"{s.task_id}/{s.name}/r{repeat}")
            for s in builtin_solutions() if s.kind == "correct" and (task_ids is None or s.task_id in task_ids)]


def summarise(results_by_repeat: list[list], mode: str) -> dict:
    """{task: {solution: entry}} from the repeats' EvalResults (same order in every repeat)."""
    out: dict[str, dict] = {}
    for rows in zip(*results_by_repeat):
        task_id, name = rows[0].request_id.rsplit("/", 2)[0], rows[0].request_id.rsplit("/", 2)[1]
        correct = [r.correct is True and not r.hack_flags for r in rows]
        speedups = [r.speedup for r in rows if r.speedup]
        entry = {"compiled": all(r.compiled is True for r in rows),
                 "correct": all(correct) if mode == "full" else None,
                 "speedup": statistics.median(speedups) if speedups and all(correct) else None,
                 "speedups": [r.speedup for r in rows],
                 "median_ms": statistics.median([r.timing["median_ms"] for r in rows if r.timing]) if any(
                     r.timing for r in rows) else None,
                 "ref_median_ms": statistics.median([r.ref_timing["median_ms"] for r in rows if r.ref_timing]) if any(
                     r.ref_timing for r in rows) else None,
                 "hack_flags": sorted({f["code"] for r in rows for f in r.hack_flags}),
                 "errors": [(r.runtime_error or r.compile_log or r.feedback or "")[:300] for r in rows
                            if not (r.correct or (mode != "full" and r.compiled))]}
        out.setdefault(task_id, {})[name] = entry
    return out


def pairs(solutions: dict, min_ratio: float) -> dict:
    """Per task: slowest and fastest measured-correct solutions, their ratio, and whether it reaches min_ratio."""
    out = {}
    for task_id, sols in solutions.items():
        timed = sorted((e["speedup"], n) for n, e in sols.items() if e["correct"] and e["speedup"])
        if len(timed) < 2:
            out[task_id] = {"slow": None, "fast": None, "ratio": None, "apart": False,
                            "why": f"{len(timed)} measured-correct solution(s)"}
            continue
        (s_slow, slow), (s_fast, fast) = timed[0], timed[-1]
        out[task_id] = {"slow": slow, "fast": fast, "ratio": s_fast / s_slow, "apart": s_fast >= min_ratio * s_slow}
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def table(solutions: dict, task_pairs: dict, mode: str, min_ratio: float) -> str:
    lines = ["| task | solution | " + ("correct | speedup (median) | per repeat | ms | ref ms |" if mode == "full"
                                       else "compiled |"),
             "|---|---|" + ("---|---|---|---|---|" if mode == "full" else "---|")]
    for task_id, sols in solutions.items():
        for name, e in sols.items():
            if mode == "full":
                per = " ".join("-" if s is None else f"{s:.2f}" for s in e["speedups"])
                sp = "-" if e["speedup"] is None else f"{e['speedup']:.2f}x"
                ms = "-" if e["median_ms"] is None else f"{e['median_ms']:.3f}"
                ref = "-" if e["ref_median_ms"] is None else f"{e['ref_median_ms']:.3f}"
                lines.append(f"| {task_id} | {name} | {e['correct']} | {sp} | {per} | {ms} | {ref} |")
            else:
                lines.append(f"| {task_id} | {name} | {e['compiled']} |")
    if mode != "full":
        return "\n".join(lines)
    lines += ["", f"| task | slowest | fastest | ratio | >= {min_ratio:g}x apart |", "|---|---|---|---|---|"]
    for task_id, p in task_pairs.items():
        ratio = "-" if p["ratio"] is None else f"{p['ratio']:.2f}"
        flag = "yes" if p["apart"] else f"**NO** ({p.get('why', 'too close')})"
        lines.append(f"| {task_id} | {p['slow']} | {p['fast']} | {ratio} | {flag} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON to write")
    parser.add_argument("--repeats", type=int, default=3, help="separate batches, each timed afresh")
    parser.add_argument("--tasks", default="", help="comma-separated task ids (default: every built-in task)")
    parser.add_argument("--min-ratio", type=float, default=MIN_RATIO)
    parser.add_argument("--devices", default="all")
    args = parser.parse_args()
    task_ids = {t.strip() for t in args.tasks.split(",") if t.strip()} or None
    t0 = time.monotonic()
    with Evaluator(EvalConfig(devices=args.devices, share_identical=False)) as ev:
        startup_s = time.monotonic() - t0
        results = []
        for k in range(args.repeats):
            t1 = time.monotonic()
            results.append(ev.evaluate(requests(task_ids, k)))
            print(f"repeat {k + 1}/{args.repeats}: {len(results[-1])} solutions in {time.monotonic() - t1:.0f} s",
                  flush=True)
        mode = ev.mode
    solutions = summarise(results, mode)
    task_pairs = pairs(solutions, args.min_ratio) if mode == "full" else {}
    meta = next((r.meta for rows in results for r in rows if r.meta.get("gpu_name")), {})
    report = {"measured": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "mode": mode, "gpu": meta.get("gpu_name"), "torch": meta.get("torch_version"),
                           "git_commit": git_commit(), "repeats": args.repeats, "profile": "kevin",
                           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                           "startup_s": round(startup_s, 1), "wall_s": round(time.monotonic() - t0, 1)},
              "solutions": solutions, "pairs": task_pairs, "min_ratio": args.min_ratio}
    if mode != "full":      # nothing ran: no speedup may look measured
        for sols in solutions.values():
            for e in sols.values():
                e["correct"], e["speedup"] = None, None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(table(solutions, task_pairs, mode, args.min_ratio))
    if mode == "full":
        close = [t for t, p in task_pairs.items() if not p["apart"]]
        wrong = [f"{t}/{n}" for t, s in solutions.items() for n, e in s.items() if not e["correct"]]
        print(f"\n{len(task_pairs) - len(close)} of {len(task_pairs)} tasks have a measured-correct pair >= "
              f"{args.min_ratio:g}x apart" + (f"; not: {', '.join(close)}" if close else ""))
        if wrong:
            print(f"NOT CORRECT on this GPU (left out of the corpus): {', '.join(wrong)}")
    else:
        failed = [f"{t}/{n}" for t, s in solutions.items() for n, e in s.items() if not e["compiled"]]
        print(f"\ncompile-only (no GPU): {sum(len(s) for s in solutions.values()) - len(failed)} compiled"
              + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
