"""Honest corpus kernels through the whole Evaluator on the GPU (default profile), with what the judge's two bounds
on their time saw: the kernel trace of the calls (groups and windows, the kernels' GPU time against the reported
time) and the judge's wall clock (the time it proves against the reported median). An honest kernel must come out
unflagged, with one trace window per group and its traced time within a few percent of the reported one.

    python scripts/trace_check.py [--kernels relu_basic,matmul_tiled,softmax_rowwise] [--out trace_check.json]
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))

import corpus_index  # noqa: E402  (the corpus loader lives with the tests)
from cuda_eval.api import EvalConfig, EvalRequest, Evaluator  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernels", default="relu_basic,matmul_tiled,softmax_rowwise", help="honest corpus names")
    p.add_argument("--device", default="0")
    p.add_argument("--out", help="JSON file with each verdict's timing and trace meta")
    args = p.parse_args()
    honest = {c.name: c for c in corpus_index.load("honest")}
    names = [n for n in args.kernels.split(",") if n]
    unknown = [n for n in names if n not in honest]
    if unknown:
        p.error(f"not in the honest corpus: {unknown} (known: {sorted(honest)})")
    with tempfile.TemporaryDirectory() as ref_dir, \
            Evaluator(EvalConfig(devices=args.device, run_timeout_s=60, ref_timing_cache_dir=ref_dir)) as ev:
        results = ev.evaluate([EvalRequest(task_id=honest[n].task, task_source=honest[n].task_source,
                                           response=honest[n].response, request_id=n) for n in names])
    rows = []
    print(f"{'kernel':<24}{'flags':<28}{'speedup':>8}{'groups/windows':>16}{'trace busy/reported ms':>26}"
          f"{'wall-proven/reported ms':>26}")
    for r in results:
        meta, trace, wall = r.meta, r.meta.get("call_trace") or {}, r.meta.get("wall_bound") or {}
        flags = ",".join(f["code"] for f in r.hack_flags) or "none"
        windows = len(meta.get("call_windows") or [])
        groups = f"{meta.get('call_groups')}/{windows}"
        print(f"{r.request_id:<24}{flags[:27]:<28}{r.speedup or 0:>8.3f}{groups:>16}"
              f"{trace.get('busy_ms', 0):>13.2f} / {trace.get('reported_ms', 0):<10.2f}"
              f"{wall.get('proven_ms', 0):>13.3f} / {wall.get('reported_median_ms', 0):<10.3f}")
        rows.append({"kernel": r.request_id, "correct": r.correct, "flags": r.hack_flags, "speedup": r.speedup,
                     "timing": r.timing, "call_trace": trace, "wall_bound": wall, "windows": windows,
                     "call_groups": meta.get("call_groups"), "call_trace_skipped": meta.get("call_trace_skipped")})
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    bad = [row["kernel"] for row in rows if row["flags"] or not row["correct"] or row["windows"] != row["call_groups"]]
    if bad:
        print(f"NOT AS EXPECTED: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
