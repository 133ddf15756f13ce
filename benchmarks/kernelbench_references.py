"""Every KernelBench reference through the evaluator's reference path: does each task load, build its inputs, run and
time on this GPU, how long does its reference take, and how much device memory does it need?

    python benchmarks/kernelbench_references.py --root ../shared/kernelbench --out $OUT/kb_refs.json   # a GPU
    python benchmarks/kernelbench_references.py --root ../shared/kernelbench --levels 1 --limit 3 \
        --device-type cpu --out /tmp/kb_refs.json                                  # CPU smoke run of the plumbing

Evaluator.check_references (the judge alone: task load, inputs under the seed, a warm-up run, the reference's own op
trace, the random-state check, the reference timing with the evaluator's timing method) on every task of the given
levels, a few at a time through one Evaluator as the trainer would use it. Per task: outcome (ok / fails: the
reason / out of memory / timeout or crash), reference median ms, the judge's peak device memory, and the judge's
wall time for it. The table groups the outcomes per level and lists every task that did not pass, with what the
harness does about it (a task-level verdict: meta.reference_error; the RL loop skips such tasks). A device run;
KernelBench's task files are device data (../shared/kernelbench), never needed by the tests.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def outcome_of(r) -> tuple[str, str]:
    meta = r.meta or {}
    if r.ref_timing and r.ref_timing.get("median_ms"):
        return "ok", ""
    if meta.get("reference_timeout"):
        return "timeout", (r.runtime_error or "")[:300]
    if meta.get("reference_oom"):
        return "out_of_memory", (r.runtime_error or "")[:300]
    if meta.get("reference_error"):
        return "fails", (r.runtime_error or "")[:300]
    if meta.get("crash"):
        crash = meta["crash"]
        return ("timeout" if crash.get("timed_out") else "crash"), (r.runtime_error or "")[:300]
    if meta.get("internal_error"):
        return "internal_error", (r.runtime_error or "")[:300]
    return "no_timing", (r.runtime_error or "")[:300]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="KernelBench checkout or folder of level<N>/ dirs")
    p.add_argument("--levels", default="1,2,3")
    p.add_argument("--limit", type=int, default=0, help="only the first N tasks of each level")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--device-type", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per task (EvalConfig.run_timeout_s)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from cuda_eval.api import EvalConfig, Evaluator
    from kevin_jax.tasks.kernelbench import load_kernelbench_dir

    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    loaded = load_kernelbench_dir(args.root, levels)
    tasks = []
    for level in levels:
        of_level = [t for t in loaded.tasks if t.level == level]
        tasks += of_level[:args.limit] if args.limit else of_level
    print(f"{len(tasks)} tasks (levels {levels}); skipped by the loader: {len(loaded.skipped)}", flush=True)
    cfg = dict(run_timeout_s=args.timeout_s, ref_timing_cache=False, compile_workers=1)
    if args.device_type == "cpu":
        cfg.update(device_type="cpu", spare_workers=1)
    else:
        cfg.update(devices=str(args.device))
    t0 = time.monotonic()
    rows = []
    with Evaluator(EvalConfig(**cfg)) as ev:
        info = ev.gpu_pool.device_info() or {}
        futures = ev.check_references([(t.task_id, t.source) for t in tasks])
        for t, f in zip(tasks, futures):
            try:
                r = f.result()
            except Exception as e:  # noqa: BLE001 - recorded in the row
                rows.append({"task_id": t.task_id, "level": t.level, "outcome": "internal_error",
                             "reason": f"{type(e).__name__}: {e}"[:300]})
                continue
            outcome, reason = outcome_of(r)
            meta = r.meta or {}
            rows.append({"task_id": t.task_id, "level": t.level, "outcome": outcome, "reason": reason,
                         "ref_ms": (r.ref_timing or {}).get("median_ms"),
                         "peak_gb": (meta.get("reference_peak_bytes") or 0) / 1e9 or None,
                         "judge_s": meta.get("judge_s"), "run_s": r.stage_times.get("run"),
                         "input_sets": meta.get("timing_input_sets"), "timer": (r.ref_timing or {}).get("timer"),
                         "rng_dependent": meta.get("timed_output_check")})
            print(f"{t.task_id}: {outcome} {rows[-1]['ref_ms'] or ''} {reason[:120]}", flush=True)
    out = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": info, "rows": rows,
           "wall_s": time.monotonic() - t0}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))

    print(f"\n## KernelBench references on {info.get('gpu_name') or 'CPU'} ({len(rows)} tasks, "
          f"{out['wall_s']:.0f} s)\n")
    kinds = ["ok", "fails", "out_of_memory", "timeout", "crash", "internal_error", "no_timing"]
    print("| level | tasks | " + " | ".join(kinds) + " | ref ms p50 | ref ms max | peak GB max |")
    print("|---|---|" + "---|" * len(kinds) + "---|---|---|")
    for level in levels:
        lr = [r for r in rows if r["level"] == level]
        ms = [r["ref_ms"] for r in lr if r.get("ref_ms")]
        peak = [r["peak_gb"] for r in lr if r.get("peak_gb")]
        print(f"| {level} | {len(lr)} | " + " | ".join(str(sum(r["outcome"] == k for r in lr)) for k in kinds)
              + f" | {statistics.median(ms) if ms else float('nan'):.3f} | {max(ms, default=float('nan')):.3f} | "
              f"{max(peak, default=float('nan')):.2f} |")
    bad = [r for r in rows if r["outcome"] != "ok"]
    if bad:
        print("\n| task | outcome | reason (the harness gives it a task-level verdict) |\n|---|---|---|")
        for r in bad:
            print(f"| {r['task_id']} | {r['outcome']} | {r['reason'][:200].replace('|', '/')} |")
    slow = sorted((r for r in rows if r.get("ref_ms")), key=lambda r: -r["ref_ms"])[:10]
    print("\n| slowest references | ref ms | peak GB | judge s |\n|---|---|---|---|")
    for r in slow:
        print(f"| {r['task_id']} | {r['ref_ms']:.3f} | {r['peak_gb'] or 0:.2f} | {r['judge_s']} |")


if __name__ == "__main__":
    main()
