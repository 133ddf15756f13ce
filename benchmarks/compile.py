"""Compile-stage benchmark: where the time of turning a KernelBench solution into a loadable module goes.

    python benchmarks/compile.py --out $OUT/compile.json            # GPU host: a few minutes
    python benchmarks/compile.py --quick --out /tmp/compile.json     # 2-core dev box: fewer repetitions

Rows (median / min / max seconds over the repetitions; CPU seconds where we run the processes):
  torch load_inline cold / warm   the KernelBench way (fresh process, ninja), the baseline
  nvcc, torch headers             the .cu exactly as load_inline writes it, one nvcc command
  nvcc, kernel only               the same kernel without any torch header: the floor of a CUDA compile
  ours: new candidate             CompilePool on a never-seen candidate (PCH already built): record + build
  ours: cache hit                 the same candidate again
  ours: N different in parallel   N never-seen candidates submitted at once (vs one alone: the ratio)
  ablations                       exact headers / sequential nvcc / no PCH, one switch at a time
and a per-phase breakdown of our cold builds (host chain, device chain and main.cpp run concurrently, so their
sum exceeds the wall time). Everything also goes to --out as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuda_eval.compile.pool import CompileConfig, CompilePool  # noqa: E402
from cuda_eval.compile.toolchain import detect  # noqa: E402

CANDIDATES = REPO / "benchmarks" / "candidates"
_NAME = re.compile(r"""name\s*=\s*(["'])(\w+)\1""")


def candidate(name: str) -> tuple[str, str]:
    return (CANDIDATES / "tasks" / f"{name}.py").read_text(), (CANDIDATES / f"{name}.py").read_text()


def all_candidates() -> list[str]:
    return sorted(p.stem for p in CANDIDATES.glob("*.py"))


def fresh(code: str) -> str:
    """The same program under new extension names: nothing of it is in any cache (module or object)."""
    tag = uuid.uuid4().hex[:8]
    return _NAME.sub(lambda m: f"name={m.group(1)}{m.group(2)}_{tag}{m.group(1)}", code)


def stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s: dict, key: str = "median") -> str:
    return f"{s[key]:8.2f}" if s.get("n") else "     n/a"


# --- baselines ------------------------------------------------------------------------------------------------------
LOAD_INLINE_SCRIPT = r"""
import json, os, sys, time
t0 = time.monotonic()
import torch
import torch.utils.cpp_extension as ce
t_import = time.monotonic() - t0
if ce.CUDA_HOME is None:          # a CPU-only torch (dev box): point it at the toolkit so that it compiles,
    ce.CUDA_HOME = sys.argv[2]    # and link only the torch libraries that exist (no c10_cuda / torch_cuda)
    _prepare = ce._prepare_ldflags
    ce._prepare_ldflags = lambda *a, **k: [f for f in _prepare(*a, **k) if f not in ("-lc10_cuda", "-ltorch_cuda")]
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", sys.argv[3])
code = open(sys.argv[1]).read()
t1 = time.monotonic()
exec(compile(code, "candidate.py", "exec"), {"__name__": "candidate"})
print(json.dumps({"import_torch_s": t_import, "load_inline_s": time.monotonic() - t1}))
"""


def _kill_session(sid: int) -> None:
    """Kill every process of session `sid` (ninja puts each compiler in its own process group)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass


def torch_load_inline(code: str, ext_dir: str, tc, timeout: float) -> dict | None:
    """One fresh process running the candidate as KernelBench does (torch's load_inline + ninja)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    arch = tc.arch[3:]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": ext_dir, "MAX_JOBS": str(os.cpu_count() or 1)}
    t0 = time.monotonic()
    # Own session: ninja and the compilers go down with it if we are interrupted.
    p = subprocess.Popen([sys.executable, "-c", LOAD_INLINE_SCRIPT, f.name, tc.cuda_home, f"{arch[:-1]}.{arch[-1]}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if p.poll() is None:
            _kill_session(p.pid)
            p.wait()
        os.unlink(f.name)
    if p.returncode != 0:
        print(f"  load_inline failed:\n{stderr.strip()[-3000:]}", file=sys.stderr)
        return None
    out = json.loads(stdout.strip().splitlines()[-1])
    out["process_s"] = time.monotonic() - t0
    return out


def nvcc_time(cu_text: str, flags: list[str], tc, workdir: str) -> tuple[float, float, dict]:
    """(wall, cpu, nvcc -time phases in seconds) of one plain nvcc -c."""
    os.makedirs(workdir, exist_ok=True)
    cu = os.path.join(workdir, "cuda.cu")
    with open(cu, "w") as f:
        f.write(cu_text)
    csv = os.path.join(workdir, "time.csv")
    t0 = time.monotonic()
    r0 = os.times()
    p = subprocess.run([tc.nvcc, *flags, "-time", csv, "-c", cu, "-o", os.path.join(workdir, "cuda.o")],
                       capture_output=True, text=True, cwd=workdir)
    r1 = os.times()
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"nvcc failed:\n{p.stderr[-2000:]}")
    phases: dict[str, float] = {}
    for line in open(csv).read().splitlines()[1:]:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) > 6 and parts[1]:
            phases[parts[1]] = phases.get(parts[1], 0.0) + float(parts[6]) / 1000
    return wall, (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system), phases


KERNEL_ONLY = r"""
#include <cuda_runtime.h>
__global__ void elementwise_add_kernel(const float* a, const float* b, float* out, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) out[idx] = a[idx] + b[idx];
}
void launch(const float* a, const float* b, float* out, int size) {
    elementwise_add_kernel<<<(size + 255) / 256, 256>>>(a, b, out, size);
}
"""


# --- ours ---------------------------------------------------------------------------------------------------------------
def merge_phases(outcome) -> dict:
    """phase name -> (wall, cpu) seconds of one compile (repeated names summed), plus record."""
    out = {"record (python + torch import + candidate)": (outcome.timings.get("record_s", 0.0),
                                                           outcome.timings.get("record_cpu_s", 0.0))}
    for m in outcome.timings.get("modules", []):
        for p in m.get("phases", []):
            w, c = out.get(p["name"], (0.0, 0.0))
            out[p["name"]] = (w + p["seconds"], c + p.get("cpu_s", 0.0))
    return out


def cpu_total(outcome) -> float:
    return sum(c for _, c in merge_phases(outcome).values())


def run_ours(pool: CompilePool, names: list[str], reps: int) -> tuple[dict, dict, list]:
    cold, hit, outcomes = [], [], []
    for i in range(reps):
        name = names[i % len(names)]
        task, code = candidate(name)
        code = fresh(code)
        t0 = time.monotonic()
        out = pool.compile(task, code)
        cold.append(time.monotonic() - t0)
        if not out.ok:
            raise RuntimeError(f"{name} failed to compile ({out.error_kind}):\n{out.log}")
        outcomes.append(out)
        t0 = time.monotonic()
        again = pool.compile(task, code)
        hit.append(time.monotonic() - t0)
        assert again.ok and all(m.cache_hit for m in again.modules)
        print(f"  {name:20s} cold {cold[-1]:6.1f} s  hit {hit[-1]:5.2f} s  header {out.modules[0].header_mode}",
              flush=True)
    return stats(cold), stats(hit), outcomes


def run_parallel(pool: CompilePool, names: list[str], n: int) -> tuple[float, list]:
    jobs = []
    for i in range(n):
        task, code = candidate(names[i % len(names)])
        jobs.append((task, fresh(code)))
    t0 = time.monotonic()
    futures = [pool.submit(t, c) for t, c in jobs]
    outs = [f.result() for f in futures]
    wall = time.monotonic() - t0
    bad = [o for o in outs if not o.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} parallel compiles failed: {bad[0].error_kind}\n{bad[0].log}")
    return wall, outs


class _Done(Exception):
    """The rest of the rows were skipped."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="compile.json")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (slow machines)")
    ap.add_argument("--reps", type=int, default=None, help="cold compiles of our pipeline (default 6, quick 3)")
    ap.add_argument("--baseline-reps", type=int, default=None, help="torch load_inline / nvcc runs (default 2)")
    ap.add_argument("--parallel", type=int, default=16, help="different candidates compiled at once")
    ap.add_argument("--workers", type=int, default=None, help="compile pool workers (default: cpu count)")
    ap.add_argument("--arch", default="auto")
    ap.add_argument("--skip", default="", help="comma list of: baseline,nvcc,ours,parallel,ablations")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanups (finally blocks) when killed
    reps = args.reps or (3 if args.quick else 6)
    base_reps = args.baseline_reps or (1 if args.quick else 2)
    skip = set(filter(None, args.skip.split(",")))
    workers = args.workers or os.cpu_count() or 1
    root = tempfile.mkdtemp(prefix="cuda_eval_bench_", dir="/tmp")
    os.chmod(root, 0o711)
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "rows": {}}
    rows = results["rows"]
    names = all_candidates()
    try:
        cache_dir = os.path.join(root, "cache")
        t0 = time.monotonic()
        tc = detect(args.arch, cache_dir=cache_dir)
        results["toolchain"] = tc.summary()
        results["toolchain_detect_s"] = time.monotonic() - t0
        print(f"toolchain: {tc.summary()}  ({results['toolchain_detect_s']:.1f} s, once per machine)", flush=True)

        # --- baselines
        task, add_code = candidate("add")
        if "baseline" not in skip and shutil.which("ninja"):
            cold, warm = [], []
            ext_dir = os.path.join(root, "torch_extensions")
            for _ in range(base_reps):
                code = fresh(add_code)
                r = torch_load_inline(code, ext_dir, tc, timeout=1200)
                if r:
                    cold.append(r["load_inline_s"])
                    results.setdefault("torch_import_s", r["import_torch_s"])
                    w = torch_load_inline(code, ext_dir, tc, timeout=600)
                    if w:
                        warm.append(w["load_inline_s"])
            rows["torch load_inline cold (ninja)"] = stats(cold)
            rows["torch load_inline warm (built before)"] = stats(warm)
            print(f"torch load_inline: cold {stats(cold)}  warm {stats(warm)}", flush=True)
        elif "baseline" not in skip:
            rows["torch load_inline cold (ninja)"] = {"n": 0, "note": "ninja not installed"}

        if "nvcc" not in skip:
            from cuda_eval.compile.sources import cuda_cu
            from cuda_eval.protocol.extension_spec import spec_from_load_inline
            import ast
            src = ast.literal_eval(re.search(r'elementwise_add_source = (""".*?""")', add_code, re.S).group(1))
            spec = spec_from_load_inline(name="elementwise_add", cpp_sources="", cuda_sources=src)
            flags = tc.flags("elementwise_add", with_cuda=True)["cuda_cflags"]
            walls, cpus, phase_list = [], [], []
            for i in range(base_reps):
                w, c, ph = nvcc_time(cuda_cu(spec, light=False), flags, tc, os.path.join(root, f"nvcc{i}"))
                walls.append(w)
                cpus.append(c)
                phase_list.append(ph)
            rows["nvcc, .cu as load_inline writes it"] = {**stats(walls), "cpu": stats(cpus)}
            results["nvcc_phases_torch_headers"] = phase_list[-1]
            kw, kc = [], []
            arch_flag = [f for f in flags if f.startswith("-gencode")]
            for i in range(3):
                w, c, _ = nvcc_time(KERNEL_ONLY, arch_flag + ["-Xcompiler", "-fPIC"], tc,
                                    os.path.join(root, f"kernel{i}"))
                kw.append(w)
                kc.append(c)
            rows["nvcc, kernel only (no torch headers)"] = {**stats(kw), "cpu": stats(kc)}
            print(f"nvcc torch headers {stats(walls)}; kernel only {stats(kw)}", flush=True)

        # --- ours
        if "ours" in skip:
            raise _Done
        cfg = CompileConfig(workers=workers, arch=args.arch, cache_dir=cache_dir, work_root=os.path.join(root, "work"),
                            pch="sync", record_timeout_s=300, compile_timeout_s=1800)
        t0 = time.monotonic()
        with CompilePool(cfg) as pool:
            results["pch_build_s"] = time.monotonic() - t0
            print(f"precompiled header built in {results['pch_build_s']:.1f} s (once per toolchain)", flush=True)
            cold, hit, outcomes = run_ours(pool, names, reps)
            rows["ours: new candidate (cold, PCH ready)"] = {**cold, "cpu": stats([cpu_total(o) for o in outcomes])}
            rows["ours: cache hit"] = hit
            phases: dict[str, list] = {}
            for o in outcomes:
                for k, (w, c) in merge_phases(o).items():
                    phases.setdefault(k, []).append((w, c))
            results["phases"] = {k: {"wall": statistics.median(w for w, _ in v),
                                     "cpu": statistics.median(c for _, c in v), "n": len(v)}
                                 for k, v in phases.items()}
            results["header_modes"] = [o.modules[0].header_mode for o in outcomes]
            if "parallel" not in skip:
                wall, outs = run_parallel(pool, names, args.parallel)
                single = cold.get("median", float("nan"))
                rows[f"ours: {args.parallel} different in parallel"] = {
                    "median": wall, "min": wall, "max": wall, "n": 1,
                    "ratio_vs_one": wall / single if single else None,
                    "per_candidate_median": statistics.median(o.timings["wall_s"] for o in outs),
                    "cpu": stats([cpu_total(o) for o in outs])}
                print(f"{args.parallel} in parallel: {wall:.1f} s = {wall / single:.2f} x one", flush=True)

        if "ablations" not in skip:
            # One switch at a time on the add kernel; and the host optimisation level on a candidate asking for -O3
            # (nvcc passes it to the host compiler: the gcc pass over the huge cudafe++ output).
            for label, name, overrides in (("exact headers (add)", "add", {"light_headers": False}),
                                           ("sequential nvcc (add)", "add", {"parallel_phases": False}),
                                           ("no PCH (add)", "add", {"pch": "off"}),
                                           ("no speculation (add)", "add", {"speculate": False}),
                                           ("as is, -O3 in its flags (relu)", "relu", {}),
                                           ("host_opt_level=-O0 (relu)", "relu", {"host_opt_level": "-O0"})):
                acfg = CompileConfig(**{**cfg.__dict__, "pch": "sync", **overrides, "workers": 1})
                with CompilePool(acfg) as pool:
                    c, _, outs = run_ours(pool, [name], max(1, reps // 3))
                rows[f"ablation: {label}"] = {**c, "cpu": stats([cpu_total(o) for o in outs])}
    except _Done:
        pass
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print()
    print(f"{'configuration':44s} {'median':>8s} {'min':>8s} {'max':>8s}  {'cpu med':>8s}  n")
    for label, s in rows.items():
        cpu = s.get("cpu", {})
        extra = f"  ratio vs one {s['ratio_vs_one']:.2f}" if s.get("ratio_vs_one") else ""
        print(f"{label:44s} {fmt(s)} {fmt(s, 'min')} {fmt(s, 'max')}  {fmt(cpu) if cpu else '        '}  "
              f"{s.get('n', 0)}{extra}")
    if results.get("phases"):
        print("\nper-phase breakdown of our cold builds (median seconds; chains overlap, so the sum exceeds the wall)")
        for k, v in sorted(results["phases"].items(), key=lambda kv: -kv[1]["wall"]):
            print(f"  {k:44s} wall {v['wall']:7.2f}  cpu {v['cpu']:7.2f}")
    if results.get("nvcc_phases_torch_headers"):
        print("\nnvcc -time phases, .cu with torch headers (sequential inside nvcc)")
        for k, v in results["nvcc_phases_torch_headers"].items():
            print(f"  {k:44s} {v:7.2f}")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
