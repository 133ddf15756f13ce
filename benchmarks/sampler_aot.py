"""Deviceless XLA:GPU plan of the tensor-parallel sampler at a real shape: do its steps compile for a node, and what
does each GPU hold while sampling (shapes only: nothing is allocated, no GPU is needed).

    PYTHONPATH=/tmp/jax_cuda JAX_PLATFORMS=cpu python benchmarks/sampler_aot.py              # qwq_32b, 4 and 8 GPUs
    PYTHONPATH=/tmp/jax_cuda JAX_PLATFORMS=cpu python benchmarks/sampler_aot.py --nodes 4xh100_sxm --slots 64

(the jax CUDA plugin on PYTHONPATH, as for benchmarks/aot_memory.py: pip install --no-deps --target /tmp/jax_cuda
jax-cuda13-plugin==V jax-cuda13-pjrt==V, V = the installed jaxlib.) About 1-2 minutes per node on a 2-core box.

For each node (GPUs x target GPU): the parameters as the trainer holds them while it samples (bf16, FSDP over the
GPUs: the fp32 master weights and AdamW state are in host memory, gradients and activations freed), the KV pool sized
by the engine's own rule (kv_cache.plan_pool: --kv-cache-fraction of what JAX's cap, --memory-fraction of the card,
leaves after those parameters, the sampler's weight copy and its workspace), then SamplerEngine built on them exactly
as launch/train.py builds it, and XLA:GPU compiling for that topology:
  prepare   the weight copy into the sampling layout (FSDP -> tensor parallel, compute dtype): one layer's copy
            (run once per layer) and the rest (embedding, final norm, head)
  decode    one decode call: --decode-steps steps of --slots slots, Pallas paged attention
  prefill   one call's three functions at --prefill-tokens tokens (rows x --prefill-chunk): start, one layer, finish
and reports each one's per-GPU arguments, outputs and temporaries (compiled.memory_analysis()), the collectives in the
compiled decode (all-reduces per step), and the per-GPU peak while sampling = trainer parameters + weight copy + KV
pool + the largest temporary of the calls, against JAX's cap.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # sibling benchmark modules

import worker_process  # noqa: E402

GB = 1e9
# HBM of the targets (their device_memory_size).
HBM_BYTES = {"h100_sxm": 84_942_979_072, "h200": 151_397_597_184}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwq_32b")
    p.add_argument("--nodes", default="4xh100_sxm,8xh100_sxm,4xh200,8xh200",
                   help="GPUsxTARGET, comma-separated; TARGET is a benchmarks/gpu_targets/*.txtpb name")
    p.add_argument("--memory-fraction", type=float, default=0.85, help="gpu.jax_memory_fraction")
    p.add_argument("--kv-cache-fraction", type=float, default=0.9, help="sampler.kv_cache_fraction")
    p.add_argument("--slots", type=int, default=128, help="sampler.max_slots")
    p.add_argument("--max-seq-len", type=int, default=40960)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--prefill-tokens", type=int, default=8192)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--timeout", type=int, default=900, help="seconds per node")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _memory(compiled) -> dict:
    ma = compiled.memory_analysis()
    out = {k: int(getattr(ma, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                            "temp_size_in_bytes")}
    out["peak_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"] - out["alias_size_in_bytes"]
                         + out["temp_size_in_bytes"])
    return out


def worker(node: str, args) -> dict:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    import aot_memory
    from kevin_jax import parallel
    from kevin_jax.model import qwen2
    from kevin_jax.model.shapes import named_config
    from kevin_jax.sampler import SamplerConfig, SamplerEngine, kv_cache, layout, steps

    count, target = node.split("x", 1)
    n = int(count)
    devices, note = aot_memory._deviceless_gpu_devices(jax, n, target)
    auto = (jax.sharding.AxisType.Auto,) * len(parallel.MESH_AXES)
    trainer_mesh = jax.sharding.Mesh(np.asarray(devices).reshape(1, n, 1), parallel.MESH_AXES, axis_types=auto)
    config = named_config(args.model)
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="bfloat16", remat="none")
    graphdef, abstract = nnx.split(qwen2.abstract_model(config, options))
    shardings = qwen2.param_shardings(abstract, trainer_mesh)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    model = nnx.merge(graphdef, params)
    trainer_bytes = layout.bytes_per_device(params)

    # The pool by the engine's own rule, under this node's memory cap.
    tensor = layout.tensor_parallel_size(config, n)
    limit = int(args.memory_fraction * HBM_BYTES[target])
    copy_bytes = layout.copy_bytes_per_device(config, jnp.bfloat16, tensor)
    page_bytes = kv_cache.make_geometry(config, pages_per_layer=2, page_size=args.page_size,
                                        max_seq_len=args.max_seq_len).bytes_per_token(jnp.bfloat16) \
        * args.page_size // tensor
    workspace = kv_cache.workspace_bytes(config, prefill_tokens=args.prefill_tokens, slots=args.slots, tensor=tensor)
    record = {"node": node, "devices": n, "target": target, "note": note, "jax": jax.__version__,
              "tensor": tensor, "limit_bytes": limit, "trainer_params_bytes": trainer_bytes,
              "copy_bytes_analytic": copy_bytes, "workspace_bytes": workspace}
    try:
        plan = kv_cache.plan_pool(worst_case_tokens=args.slots * args.max_seq_len, page_size=args.page_size,
                                  page_bytes_per_device=page_bytes, fraction=args.kv_cache_fraction, limit_bytes=limit,
                                  in_use_bytes=trainer_bytes, weight_copy_bytes=copy_bytes, workspace=workspace)
    except ValueError as e:
        record["error"] = f"does not fit: {e}"
        return record
    record.update(pool_pages=plan.pages_per_layer, pool_bytes=plan.bytes_per_device, pool_tokens=plan.tokens,
                  pool_rule=plan.rule)

    sampler_config = SamplerConfig(temperature=0.9, max_slots=args.slots, max_seq_len=args.max_seq_len,
                                   page_size=args.page_size, num_pages=plan.pages_per_layer,
                                   decode_steps=args.decode_steps, prefill_tokens=args.prefill_tokens,
                                   prefill_chunk=args.prefill_chunk, attention="pallas", stop_ids=(151645,))
    engine = SamplerEngine(model, sampler_config, mesh=trainer_mesh)
    functions, mesh = engine.functions, engine.mesh
    record["sampling_mesh"] = parallel.describe(mesh) if mesh is not None else "one device"
    record["pool_line"] = plan.describe(args.slots, args.max_seq_len, layout.describe(mesh))
    replicated = NamedSharding(mesh, PartitionSpec()) if mesh is not None else None
    sds = lambda shape, dtype, sharding=replicated: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)  # noqa
    timings = {}

    def compile_(name, jitted, *inputs):
        t0 = time.time()
        lowered = jitted.lower(*inputs)
        t1 = time.time()
        compiled = lowered.compile()
        timings[name] = {"lower_s": round(t1 - t0, 1), "compile_s": round(time.time() - t1, 1)}
        record[name] = {**_memory(compiled), **timings[name]}
        print(f"[{node}] {name}: compiled in {timings[name]['compile_s']}s, temp "
              f"{record[name]['temp_size_in_bytes'] / GB:.2f} GB", flush=True)
        return compiled

    jits = functions.prepare_jits(params)
    compile_("prepare_layer", jits["layer"], functions.stacked_layers(params), sds((), jnp.int32))
    compile_("prepare_rest", jits["rest"], params)
    abstract_weights = jax.eval_shape(functions.prepare, params)
    weights = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_weights,
                           functions.weight_shardings)
    record["copy_bytes"] = layout.bytes_per_device(weights)
    pool_sharding = layout.sharding_of_pool(mesh, engine.tensor_axis)
    pool = kv_cache.KVPool(*[sds(kv_cache.pool_shape(engine.geometry), jnp.bfloat16, pool_sharding)] * 2)
    slots, width = args.slots, engine.geometry.table_width
    ints = lambda *shape: sds(shape, jnp.int32)                                      # noqa: E731
    flags = lambda *shape: sds(shape, jnp.bool_)                                     # noqa: E731
    state = steps.SlotState(ints(slots), ints(slots), ints(slots), ints(slots), flags(slots), ints(slots),
                            ints(slots, width), ints(slots, engine.recent_width))
    decode = compile_("decode", functions.decode, weights, pool, state, sds((), jnp.uint32), sds((), jnp.int32))
    text = decode.as_text()
    record["decode_all_reduces_per_step"] = len(re.findall(r"all-reduce-start\(|all-reduce\(", text))
    record["decode_all_gathers"] = len(re.findall(r"all-gather-start\(|all-gather\(", text))
    record["decode_all_to_all"] = len(re.findall(r"all-to-all\(", text))

    rows, chunk = max(1, args.prefill_tokens // args.prefill_chunk), args.prefill_chunk
    batch = steps.PrefillBatch(ints(rows, chunk), ints(rows, chunk), flags(rows, chunk), ints(rows, width),
                               ints(rows), ints(rows), flags(rows), ints(rows), ints(rows), ints(rows),
                               ints(rows, engine.recent_width))
    start = compile_("prefill_start", functions.prefill_start, weights.embed, batch)
    hidden, rope, ctx = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                     jax.eval_shape(functions.prefill_start, weights.embed, batch),
                                     tuple(start.output_shardings))
    layer = weights.layers if weights.stacked else weights.layers[0]
    compile_("prefill_layer", functions.prefill_layer, layer, hidden, rope, ctx, pool, sds((), jnp.int32))
    compile_("prefill_finish", functions.prefill_finish, weights.final_norm, weights.head_weight(), hidden, batch,
             sds((), jnp.uint32))

    temps = {name: record[name]["temp_size_in_bytes"] for name in timings}
    # While sampling: trainer parameters + the copy + the pool, and the largest temporary of whichever call runs
    # (prepare runs with the pool of the previous generate call still allocated, the copy being its output).
    record["peak_bytes"] = trainer_bytes + record["copy_bytes"] + plan.bytes_per_device + max(temps.values())
    record["fits"] = record["peak_bytes"] <= limit
    return record


def row(r: dict) -> str:
    if "error" in r and "pool_bytes" not in r:
        return f"| {r['node']} | {r.get('tensor', '-')} | {r['error'][:160]} |" + " |" * 9
    gb = lambda v: f"{v / GB:.1f}"                                                    # noqa: E731
    parts = ("decode", "prefill_layer", "prepare_layer")
    temps = " / ".join(f"{r[k]['temp_size_in_bytes'] / GB:.2f}" for k in parts)
    compile_s = " / ".join(f"{r[k]['compile_s']:.0f}" for k in parts)
    return (f"| {r['node']} | {r['sampling_mesh']} | {gb(r['limit_bytes'])} | {gb(r['trainer_params_bytes'])} | "
            f"{gb(r['copy_bytes'])} | {gb(r['pool_bytes'])} ({r['pool_tokens'] / 16384:.0f} x 16k) | {temps} | "
            f"{gb(r['peak_bytes'])} | {'yes' if r['fits'] else 'NO'} | {r['decode_all_reduces_per_step']} | "
            f"{compile_s} |")


def table(results: list[dict], args) -> str:
    lines = [f"model={args.model} slots={args.slots} max_seq_len={args.max_seq_len} decode_steps={args.decode_steps} "
             f"prefill {args.prefill_tokens} tokens (chunk {args.prefill_chunk}) jax_memory_fraction="
             f"{args.memory_fraction} kv_cache_fraction={args.kv_cache_fraction}; per-GPU GB", "",
             "| node | sampling mesh | JAX cap | trainer params (bf16, FSDP) | weight copy (TP) | KV pool | temp GB: "
             "decode / prefill layer / copy layer | peak | fits | all-reduces per decode step | compile s: decode / "
             "prefill layer / copy layer |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row(r) for r in results]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.worker is not None:
        worker_process.report(worker(args.worker, args))
        return
    results = []
    for node in args.nodes.split(","):
        start = time.time()
        r = worker_process.run_case(__file__, node, argv or sys.argv[1:], args.timeout)
        results.append({"node": node, **r} if "error" in r else r)
        r = results[-1]
        print(f"[{node}] {time.time() - start:.0f}s " + (f"peak {r['peak_bytes'] / GB:.1f} GB" if "peak_bytes" in r
                                                          else r["error"][:300]), flush=True)
    print()
    print(table(results, args))
    for r in results:
        if "pool_line" in r:
            print(f"{r['node']}: {r['pool_line']}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
