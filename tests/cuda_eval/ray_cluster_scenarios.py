"""The Ray backend on a local multi-node Ray cluster (ray.cluster_utils.Cluster), CPU device mode; run by
tests/cuda_eval/test_ray_backend.py inside a network namespace of its own (`unshare -n`, loopback up), so that Ray's
servers listen on loopback only. Writes what it saw as JSON to argv[1]; the test asserts on it.

Nodes: the head (this process: the "trainer's host", no evaluation resources), a compile node (cuda_eval_compile
only), a timing node (cuda_eval_gpu only), a timing node whose sandbox cannot be made; each node has a build cache
of its own, so every build is shipped.
The compile node's build cache may be given (argv[2]: the test run's shared cache, whose C++ toolkit build is then a
hit); the local backend uses it too. Scenarios, one cluster:
  verdicts   a CPU-corpus mix through the Ray backend and through the local backend
  node_loss  a batch; the timing node is killed while it runs a job; a new timing node joins; the batch completes
  deadlines  a hanging candidate past the candidate deadline; a batch past the batch deadline
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import corpus_index  # noqa: E402

VERDICT_MIX = ["honest_relu", "honest_row_sum", "wrong_values", "wrong_shape", "raises", "segfault", "os_exit",
               "cache_by_shape", "mutate_input", "torch_in_forward", "return_input", "forge_timer"]


def cpu_config(**kw):
    from cuda_eval.api import EvalConfig
    base = dict(device_type="cpu", run_timeout_s=20, skip_run_on_static_flags=False, num_correct_trials=3,
                timing_target_s=0.05, timing_min_reps=5, timing_max_reps=30, timing_input_sets=2, spare_workers=1,
                retime_speedup_threshold=0, worker_memory_bytes=2 << 30, share_identical=False,
                worker_start_timeout_s=120)
    base.update(kw)
    return EvalConfig(**base)


def summary(r) -> dict:
    return {"request_id": r.request_id, "compiled": r.compiled, "correct": r.correct,
            "flags": sorted(f["code"] for f in r.hack_flags), "runtime_error": r.runtime_error,
            "crash": bool(r.meta.get("crash")), "built_on": r.meta.get("built_on"),
            "timed_on": r.meta.get("timed_on"), "evaluator_timeout": r.meta.get("evaluator_timeout"),
            "internal_error": bool(r.meta.get("internal_error"))}


def shipped_entries(cache_dir: str) -> list[dict]:
    """The build-cache entries a GPU node installed from shipped products (their meta.json)."""
    found = []
    for root, _, files in os.walk(os.path.join(cache_dir, "builds", "entries")):
        if "meta.json" in files:
            with open(os.path.join(root, "meta.json")) as f:
                meta = json.load(f)
            if meta.get("shipped"):
                found.append({"key": os.path.basename(root), "name": meta.get("name")})
    return found


def patient_node_start(limit_s: float = 180.0) -> None:
    """Ray waits 30 s (a constant in ray/_private/node.py) for a starting node to register, asking
    services.get_node in a loop; on a machine busy with other work a node can take longer. The lookup is made to keep
    asking for up to `limit_s` before it reports the node missing (test clusters only)."""
    from ray._private import services
    original = services.get_node

    def get_node(*args, **kwargs):
        deadline = time.monotonic() + limit_s
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    services.get_node = get_node


def main(out_path: str, compile_cache: str | None = None) -> None:
    import ray
    from ray.cluster_utils import Cluster
    patient_node_start()

    from cuda_eval.api import Evaluator
    by_name = {c.name: c for c in corpus_index.load("cpu")}
    out: dict = {"events": []}
    root = tempfile.mkdtemp(prefix="cuda_eval_ray_")
    os.chmod(root, 0o711)

    def node_env(name: str) -> dict:
        cache = compile_cache if name == "compile" and compile_cache else os.path.join(root, f"cache_{name}")
        return {"CUDA_EVAL_CACHE_DIR": cache}

    def event(what: str, **kw) -> None:
        out["events"].append({"t": round(time.monotonic() - t0, 1), "what": what, **kw})
        print(f"[{time.monotonic() - t0:6.1f}s] {what} {kw}", flush=True)

    t0 = time.monotonic()
    for attempt in range(3):   # Ray gives a node 30 s to start: a machine loaded by other work may miss that
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
            compile_node = cluster.add_node(num_cpus=0, resources={"cuda_eval_compile": 2},
                                            env_vars=node_env("compile"))
            timing_node = cluster.add_node(num_cpus=0, resources={"cuda_eval_gpu": 1}, env_vars=node_env("timing1"))
            # a node whose sandbox cannot be made (as root, candidates would run as root): it must take no work
            cluster.add_node(num_cpus=0, resources={"cuda_eval_gpu": 1},
                             env_vars=dict(node_env("nosandbox"), CUDA_EVAL_SANDBOX_IDENTITY="same"))
            break
        except Exception as e:  # noqa: BLE001
            event("cluster start failed", error=str(e)[:200], attempt=attempt)
            if cluster is not None:
                cluster.shutdown()
            if attempt == 2:
                raise
    ray.init(address=cluster.address, namespace="cuda_eval", logging_level="WARNING", log_to_driver=False)
    out["nodes"] = {"head": ray.get_runtime_context().get_node_id(), "compile": compile_node.node_id,
                    "timing1": timing_node.node_id}
    event("cluster up")
    try:
        # --- verdicts: the Ray backend against the local backend ------------------------------------------------
        requests = [corpus_index.request(by_name[n], request_id=n) for n in VERDICT_MIX]
        ev = Evaluator(cpu_config(backend="ray"))
        event("ray evaluator up")
        out["ray"] = [summary(r) for r in ev.evaluate(requests)]
        out["workers"] = ev.cluster.workers()
        out["timing1_shipped"] = shipped_entries(node_env("timing1")["CUDA_EVAL_CACHE_DIR"])
        event("ray verdicts")
        # --- node_loss: the timing node dies mid-batch, another joins -------------------------------------------
        batch = [corpus_index.request(by_name[n], request_id=f"loss{i}-{n}")
                 for i, n in enumerate(["honest_relu", "honest_row_sum", "honest_matmul"] * 2)]
        futures = ev.submit(batch)
        slots = ev.cluster.gpu_dispatcher._slots
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(s.busy for s in slots.values()):
            time.sleep(0.05)
        time.sleep(0.3)   # well inside the job (a CPU job takes seconds)
        pids = [ray.get(s.handle.pid.remote(), timeout=30) for s in slots.values()]
        event("killing the timing node", busy=[s.busy for s in slots.values()], done=sum(f.done() for f in futures))
        out["killed_while_done"] = sum(f.done() for f in futures)
        cluster.remove_node(timing_node, allow_graceful=False)
        for pid in pids:   # a dead node's processes are gone with it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        joined = cluster.add_node(num_cpus=0, resources={"cuda_eval_gpu": 1}, env_vars=node_env("timing2"))
        out["nodes"]["timing2"] = joined.node_id
        event("timing node 2 joined")
        out["node_loss"] = [summary(f.result(timeout=600)) for f in futures]
        event("node_loss batch complete")
        ev.close()
        # --- the local backend on the same requests ------------------------------------------------------------
        # the compile node's cache: its builds (the same content addresses) are hits here
        local = Evaluator(cpu_config(cache_dir=node_env("compile")["CUDA_EVAL_CACHE_DIR"]))
        out["local"] = [summary(r) for r in local.evaluate(requests)]
        local.close()
        event("local verdicts")
        # --- deadlines -----------------------------------------------------------------------------------------
        ev = Evaluator(cpu_config(backend="ray", ray_candidate_deadline_s=6, ray_batch_deadline_s=0,
                                  run_timeout_s=15))
        out["candidate_deadline"] = summary(ev.evaluate([corpus_index.request(by_name["hang"], "hang0")])[0])
        event("candidate deadline")
        ev.close()
        ev = Evaluator(cpu_config(backend="ray", ray_batch_deadline_s=4, run_timeout_s=15))
        hangs = [corpus_index.request(by_name["hang"], f"hang{i}") for i in range(1, 4)]
        out["batch_deadline"] = [summary(r) for r in ev.evaluate(hangs)]
        event("batch deadline")
        ev.close()
    finally:
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1)
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
