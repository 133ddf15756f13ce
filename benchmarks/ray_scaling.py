"""Evaluation throughput on a Ray cluster of 1, 2, 3 GPUs against the local backend on one GPU, one machine.

    python benchmarks/ray_scaling.py --step local --out /tmp/ray_scaling     # the local backend on GPU 1
    python benchmarks/ray_scaling.py --step ray --gpus 1,2,3 --out /tmp/ray_scaling
    python benchmarks/ray_scaling.py --step table --out /tmp/ray_scaling     # the table, from the JSON files

(runs/ray_eval.sh runs them on a 4-GPU machine.) The candidates are benchmarks/eval_throughput.py's mix (every
honest kernel, bad and adversarial ones, repeats), `--repeat` times with distinct ids (share_identical off). The
build cache is warmed first (`--step local` runs the mix once in compile_only mode), so the measured passes time
evaluation at its steady state: a GPU job per candidate, builds from the cache. Each pass is timed from submit to
the last verdict; start-up (workers, judges) is reported apart.

- local: Evaluator(devices=[GPU 1], compile_workers=--cores-per-gpu), the local backend.
- ray N: a Ray cluster on this machine (ray.cluster_utils.Cluster): a head with no evaluation resources (the
  trainer's host) and N nodes, node k with GPU k (CUDA_VISIBLE_DEVICES) offering cuda_eval_gpu=1 and
  cuda_eval_compile=--cores-per-gpu (compile cores scaled with the GPUs); Evaluator(backend="ray").
The table: candidates/hour, the ratio to the local backend (target >= 2.7x at 3 GPUs), the verdicts (compiled,
correct, flags) that agree with the local backend's, and the p95 of |speedup ratio - 1| over paired correct kernels
of >= 50 us (target <= 0.02).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))
sys.path.insert(0, str(REPO / "benchmarks"))

import corpus_index  # noqa: E402
from eval_throughput import the_mix  # noqa: E402


def add_gpu_node(cluster, gpu: str, cores: int):
    """A node of `cluster` that gives evaluation GPU `gpu` and `cores` build slots. CUDA_VISIBLE_DEVICES is set for
    the node's processes and, while the node starts, in this process too: Ray reads the node's GPU ids from it."""
    with _visible(gpu):
        return cluster.add_node(num_cpus=cores, num_gpus=1, env_vars={"CUDA_VISIBLE_DEVICES": gpu},
                                resources={"cuda_eval_gpu": 1, "cuda_eval_compile": cores})


@contextlib.contextmanager
def _visible(gpu: str):
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def config(args, **kw):
    from cuda_eval.api import EvalConfig
    base = dict(cache_dir=args.cache_dir, run_timeout_s=60, share_identical=False, compile_workers=args.cores_per_gpu)
    base.update(kw)
    return EvalConfig(**base)


def requests(args):
    mix = the_mix() * args.repeat
    return mix, [corpus_index.request(c, f"{i}:{c.id}") for i, c in enumerate(mix)]


def timed_pass(ev, args) -> dict:
    mix, reqs = requests(args)
    t0 = time.monotonic()
    results = ev.evaluate(reqs)
    wall = time.monotonic() - t0
    rows = [{"id": r.request_id, "compiled": r.compiled, "correct": r.correct,
             "flags": sorted(f["code"] for f in r.hack_flags), "speedup": r.speedup,
             "median_ms": (r.timing or {}).get("median_ms"), "internal_error": bool(r.meta.get("internal_error")),
             "error": (r.runtime_error or "")[:200], "built_on": (r.meta.get("built_on") or {}).get("hostname"),
             "timed_on": r.meta.get("device")} for r in results]
    return {"n": len(rows), "wall_s": wall, "per_hour": len(rows) / wall * 3600, "rows": rows,
            "run_sum_s": sum(r.stage_times.get("run", 0.0) for r in results)}


def step_local(args) -> None:
    from cuda_eval.api import Evaluator
    _, reqs = requests(args)
    t0 = time.monotonic()
    with Evaluator(config(args, mode="compile_only", arch=args.arch, compile_workers=os.cpu_count() or 1)) as ev:
        built = ev.evaluate(reqs[:len(the_mix())])    # the build cache, warm for every measured pass
    print(f"cache warmed: {sum(bool(r.compiled) for r in built)} of {len(built)} built, "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    t0 = time.monotonic()
    ev = Evaluator(config(args, devices=str(args.local_gpu)))
    ev.gpu_pool.device_info()
    startup = time.monotonic() - t0
    out = timed_pass(ev, args)
    ev.close()
    out.update(backend="local", gpus=1, startup_s=startup)
    save(args, "local", out)


def step_ray(args, n: int) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from cuda_eval.api import Evaluator
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0,
                                                             "include_dashboard": False})
    for k in range(n):
        add_gpu_node(cluster, str(args.first_gpu + k), args.cores_per_gpu)
    ray.init(address=cluster.address, namespace="cuda_eval", logging_level="WARNING", log_to_driver=False)
    try:
        ev = Evaluator(config(args, backend="ray"))
        ev.gpu_pool.device_info(timeout_s=600)
        deadline = time.monotonic() + 600
        # compile workers register on their own (a node's compile actor starts after its GPU worker): wait for both,
        # so the line below reports the pool the timed pass runs on
        while time.monotonic() < deadline:
            registered = ev.cluster.workers()
            if len(registered["gpu"]) >= n and len(registered["compile"]) >= n:
                break
            time.sleep(0.5)
        startup = time.monotonic() - t0
        workers = ev.cluster.workers()
        gpus = sorted(w["gpu"] for w in workers["gpu"])
        if len(set(gpus)) != n:
            sys.exit(f"ray {n}: the GPU workers got GPUs {gpus}, not {n} distinct ones (Ray's GPU ids per node)")
        print(f"ray {n}: {len(workers['gpu'])} GPU workers, {len(workers['compile'])} compile workers, "
              f"refused {workers['gpu_refused'] or 'none'}, start-up {startup:.0f} s", flush=True)
        out = timed_pass(ev, args)
        ev.close()
        out.update(backend="ray", gpus=n, startup_s=startup, workers=workers)
        save(args, f"ray{n}", out)
    finally:
        ray.shutdown()
        cluster.shutdown()


def save(args, name: str, out: dict) -> None:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{name}: {out['n']} candidates in {out['wall_s']:.1f} s = {out['per_hour']:.0f}/hour", flush=True)


def step_table(args) -> None:
    runs = {}
    for path in sorted(Path(args.out).glob("*.json")):
        if path.stem == "local" or path.stem.startswith("ray"):
            runs[path.stem] = json.loads(path.read_text())
    local = runs.get("local")
    if local is None:
        sys.exit(f"no local.json in {args.out}: run --step local first")
    ref = {r["id"]: r for r in local["rows"]}
    print(f"{'backend':<8}{'GPUs':>5}{'cands':>7}{'wall s':>8}{'cand/h':>8}{'x local':>9}{'agree':>9}"
          f"{'int.err':>8}{'p95|r-1|':>10}")
    for name in ["local"] + sorted(k for k in runs if k != "local"):
        run = runs[name]
        agree = sum((r["compiled"], r["correct"], r["flags"]) ==
                    (ref[r["id"]]["compiled"], ref[r["id"]]["correct"], ref[r["id"]]["flags"])
                    for r in run["rows"] if r["id"] in ref)
        ratios = sorted(abs(r["speedup"] / ref[r["id"]]["speedup"] - 1) for r in run["rows"]
                        if r["id"] in ref and r["speedup"] and ref[r["id"]]["speedup"]
                        and (ref[r["id"]]["median_ms"] or 0) >= 0.05)
        p95 = ratios[min(len(ratios) - 1, int(0.95 * len(ratios)))] if ratios else float("nan")
        print(f"{run['backend']:<8}{run['gpus']:>5}{run['n']:>7}{run['wall_s']:>8.1f}{run['per_hour']:>8.0f}"
              f"{run['per_hour'] / local['per_hour']:>9.2f}{agree:>5}/{run['n']:<3}"
              f"{sum(r['internal_error'] for r in run['rows']):>8}{p95:>10.3f}")
    disagree = [(r["id"], r["compiled"], r["correct"], r["flags"], ref[r["id"]]["correct"], ref[r["id"]]["flags"])
                for name, run in runs.items() if name != "local" for r in run["rows"]
                if r["id"] in ref and (r["compiled"], r["correct"], r["flags"]) !=
                (ref[r["id"]]["compiled"], ref[r["id"]]["correct"], ref[r["id"]]["flags"])]
    for d in disagree[:20]:
        print("disagrees with local:", d)
    if len(runs) > 1:
        print("median speedup ratios per run:", {k: statistics.median(
            [r["speedup"] / ref[r["id"]]["speedup"] for r in v["rows"] if r["speedup"] and ref[r["id"]]["speedup"]]
            or [float("nan")]) for k, v in runs.items()})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--step", choices=["local", "ray", "table"], required=True)
    p.add_argument("--out", required=True, help="directory of the JSON files (one per pass)")
    p.add_argument("--gpus", default="1,2,3", help="--step ray: pool sizes to measure")
    p.add_argument("--first-gpu", type=int, default=1, help="the pool's first GPU (GPU 0 is the trainer's)")
    p.add_argument("--local-gpu", type=int, default=1)
    p.add_argument("--cores-per-gpu", type=int, default=max(1, (os.cpu_count() or 4) // 4))
    p.add_argument("--repeat", type=int, default=2, help="copies of the mix per pass")
    p.add_argument("--arch", default="auto")
    p.add_argument("--cache-dir", default="/var/tmp/cuda_eval_ray_scaling_cache",
                   help="one build cache for every node of this machine (sandbox-readable)")
    args = p.parse_args()
    os.makedirs(args.cache_dir, mode=0o755, exist_ok=True)
    if args.step == "local":
        step_local(args)
    elif args.step == "ray":
        for n in [int(x) for x in args.gpus.split(",") if x.strip()]:
            step_ray(args, n)
    if args.step == "table" or os.path.exists(os.path.join(args.out, "local.json")):
        step_table(args)


if __name__ == "__main__":
    main()
