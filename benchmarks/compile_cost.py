"""CPU cost of a new candidate in the compile stage, phase by phase, over many realistic distinct candidates.

    python benchmarks/compile_cost.py                          # all candidates, cpu-count workers
    python benchmarks/compile_cost.py --limit 12 --workers 2   # a quick look (2-core dev box)
    python benchmarks/compile_cost.py --json $OUT/cost.json    # GPU box: keep the per-candidate rows
    python benchmarks/compile_cost.py --no-static-record       # every program recorded (before the static record)

Candidates: tests/cuda_eval/corpus (honest, bad, adversarial), benchmarks/candidates and the built-in solutions
(kevin_jax.tasks.builtin_solutions()), each under extension names of its own (a tag added to every literal
`name="..."`, and a tag comment), so that no cache answers any of them: record cache, module cache and object cache
all start empty (a fresh cache dir per run). The precompiled header of the default flag set is built before the
clock starts (`--pch sync`, as a machine that has compiled before has it; its cost is printed apart); a flag set
seen for the first time gets its PCH in the background, as in production, and that CPU shows up in "not in any
phase".

CPU seconds per phase come from the build itself: every compiler process is waited for with wait4, and its rusage
(with the descendants it waited for) is the phase's CPU (BuildResult.phases[].cpu_s; the record process likewise,
timings.record_cpu_s). The CPU of all our child processes over the run (RUSAGE_CHILDREN) and of this process
(RUSAGE_SELF: the pool's threads) are printed too, so that work done for no phase (wasted speculative builds, PCH
builds of new flag sets) is not lost. Candidates that cannot build on this machine for lack of CUDA headers (a
CPU-only torch has no cusparse.h, so ATen/cuda/CUDAContext.h fails) are reported as such and not counted.

Memory: the resident memory of all our descendant processes together (psutil, sampled every 50 ms while the
candidates build: the compilers, the sandbox's helpers, the record process), its peak, and the same before the first
build; with --workers 1 the difference is what one build holds at once, its phases that run side by side (the .cu's
host and device chains, main.cpp beside the .cu) included. kevin_jax.placement counts builds by it.

Projected throughput = cores * 3600 / median CPU-s per candidate (CPU-bound; --cores, default 16 as on the GPU
box). Measured throughput = candidates / wall of the whole run with --workers workers.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))

from cuda_eval.compile.pool import CompileConfig, CompilePool  # noqa: E402

_NAME = re.compile(r"""(\bname\s*=\s*)(["'])(\w+)\2""")
# What a CPU-only torch lacks (the ATen/cuda headers include cusparse.h, cublas_v2.h ...): not the candidate's fault.
_MISSING_CUDA_HEADER = re.compile(r"fatal error: (cusparse|cublas\w*|cusolver\w*|curand\w*|cufft\w*|"
                                  r"c10/cuda/impl/cuda_cmake_macros)\.h: No such file")
# Phase names as the build reports them -> the rows of the table.
PHASES = ("record", "g++ main.cpp", "binding", "nvcc -dryrun", "host preprocess", "cudafe++", "device preprocess",
          "cicc", "ptxas", "fatbinary", "host compile", "nvcc (one command)", "light symbol check", "link",
          "other g++")


def phase_row(name: str) -> str:
    if name.startswith("g++ main.cpp"):
        return "g++ main.cpp"
    if name.startswith("binding"):
        return "binding"
    if name == "nvcc":
        return "nvcc (one command)"
    if name in PHASES:
        return name
    if name.startswith("g++ "):
        return "other g++"
    return "other"


def candidates(limit: int | None) -> list[dict]:
    """[{id, task, code}], distinct programs, in a fixed interleaved order (so that --limit samples every source)."""
    import corpus_index
    groups: list[list[dict]] = []
    for kind in ("honest", "bad", "adversarial"):
        groups.append([{"id": c.id, "task": c.task_source, "code": c.code} for c in corpus_index.load(kind)])
    bench = REPO / "benchmarks" / "candidates"
    groups.append([{"id": f"bench/{p.stem}", "task": (bench / "tasks" / p.name).read_text(), "code": p.read_text()}
                   for p in sorted(bench.glob("*.py"))])
    from kevin_jax.tasks import builtin_solutions, load_builtin_tasks
    tasks = {t.task_id: t.source for t in load_builtin_tasks().tasks}
    groups.append([{"id": f"builtin/{s.task_id}/{s.name}", "task": tasks[s.task_id], "code": s.source}
                   for s in builtin_solutions()])
    out, seen = [], set()
    for i in range(max(len(g) for g in groups)):
        for g in groups:
            if i < len(g) and (g[i]["task"], g[i]["code"]) not in seen:
                seen.add((g[i]["task"], g[i]["code"]))
                out.append(g[i])
    return out[:limit] if limit else out


def distinct(code: str, tag: str) -> str:
    """The program under extension names no other candidate uses, and a text no record cache has seen."""
    return f"# compile_cost {tag}\n" + _NAME.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}_{tag}{m.group(2)}",
                                                 code)


def cost(outcome) -> dict[str, float]:
    """CPU seconds per table row for one compile outcome."""
    out = {"record": outcome.timings.get("record_cpu_s", 0.0)}
    for m in outcome.timings.get("modules", []):
        for p in m.get("phases", []):
            row = phase_row(p["name"])
            out[row] = out.get(row, 0.0) + p.get("cpu_s", 0.0)
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class TreeMemory:
    """The memory of this process's descendants together, sampled on a thread: `peak` the largest sum of their
    resident sets, `peak_anon` the largest sum of their resident sets less file-backed and shared pages (what the
    kernel cannot reclaim; a precompiled header mapped by a compiler is page cache, counted in `peak` only)."""

    def __init__(self, period_s: float = 0.05):
        self._me, self.period_s, self.peak, self.peak_anon = psutil.Process(), period_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def now(self) -> tuple[int, int]:
        rss = anon = 0
        for child in self._me.children(recursive=True):
            try:
                info = child.memory_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss += info.rss
            anon += max(0, info.rss - getattr(info, "shared", 0))
        return rss, anon

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            rss, anon = self.now()
            self.peak, self.peak_anon = max(self.peak, rss), max(self.peak_anon, anon)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def table(rows: list[dict], cores: int) -> str:
    counted = [r for r in rows if r["counted"]]
    totals = [sum(r["cpu"].values()) for r in counted]
    n = len(counted)
    lines = ["| phase | candidates with it | median CPU-s | p90 CPU-s | mean CPU-s | share of all CPU-s |",
             "|---|---|---|---|---|---|"]
    grand = sum(totals) or 1.0
    for ph in PHASES + ("other",):
        vals = [r["cpu"].get(ph, 0.0) for r in counted]
        present = sum(1 for r in counted if ph in r["cpu"])
        if not present:
            continue
        lines.append(f"| {ph} | {present} | {statistics.median(vals):.2f} | {pct(vals, 0.9):.2f} | "
                     f"{statistics.fmean(vals):.2f} | {100 * sum(vals) / grand:.0f}% |")
    if totals:
        med = statistics.median(totals)
        lines.append(f"| **total per candidate** | {n} | **{med:.2f}** | {pct(totals, 0.9):.2f} | "
                     f"{statistics.fmean(totals):.2f} | 100% |")
        lines.append("")
        lines.append(f"Projected for {cores} cores: {cores} * 3600 / {med:.2f} = **{cores * 3600 / med:,.0f} new "
                     f"candidates/hour** (median); at the mean: {cores * 3600 / statistics.fmean(totals):,.0f}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="first N candidates (interleaved over the sources)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="compile pool workers")
    ap.add_argument("--cores", type=int, default=16, help="cores of the machine the projection is for")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--pch", default="sync", choices=("sync", "background", "off"),
                    help="sync: the default flag set's PCH is built before the clock starts")
    ap.add_argument("--no-glue-binding", action="store_true",
                    help="main.cpp exactly as load_inline writes it (the baseline of the glue + binding build)")
    ap.add_argument("--no-static-record", action="store_true",
                    help="record every program in the sandbox, as before the static record (the baseline)")
    ap.add_argument("--sequential-phases", action="store_true",
                    help="nvcc's host and device chains one after the other (CompileConfig.parallel_phases=False)")
    ap.add_argument("--json", default="", help="write the per-candidate rows here")
    ap.add_argument("--keep-cache", default="", help="use (and keep) this cache dir instead of a fresh one")
    args = ap.parse_args(argv)

    cands = candidates(args.limit)
    root = tempfile.mkdtemp(prefix="cuda_eval_cost_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.chmod(root, 0o755)  # the sandbox uids read the cache under it
    cache_dir = args.keep_cache or os.path.join(root, "cache")
    try:
        cfg = CompileConfig(workers=args.workers, arch=args.arch, cache_dir=cache_dir,
                            work_root=os.path.join(root, "work"), pch=args.pch, record_timeout_s=300,
                            compile_timeout_s=1800, glue_binding=not args.no_glue_binding,
                            static_record=not args.no_static_record,
                            parallel_phases=not args.sequential_phases)
        t0, c0 = time.monotonic(), _children_cpu()
        pool = CompilePool(cfg)
        setup = {"wall_s": round(time.monotonic() - t0, 2), "children_cpu_s": round(_children_cpu() - c0, 2)}
        print(f"{len(cands)} candidates, {args.workers} workers, pch={args.pch}; set-up (toolchain, PCH): "
              f"{setup['wall_s']} s wall, {setup['children_cpu_s']} CPU-s", flush=True)
        tag_base = uuid.uuid4().hex[:6]
        rows = []
        t0, c0, s0 = time.monotonic(), _children_cpu(), _self_cpu()
        memory = TreeMemory()
        baseline, baseline_anon = memory.now()
        with pool, memory:
            futures = [(c, pool.submit(c["task"], distinct(c["code"], f"{tag_base}{i}"))) for i, c in enumerate(cands)]
            for c, fut in futures:
                o = fut.result()
                missing = bool(_MISSING_CUDA_HEADER.search(o.log or ""))
                hits = sum(1 for m in o.timings.get("modules", []) if m.get("cache_hit"))
                row = {"id": c["id"], "ok": o.ok, "error_kind": o.error_kind, "counted": not missing,
                       "record_static": bool(o.timings.get("record_static")),
                       "missing_cuda_headers": missing, "cache_hits": hits, "cpu": cost(o),
                       "wall_s": o.timings.get("wall_s"),
                       "header_modes": [m.get("header_mode") for m in o.timings.get("modules", [])],
                       "binding_modes": [m.get("binding_mode") for m in o.timings.get("modules", [])],
                       "binding_failures": [m.get("binding_failure") for m in o.timings.get("modules", [])],
                       "binding_cached": sum(1 for m in o.timings.get("modules", []) for p in m.get("phases", [])
                                             if p["name"] == "binding.o (cached)")}
                rows.append(row)
                print(f"  {c['id']:58s} {'ok' if o.ok else o.error_kind:16s} {sum(row['cpu'].values()):6.1f} CPU-s"
                      f"{'  (no CUDA headers here: not counted)' if missing else ''}"
                      f"{f'  ({hits} cache hits!)' if hits else ''}", flush=True)
        wall = time.monotonic() - t0
        children, own = _children_cpu() - c0, _self_cpu() - s0
    finally:
        if not args.keep_cache:
            shutil.rmtree(root, ignore_errors=True)

    counted = [r for r in rows if r["counted"]]
    attributed = sum(sum(r["cpu"].values()) for r in rows)
    print()
    print(table(rows, args.cores))
    print()
    kinds: dict[str, int] = {}
    for r in counted:
        kinds[r["error_kind"] or "ok"] = kinds.get(r["error_kind"] or "ok", 0) + 1
    print(f"Counted {len(counted)} of {len(rows)} candidates ({len(rows) - len(counted)} need CUDA headers this "
          f"machine lacks); outcomes: {', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}.")
    print(f"Builds read from the source (static record, no record process): "
          f"{sum(r.get('record_static', False) for r in counted)} of {len(counted)}"
          f"{' (off: --no-static-record)' if args.no_static_record else ''}.")
    modes: dict[str, int] = {}
    for r in counted:
        for m in r["binding_modes"]:
            modes[m or "none"] = modes.get(m or "none", 0) + 1
    print(f"main.cpp built as: {', '.join(f'{k} {v}' for k, v in sorted(modes.items()))}; binding objects from the "
          f"cache: {sum(r['binding_cached'] for r in counted)}.")
    print(f"Measured with {args.workers} workers: {len(rows)} candidates in {wall:.1f} s wall = "
          f"{3600 * len(rows) / wall:,.0f} candidates/hour on this machine ({os.cpu_count()} cores).")
    print(f"CPU over the run: child processes {children:.1f} s (phases account for {attributed:.1f} s; not in any "
          f"phase: {children - attributed:.1f} s), this process {own:.1f} s.")
    print(f"Memory of the child processes together (sampled every {memory.period_s * 1e3:.0f} ms), peak: resident "
          f"{memory.peak / 2**30:.2f} GiB ({baseline / 2**30:.2f} before the first build), of it not file-backed or "
          f"shared {memory.peak_anon / 2**30:.2f} GiB ({baseline_anon / 2**30:.2f} before); with {args.workers} "
          f"worker(s), per build at the peak: {(memory.peak - baseline) / 2**30 / args.workers:.2f} GiB resident, "
          f"{(memory.peak_anon - baseline_anon) / 2**30 / args.workers:.2f} GiB not file-backed.")
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "wall_s": wall, "workers": args.workers, "cpus": os.cpu_count(),
                       "children_cpu_s": children, "self_cpu_s": own, "setup": setup,
                       "memory_peak_bytes": memory.peak, "memory_baseline_bytes": baseline,
                       "memory_peak_anon_bytes": memory.peak_anon, "memory_baseline_anon_bytes": baseline_anon},
                      f, indent=1)
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
