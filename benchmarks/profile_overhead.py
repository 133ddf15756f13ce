"""What profile feedback costs per correct candidate, and whether it disturbs timing (one GPU).

    python benchmarks/profile_overhead.py --out $OUT/profile_overhead.json [--rounds 2]
    python benchmarks/profile_overhead.py --from-json profile_overhead.json      # the report of a saved run

One Evaluator on GPU 0 (reference-timing cache off: the judge times every reference), the honest corpus, in phases:
  A  feedback "kevin": the judge has never profiled (today's evaluator)
  B  feedback "profile": each task's reference is profiled once (judge cache), every candidate profiled
  C  feedback "kevin" again: the same judge, after the profiler ran in it
  D  feedback "profile" again (the references' profiles cached)
Per candidate: the GPU slot's wall per job (the pool's run stage: worker + judge; what a GPU is held for), the
judge's phases, the profile's own cost (cost_s: worker, candidate, reference). Overhead = (B or D) / mean(A, C) - 1
(target <= 10% once references are cached, D). Timing disturbance: the reference's and the candidate's medians in C
against A (the profiler ran in the judge in between; the worker runs CUPTI's kernel trace in every job anyway).
"""
import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "cuda_eval"))

import corpus_index  # noqa: E402
from cuda_eval.api import EvalConfig, EvalRequest, Evaluator  # noqa: E402


def run_phase(ev, cands, mode, rounds, tag):
    rows = {}
    for k in range(rounds):
        reqs = [EvalRequest(c.task, c.task_source, c.response, f"{tag}{k}:{c.name}", feedback=mode) for c in cands]
        for r in ev.evaluate(reqs):   # one GPU: jobs run one after the other
            name = r.request_id.split(":", 1)[1]
            row = rows.setdefault(name, {"run_s": [], "judge_s": [], "profile_s": [], "cost": [], "cand_ms": [],
                                         "ref_ms": [], "correct": [], "flags": []})
            row["run_s"].append(r.stage_times.get("run", 0.0))
            row["judge_s"].append(r.meta.get("judge_s") or 0.0)
            row["profile_s"].append((r.meta.get("phase_s") or {}).get("profile", 0.0))
            prof = r.meta.get("kernel_profile") or {}
            row["cost"].append(prof.get("cost_s"))
            row["cand_ms"].append((r.timing or {}).get("median_ms"))
            row["ref_ms"].append((r.ref_timing or {}).get("median_ms"))
            row["correct"].append(r.correct)
            row["flags"].append([f["code"] for f in r.hack_flags])
            if mode == "profile" and prof.get("error"):
                row.setdefault("errors", []).append(prof["error"])
    return rows


def mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.fmean(xs) if xs else float("nan")


def report(phases: dict, names: list[str]) -> tuple[str, dict]:
    """The per-candidate table, then the pooled view: each phase's median and mean slot wall over every job, the
    overheads against mean(A, C), the spread between A and C (the same configuration twice: the noise the per-candidate
    overheads sit in) and the profile step's own cost per job (meta.kernel_profile.cost_s, total)."""
    table, summary = [], {"b": [], "d": [], "ref_drift": [], "cand_drift": [], "a_vs_c": []}
    header = (f"{'candidate':<26} {'kevin s':>8} {'B s':>7} {'D s':>7} {'B %':>6} {'D %':>6} {'prof s':>7} "
              f"{'ref C/A':>8} {'cand C/A':>8}  verdicts")
    table.append(header)
    for name in names:
        a, b, cc, d = (phases[p].get(name, {}) for p in "ABCD")
        base = mean(a.get("run_s", []) + cc.get("run_s", []))
        rb, rd = mean(b.get("run_s", [])), mean(d.get("run_s", []))
        ref_drift = mean(cc.get("ref_ms", [])) / mean(a.get("ref_ms", []))
        cand_drift = mean(cc.get("cand_ms", [])) / mean(a.get("cand_ms", []))
        same = all(x == a.get("correct", [None])[0] for p in (b, cc, d) for x in p.get("correct", []))
        summary["b"].append(rb / base - 1)
        summary["d"].append(rd / base - 1)
        summary["ref_drift"].append(ref_drift)
        summary["cand_drift"].append(cand_drift)
        summary["a_vs_c"].append(mean(cc.get("run_s", [])) / mean(a.get("run_s", [])) - 1)
        table.append(f"{name:<26} {base:8.3f} {rb:7.3f} {rd:7.3f} {rb / base - 1:6.1%} {rd / base - 1:6.1%} "
                     f"{mean(d.get('profile_s', [])):7.3f} {ref_drift:8.3f} {cand_drift:8.3f}  "
                     f"{'same' if same else 'DIFFER'}{' errors: ' + str(d.get('errors'))[:80] if d.get('errors') else ''}")
    table.append(f"{'mean':<26} {'':8} {'':7} {'':7} {mean(summary['b']):6.1%} {mean(summary['d']):6.1%} {'':7} "
                 f"{mean(summary['ref_drift']):8.3f} {mean(summary['cand_drift']):8.3f}")
    jobs = {p: [x for n in names for x in phases[p].get(n, {}).get("run_s", [])] for p in "ABCD"}
    base_med = (statistics.median(jobs["A"]) + statistics.median(jobs["C"])) / 2
    base_mean = (mean(jobs["A"]) + mean(jobs["C"])) / 2
    table += ["", "pooled over every job (GPU slot wall, s):", "phase  median   mean  median vs A,C  mean vs A,C"]
    for p in "ABCD":
        table.append(f"{p:<6} {statistics.median(jobs[p]):6.3f} {mean(jobs[p]):6.3f} "
                     f"{statistics.median(jobs[p]) / base_med - 1:+13.1%} {mean(jobs[p]) / base_mean - 1:+12.1%}")
    costs = [c["total"] for n in names for p in "BD" for c in phases[p].get(n, {}).get("cost", [])
             if isinstance(c, dict) and isinstance(c.get("total"), (int, float))]
    summary["pooled_median"] = {p: statistics.median(jobs[p]) for p in "ABCD"}
    summary["profile_cost_s"] = {"min": min(costs), "median": statistics.median(costs), "max": max(costs)} \
        if costs else None
    table.append(f"noise: C vs A per candidate (the same configuration twice) {min(summary['a_vs_c']):+.1%} to "
                 f"{max(summary['a_vs_c']):+.1%}")
    if costs:
        table.append(f"the profile step's own cost per job: {min(costs) * 1e3:.0f}-{max(costs) * 1e3:.0f} ms, median "
                     f"{statistics.median(costs) * 1e3:.0f} ms ({statistics.median(costs) / base_med:.1%} of the "
                     f"median slot wall)")
    return "\n".join(table), summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="profile_overhead.json")
    ap.add_argument("--rounds", type=int, default=2, help="repetitions of every candidate per phase")
    ap.add_argument("--from-json", default="", help="print the report of a saved run (its --out) and exit")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            phases = json.load(f)["phases"]
        print(report(phases, list(phases["A"]))[0])
        return
    cands = [c for c in corpus_index.load("honest")]
    cfg = EvalConfig(devices="0", ref_timing_cache=False, share_identical=False, retime_speedup_threshold=0,
                     run_timeout_s=120)
    t0 = time.time()
    with corpus_index.shared_cache_dir() as cache, Evaluator(dataclass_replace(cfg, cache_dir=cache)) as ev:
        ev.evaluate([EvalRequest(c.task, c.task_source, c.response, f"warm:{c.name}") for c in cands])  # builds
        phases = {"A": run_phase(ev, cands, "kevin", args.rounds, "A"),
                  "B": run_phase(ev, cands, "profile", 1, "B"),
                  "C": run_phase(ev, cands, "kevin", args.rounds, "C"),
                  "D": run_phase(ev, cands, "profile", args.rounds, "D")}
        tools = ev.profile_tools
    text, summary = report(phases, [c.name for c in cands])
    print(text)
    print(f"profile tools: {tools}; wall {time.time() - t0:.0f} s")
    with open(args.out, "w") as f:
        json.dump({"phases": phases, "table": text, "summary": summary, "tools": tools}, f, indent=1, default=str)


def dataclass_replace(cfg, **kw):
    import dataclasses
    return dataclasses.replace(cfg, **kw)


if __name__ == "__main__":
    main()
