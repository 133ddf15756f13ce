"""The optimiser step with the float32 master weights and AdamW moments in host memory: the candidate mechanisms,
timed on this machine's GPU(s) at a realistic shard size, against the state resident on the GPU.

    python benchmarks/optimizer_offload.py --out $OUT/optimizer_offload.json             # 1 x H100: 2G, 4G params
    python benchmarks/optimizer_offload.py --params-per-gpu 2 --out $OUT/oo_x4.json       # 4 GPUs, every variant
    python benchmarks/optimizer_offload.py --params-per-gpu 8.2 --variants pinned_host_layers --grad-dtype bfloat16 \
        --out $OUT/oo_x4_32b.json                # 4 GPUs: QwQ-32B itself (8.2G per GPU), the h100x4 layout

The parameter tree is QwQ-32B's (kevin_jax.model.shapes "qwq_32b": embeddings, LM head and a stack of decoder
layers, sharded FSDP over every local GPU as the trainer shards it) with as many layers as make --params-per-gpu
billion parameters per GPU (the full 64 layers on 4 GPUs = 8.2G per GPU). Each (variant, size) runs in its own
process: one compile + warm-up update, then --reps timed updates (median). The gradients are given (float32 or
--grad-dtype bfloat16), the update includes global-norm clipping and weight decay, and leaves the new weights on the
GPU(s) in the compute dtype (bf16; resident: the float32 weights themselves).

Variants:
  resident            the state on the GPU: the trainer's optim.offload="none" program (baseline; skipped where
                      16-20 bytes per parameter do not fit the GPU).
  pinned_host_layers  the trainer's optim.offload="pinned_host" program (kevin_jax.rl.offload): master weights and
                      moments in pinned_host memory, streamed through the GPU one decoder layer at a time inside the
                      jitted step (dynamic slices of the host buffers, updated in place).
  pinned_host_whole   the same state, the whole tree moved to the GPU inside one jit (jax.device_put to the device
                      memory kind), updated by optax there, returned to pinned_host by out_shardings (needs the whole
                      state on the GPU at once: skipped where it does not fit).
  host_compute        the same state; the gradients moved to host memory and the AdamW step computed by the host CPU
                      inside the jitted step (jax's compute_on "device_host"), the new bf16 weights moved back.
  host_backend        the state as arrays of JAX's CPU backend; gradients gathered to the host (device_get), AdamW
                      jitted for the CPU backend, the new bf16 weights put back on the GPU(s).

Columns: the state's build (rl_state.init_state from float32 weights on the GPUs: seconds, and host bytes per second);
ms per update; state GB/s = 2 x (master + moments bytes) / time (the state's traffic in and out, the definition under
which an update of 1G parameters streamed whole ran at 53 GB/s on one H100); peak GB of the first GPU (allocator peak,
init included); the projection to QwQ-32B on 4 GPUs (8.19G parameters per GPU) per update and per RL step (2 updates):
for the per-GPU mechanisms (resident, pinned_host_*) the time per parameter of one GPU's shard (valid as measured when
run on the 4 GPUs: they share the host's memory bandwidth), for the host-CPU mechanisms the time per parameter of the
whole model (one host computes every GPU's shard). Variants that need more GPU memory or host RAM than there is are
skipped with the reason (at QwQ-32B's size only the per-layer stream fits 4 x H100 and 512 GB).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # sibling benchmark modules

import worker_process  # noqa: E402

VARIANTS = ("resident", "pinned_host_layers", "pinned_host_whole", "host_compute", "host_backend")
QWQ_PARAMS = 32_763_876_352
GB = 1e9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params-per-gpu", default="2,4", help="comma-separated billions of parameters per GPU")
    p.add_argument("--model", default="qwq_32b", help="the shape whose layers are stacked (tiny: a CPU smoke test)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=3, help="timed updates per variant (after one warm-up)")
    p.add_argument("--grad-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--budget-s", type=float, default=540, help="stop starting new runs after this many seconds")
    p.add_argument("--timeout", type=int, default=400, help="seconds per run")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------- one run
def _layers_for(model: str, billions_per_gpu: float, n_gpus: int) -> int:
    from kevin_jax.model.shapes import named_config

    full = named_config(model)
    outside = full.param_count() - full.num_hidden_layers * full.layer_param_count()
    return max(1, round((billions_per_gpu * 1e9 * n_gpus - outside) / full.layer_param_count()))


def run_one(variant: str, billions_per_gpu: float, args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import psutil
    from flax import nnx

    from kevin_jax import parallel
    from kevin_jax.model import qwen2
    from kevin_jax.model.shapes import named_config
    from kevin_jax.rl import loss as rl_loss
    from kevin_jax.rl import offload as offload_lib
    from kevin_jax.rl import state as rl_state

    devices = jax.local_devices()
    n = len(devices)
    layers = _layers_for(args.model, billions_per_gpu, n)
    config = dataclasses.replace(named_config(args.model), num_hidden_layers=layers)
    total = config.param_count()
    per_gpu = total / n
    hbm = (devices[0].memory_stats() or {}).get("bytes_limit", 0)
    out = {"variant": variant, "params_per_gpu": per_gpu, "params_total": total, "layers": layers, "gpus": n,
           "device_kind": devices[0].device_kind, "jax": jax.__version__, "hbm_bytes": hbm}
    grad_bytes = 4 if args.grad_dtype == "float32" else 2
    # bytes per parameter on the GPU the variant needs at its peak (state, gradients, update temporaries)
    need = {"resident": 4 + 8 + grad_bytes + 4, "pinned_host_whole": 2 + grad_bytes + 12 + 12,
            "pinned_host_layers": 2 + grad_bytes, "host_compute": 2 + grad_bytes, "host_backend": 2 + grad_bytes}
    if hbm and need[variant] * per_gpu > 0.92 * hbm:
        out["status"] = f"skipped: needs ~{need[variant] * per_gpu / GB:.0f} GB per GPU of {hbm / GB:.0f}"
        return out
    # host RAM per parameter: the state (12), and for the host-CPU variants the gradients and new weights there too
    host_need = {"resident": 0, "pinned_host_whole": 12, "pinned_host_layers": 12,
                 "host_compute": 12 + grad_bytes + 2, "host_backend": 12 + grad_bytes + 2 + 4}[variant] * total
    available = psutil.virtual_memory().available
    if host_need > 0.9 * available:
        out["status"] = f"skipped: needs ~{host_need / GB:.0f} GB of host RAM, {available / GB:.0f} GB available"
        return out

    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="float32")
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=-1), devices=devices)
    graphdef, abstract = nnx.split(qwen2.abstract_model(config, options))
    shardings = qwen2.param_shardings(abstract, mesh)
    grad_dtype = rl_state.GRAD_DTYPES[args.grad_dtype]

    def filled(value, dtype):
        return jax.tree.map(lambda a, s: jax.jit(lambda: jnp.full(a.shape, value, dtype), out_shardings=s)(),
                            abstract, shardings)

    optim = rl_state.OptimConfig(learning_rate=2e-6, warmup_fraction=0.0,
                                 offload="none" if variant == "resident" else "pinned_host",
                                 grad_dtype=args.grad_dtype if variant != "resident" else "float32")
    tx = rl_state.make_optimizer(optim, 100)
    schedule = rl_state.learning_rate_schedule(optim, 100)
    offload = rl_state.host_offload(optim, 100, jnp.bfloat16)
    grads = filled(1e-3, grad_dtype if variant != "resident" else jnp.float32)
    t0 = time.perf_counter()
    state = rl_state.init_state(filled(0.02, jnp.float32), tx, offload)
    jax.block_until_ready(state)
    out["init_s"] = round(time.perf_counter() - t0, 2)
    state_bytes = offload_lib.state_bytes(state)
    out["host_state_bytes"] = state_bytes.get(offload_lib.HOST, 0)
    moved = 12 * total          # master + mu + nu, float32

    if variant in ("resident", "pinned_host_layers"):
        updater = rl_state.Updater(graphdef, tx, schedule, rl_loss.RLConfig(), mesh, offload=offload,
                                   grad_dtype=grad_dtype)
        step = lambda s: updater.apply(s, grads)[0]
    elif variant == "pinned_host_whole":
        dev = lambda tree: jax.tree.map(lambda s: s.with_memory_kind("device"), tree)
        state_sh = jax.tree.map(lambda x: x.sharding, state)

        def whole(s, g):
            master = jax.device_put(s["master"], dev(state_sh["master"]))
            opt = jax.device_put(s["opt_state"], dev(state_sh["opt_state"]))
            updates, opt = tx.update(jax.tree.map(lambda x: x.astype(jnp.float32), g), opt, master)
            master = optax.apply_updates(master, updates)
            return {"params": jax.tree.map(lambda x: x.astype(jnp.bfloat16), master), "master": master,
                    "opt_state": opt, "updates": s["updates"] + 1}

        jitted = jax.jit(whole, donate_argnums=(0,), out_shardings=state_sh)
        step = lambda s: jitted(s, grads)
    elif variant == "host_compute":
        from jax.experimental import compute_on as compute_on_lib

        state_sh = jax.tree.map(lambda x: x.sharding, state)
        host_sh = lambda tree: jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), tree)
        host_space = jax.memory.Space.Host
        b1, b2, eps, wd = optim.b1, optim.b2, optim.eps, optim.weight_decay

        # AdamW written out: optax's clip and norm create device-space constants that jax refuses to mix with
        # host-space operands inside compute_on; the scalars (clip factor, bias corrections, lr) come from the GPU.
        def host_update(master, mu, nu, g, scalars):
            factor, c1, c2, lr = scalars

            def leaf(p, m, v, gr):
                gr = gr.astype(jnp.float32) * factor
                m = b1 * m + (1 - b1) * gr
                v = b2 * v + (1 - b2) * gr * gr
                p = p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + wd * p)
                return p, m, v, p.astype(jnp.bfloat16)

            out = jax.tree.map(leaf, master, mu, nu, g)
            is_tuple = lambda x: isinstance(x, tuple)
            return tuple(jax.tree.map(lambda t: t[i], out, is_leaf=is_tuple) for i in range(4))

        def run_on_host(*xs):
            spaces = jax.tree.map(lambda _: host_space, (xs[0], xs[0], xs[0], xs[0]))
            try:        # jax 0.10: a context manager; later jax: a function transformation that names the outputs'
                #         memory spaces (compute_on(f, compute_type=, out_memory_spaces=))
                with compute_on_lib.compute_on("device_host"):
                    return host_update(*xs)
            except TypeError:
                return compute_on_lib.compute_on(host_update, compute_type="device_host",
                                                 out_memory_spaces=spaces)(*xs)

        def on_host(s, g):
            norm = optax.tree.norm(jax.tree.map(lambda x: x.astype(jnp.float32), g))
            factor = jnp.minimum(1.0, optim.grad_clip_norm / norm)
            count = optax.tree_utils.tree_get_all_with_path(s["opt_state"], "count")[0][1] + 1
            scalars = (factor, 1 - b1 ** count, 1 - b2 ** count, schedule(count - 1))
            scalars = jax.device_put(scalars, jax.tree.map(lambda _: host_sh(state_sh["updates"]), scalars))
            g = jax.device_put(g, host_sh(state_sh["params"]))
            mu = optax.tree_utils.tree_get(s["opt_state"], "mu")
            nu = optax.tree_utils.tree_get(s["opt_state"], "nu")
            master, mu, nu, params = run_on_host(s["master"], mu, nu, g, scalars)
            opt = optax.tree_utils.tree_set(s["opt_state"], mu=mu, nu=nu, count=count)
            return {"params": jax.device_put(params, state_sh["params"]), "master": master, "opt_state": opt,
                    "updates": s["updates"] + 1}

        jitted = jax.jit(on_host, donate_argnums=(0,), out_shardings=state_sh)
        step = lambda s: jitted(s, grads)
    elif variant == "host_backend":
        cpu = jax.devices("cpu")[0]
        device_sh = jax.tree.map(lambda x: x.sharding, state["params"])
        def to_cpu(x):          # leaf by leaf, through numpy: one leaf's extra copy in host RAM at a time
            y = jax.device_put(np.asarray(x), cpu)
            x.delete()
            return y

        host = {"master": jax.tree.map(to_cpu, state["master"]), "opt_state": jax.tree.map(to_cpu, state["opt_state"])}
        del state
        inner = optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm),
                            optax.adamw(schedule, weight_decay=optim.weight_decay))

        def cpu_update(h, g):
            updates, opt = inner.update(jax.tree.map(lambda x: x.astype(jnp.float32), g), h["opt_state"],
                                        h["master"])
            master = optax.apply_updates(h["master"], updates)
            return {"master": master, "opt_state": opt}, jax.tree.map(lambda x: x.astype(jnp.bfloat16), master)

        jitted = jax.jit(cpu_update, donate_argnums=(0,))

        def step(h):
            g = jax.device_put(grads, cpu)
            h, params = jitted(h, g)
            params = jax.device_put(params, device_sh)
            jax.block_until_ready(params)
            return h
        state = host
    else:
        raise ValueError(variant)

    times = []
    try:
        for rep in range(args.reps + 1):
            t = time.perf_counter()
            state = step(state)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t)
    except Exception as e:          # unsupported by this backend / out of memory: the table says which
        out["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return out
    ms = 1000 * statistics.median(times[1:])
    out.update({"status": "ok", "first_s": round(times[0], 2), "ms": round(ms, 1), "all_ms": [round(1000 * t, 1)
                                                                                               for t in times[1:]],
                "state_gbps": round(2 * moved / (ms / 1000) / GB, 1)})
    if variant in ("host_compute", "host_backend"):
        per_update = ms / 1000 * QWQ_PARAMS / total
    else:
        per_update = ms / 1000 * (QWQ_PARAMS / 4) / per_gpu
    out["projected_32b_x4_s"] = round(per_update, 2)
    out["projected_step_s"] = round(2 * per_update, 2)
    peak = (devices[0].memory_stats() or {}).get("peak_bytes_in_use")
    out["peak_gb"] = round(peak / GB, 1) if peak else None
    return out


# ---------------------------------------------------------------------------------------------- driver
def table(results: list[dict]) -> str:
    lines = ["| variant | GPUs | params/GPU (G) | layers | state built: s (host GB/s) | ms/update | state GB/s | "
             "peak GB (GPU 0) | QwQ-32B on 4 GPUs: s/update | s/RL step (2 updates) | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        get = lambda k: r.get(k, "-") if r.get(k) is not None else "-"
        built = "-"
        if r.get("init_s") is not None:
            rate = r.get("host_state_bytes", 0) / r["init_s"] / GB if r["init_s"] and r.get("host_state_bytes") else 0
            built = f"{r['init_s']} ({rate:.1f})" if rate else f"{r['init_s']}"
        lines.append(f"| {r['variant']} | {get('gpus')} | {r.get('params_per_gpu', 0) / 1e9:.2f} | {get('layers')} | "
                     f"{built} | {get('ms')} | {get('state_gbps')} | {get('peak_gb')} | {get('projected_32b_x4_s')} | "
                     f"{get('projected_step_s')} | {r.get('status', '-')[:90]} |")
    return "\n".join(lines)


def main(argv=None):
    from kevin_jax.model.shapes import named_config   # no jax
    from kevin_jax.placement import host_pool_gib
    args = parse_args(argv)
    if args.worker is not None:
        variant, size = args.worker.split(":")
        worker_process.report(run_one(variant, float(size), args))
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    sizes = [float(x) for x in args.params_per_gpu.split(",")]
    start, results = time.time(), []
    passthrough = [a for a in (argv or sys.argv[1:])]
    for size in sizes:
        for variant in variants:
            if time.time() - start > args.budget_s:
                results.append({"variant": variant, "params_per_gpu": size * 1e9, "status": "skipped: budget"})
                continue
            t = time.time()
            # XLA's pinned-host pool per GPU holds the GPU's share of the state, as the trainer caps it
            # (kevin_jax.placement); its default (64 GiB) holds less than 8.2G parameters' 98 GB
            arch = dataclasses.replace(named_config(args.model), num_hidden_layers=_layers_for(args.model, size, 1))
            env = dict(os.environ, XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB=str(host_pool_gib(arch, 1)))
            r = worker_process.run_case(__file__, f"{variant}:{size}", passthrough, args.timeout, env=env)
            if "error" in r:
                why = r["error"] if r["error"].startswith("timed out") else f"crashed ({r['error'][:200]})"
                r = {"variant": variant, "params_per_gpu": size * 1e9, "status": why}
            results.append(r)
            r = results[-1]
            print(f"[{variant} {size}G/GPU] {time.time() - t:.0f}s: {r.get('ms', '-')} ms, {r.get('status')}",
                  flush=True)
    print()
    print(f"grad_dtype={args.grad_dtype} reps={args.reps}")
    print(table(results))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
