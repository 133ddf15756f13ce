"""Ahead-of-time memory plan of a full fine-tune train step, from shapes alone (nothing is allocated).

    python benchmarks/aot_memory.py                                   # qwq_32b on 8/16/32 fake CPU devices
    python benchmarks/aot_memory.py --platform gpu_deviceless --out $OUT/aot_gpu.json   # on a GPU box: XLA:GPU
    PYTHONPATH=/tmp/jax_cuda JAX_PLATFORMS=cpu python benchmarks/aot_memory.py --platform gpu_deviceless \
        --gpu-target h200                                             # XLA:GPU for H200s, from a CPU-only box

The train step is what RL training runs: forward through the scanned decoder, the chunked log-prob loss (a
policy-gradient-shaped objective, sum of advantage * log-prob over response tokens), backward, and an optax AdamW
update, jitted with NamedShardings over a (data=1, fsdp=N/tensor, tensor) mesh and parameters/optimizer state donated.
Inputs are jax.ShapeDtypeStructs; `jit(...).lower(...).compile().memory_analysis()` reports XLA's per-device buffer
assignment, printed next to an analytic budget (params, grads, AdamW moments, activations at --seq-len tokens per
sequence and --per-device-batch sequences per device under the chosen remat).

Platforms:
  cpu             N fake host devices (--xla_force_host_platform_device_count). XLA:CPU's buffer assignment
                  approximates XLA:GPU's (it upcasts bf16 activations to f32: an upper bound); attention must be
                  "chunked" (pure-JAX blockwise), whose score blocks are larger than cuDNN flash attention's tiles.
  gpu_deviceless  the real XLA:GPU compiler for a topology of N GPUs that need not exist
                  (jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=..., topology=
                  "1 x hosts x 8")), with cuDNN flash attention. The target is the local GPU when there is one
                  (--gpu-target local), or a GpuTargetConfigProto text file (--gpu-target h200 / h100_sxm picks
                  benchmarks/gpu_targets/*.txtpb, or a path). Needs the jax CUDA plugin importable; on a CPU-only box
                  install it apart and put it on PYTHONPATH, e.g.
                    pip install --no-deps --target /tmp/jax_cuda jax-cuda13-plugin==$V jax-cuda13-pjrt==$V
                  with V = the installed jaxlib version, then PYTHONPATH=/tmp/jax_cuda JAX_PLATFORMS=cpu python ...
  gpu_mock        on a machine with >= 1 GPU: jax's jax_mock_gpu_topology flag ("1xNx1": N mock hosts, one GPU
                  each, mock NCCL) makes the GPU client show N devices, the one real GPU standing in for all; XLA:GPU
                  compiles with autotuning on the real device. (jax_mock_gpu_topology is a jax *flag*: it is read
                  from jax.config.update or absl flags only; the environment variable JAX_MOCK_GPU_TOPOLOGY is
                  ignored, which is why the first H200 run saw 1 device.)
Each device count runs in its own process.

Programs (--program):
  fused    one jit of forward + backward + AdamW (the plan of a full fine-tune, parameters and state on the GPUs).
  trainer  the two programs the RL trainer runs (kevin_jax.rl.state.Updater): the micro-batch gradient step
           (weights, the gradient sum over micro-batches, one micro-batch of --per-device-batch rows of --seq-len
           tokens per data-parallel device) and the optimiser step, with the optimiser state on the GPUs
           (--offload none) or in host memory (--offload pinned_host: bf16 weights on the GPUs, float32 master and
           AdamW moments in host RAM, kevin_jax.rl.offload), gradients summed in --grad-dtype. Reported per GPU: the
           peak of each program, host RAM of the offloaded state (per node), and what the GPU has left for the
           sampler's KV cache (the JAX pool, --jax-fraction of HBM, minus the weights) and for cuda_eval (the rest).
           Deviceless XLA:GPU has no host memory space: it compiles the offloaded step as if the state were on the
           GPU, so its host-resident bytes are subtracted from that step's peak (exact: they are the step's
           arguments and aliased outputs); what remains is the weights, the gradients and the per-layer buffers.
  python benchmarks/aot_memory.py --program trainer --offload pinned_host --grad-dtype bfloat16 --devices 4 \
      --platform gpu_deviceless --gpu-target h100_sxm --seq-len 32768
AOT_EXTRA_XLA_FLAGS (env) is appended to the workers' XLA_FLAGS, e.g. "--xla_dump_to=/tmp/dump" to read XLA's
buffer assignment (*memory-usage-report.txt) and see which buffers make up the peak.
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
HBM = {"H100 80GB": 80 * GB, "H200 141GB": 141 * GB}
HEADROOM = 0.90       # fits = peak <= 90% of HBM (cuDNN workspace, NCCL buffers, fragmentation)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwq_32b")
    p.add_argument("--devices", default="8,16,32", help="comma-separated device counts")
    p.add_argument("--platform", choices=("cpu", "gpu_deviceless", "gpu_mock"), default="cpu")
    p.add_argument("--gpu-target", default="local",
                   help="gpu_deviceless target: 'local' (the GPU of this machine), h200, h100_sxm, or a .txtpb path")
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--per-device-batch", type=int, default=1, help="sequences per data-parallel device")
    p.add_argument("--tensor", type=int, default=1, help="tensor-parallel size (the rest of the devices is fsdp)")
    p.add_argument("--remat", default="full")
    p.add_argument("--param-dtype", default="float32")
    p.add_argument("--attention", default=None, help="default: chunked on cpu, cudnn on the gpu platforms")
    p.add_argument("--attention-chunk", type=int, default=256)
    p.add_argument("--logprob-chunk", type=int, default=1024)
    p.add_argument("--timeout", type=int, default=900, help="seconds per device count")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--program", choices=("fused", "trainer"), default="fused")
    p.add_argument("--offload", choices=("none", "pinned_host"), default="none", help="trainer program only")
    p.add_argument("--grad-dtype", choices=("float32", "bfloat16"), default="float32", help="trainer program only")
    p.add_argument("--jax-fraction", type=float, default=0.85,
                   help="the JAX pool's share of HBM (gpu.jax_memory_fraction): the rest is cuda_eval's")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------- analytic budget
def analytic_budget(config, n_devices: int, args) -> dict[str, float]:
    """Per-device bytes. Params/grads/moments are fully sharded (fsdp x tensor = all devices)."""
    n_params = config.param_count()
    p_bytes = 4 if args.param_dtype == "float32" else 2
    b, t, h = args.per_device_batch, args.seq_len, config.hidden_size
    layers, inter, vocab = config.num_hidden_layers, config.intermediate_size, config.vocab_size
    q_width, kv_width = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    act = 2  # bf16 activations
    out = {
        "params": n_params * p_bytes / n_devices,
        "grads": n_params * p_bytes / n_devices,
        "adam_moments": 2 * n_params * 4 / n_devices,
    }
    # Saved between layers under remat="full": each layer's input (the scan carry) for the backward pass.
    out["saved_layer_inputs"] = layers * b * t * h * act
    # Working set while one layer is recomputed and differentiated: x, normed x, q, k, v, attention out, gate,
    # up, silu*up (forward) and about as much again for their cotangents.
    per_token = 2 * h + q_width + 2 * kv_width + q_width + 3 * inter
    out["layer_working_set"] = 2 * b * t * per_token * act // max(1, args.tensor)
    # One log-prob chunk: fp32 logits, probabilities and their cotangent.
    out["logprob_chunk"] = 3 * b * min(args.logprob_chunk, t) * vocab * 4 // max(1, args.tensor)
    # FSDP: one layer's weights all-gathered in bf16, twice (current + prefetched next).
    out["gathered_layer_weights"] = 2 * config.layer_param_count() * 2 // max(1, args.tensor)
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------------------------- one device count
TARGETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")


def _target_config_text(name: str) -> str:
    path = name if os.path.exists(name) else os.path.join(TARGETS_DIR, f"{name}.txtpb")
    if not os.path.exists(path):
        known = sorted(f[:-6] for f in os.listdir(TARGETS_DIR) if f.endswith(".txtpb"))
        raise SystemExit(f"--gpu-target {name!r}: no such file, and not one of local, {', '.join(known)}")
    with open(path) as f:
        return f.read()


def _assume_cudnn_of_target(target_text: str) -> str:
    """jax's cuDNN attention asks the local cuDNN and GPU whether it may run; with no GPU here (compiling for a
    described one), answer with the target's cuDNN version and compute capability. Returns a note for the log."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_attention

    major = int(re.search(r"cuda_compute_capability \{\s*major: (\d+)", target_text).group(1))
    minor_match = re.search(r"cuda_compute_capability \{\s*major: \d+\s*minor: (\d+)", target_text)
    capability = (major, int(minor_match.group(1)) if minor_match else 0)
    dnn = re.search(r"dnn_version_info \{\s*major: (\d+)\s*minor: (\d+)\s*patch: (\d+)", target_text)
    version = int(dnn.group(1)) * 10000 + int(dnn.group(2)) * 100 + int(dnn.group(3)) if dnn else 91000
    as_tuple = lambda c: tuple(int(x) for x in c.split("."))
    cudnn_attention.check_cudnn_version = lambda: version
    cudnn_attention.check_compute_capability = lambda c: capability >= as_tuple(c)
    cudnn_attention.is_cuda_compute_capability_equal = lambda c: capability == as_tuple(c)
    return f"no local GPU: jax's cuDNN checks answered for the target (cuDNN {version}, sm_{major}{capability[1]})"


def _deviceless_gpu_devices(jax, n: int, target: str) -> tuple[list, str]:
    """N compile-only devices of an XLA:GPU topology (hosts of 8 GPUs when 8 divides N)."""
    from jax.experimental import topologies

    notes = []
    if target == "local":
        try:
            local = jax.devices("gpu")
        except RuntimeError as e:
            raise SystemExit(f"--gpu-target local needs a GPU here ({e}); name a target: --gpu-target h200") from e
        try:
            from jax._src.lib import xla_client
            target_text = xla_client.get_topology_for_devices(local[:1]).target_config
            notes.append(f"target: local {local[0].device_kind}")
        except Exception as e:  # private API: fall back to the bundled description of the same GPU
            kind = local[0].device_kind
            bundled = "h200" if "H200" in kind else "h100_sxm" if "H100" in kind else None
            if bundled is None:
                raise SystemExit(f"cannot read the local GPU's target description ({e}); pass --gpu-target") from e
            target_text = _target_config_text(bundled)
            notes.append(f"target: {bundled} (bundled; reading the local {kind}'s failed: {type(e).__name__})")
    else:
        target_text = _target_config_text(target)
        notes.append(f"target: {target}")
        if jax.default_backend() != "gpu":
            notes.append(_assume_cudnn_of_target(target_text))
    hosts, per_host = (n // 8, 8) if n % 8 == 0 else (1, n)
    try:
        topology = topologies.get_topology_desc(platform="cuda", topology=f"1x{hosts}x{per_host}",
                                                target_config=target_text)
    except Exception as e:
        raise SystemExit(
            f"cannot describe a CUDA topology ({type(e).__name__}: {str(e)[:300]}). gpu_deviceless needs the jax CUDA "
            f"plugin importable; on a CPU-only box: pip install --no-deps --target DIR jax-cuda13-plugin=="
            f"{jax.__version__} jax-cuda13-pjrt=={jax.__version__}; PYTHONPATH=DIR JAX_PLATFORMS=cpu python ...") from e
    return list(topology.devices), "; ".join(notes)


def trainer_programs(jax, mesh, graphdef, abstract_params, param_shardings, model_config, options, args) -> dict:
    """Memory of the trainer's gradient step and optimiser step (kevin_jax.rl.state.Updater), per device."""
    import jax.numpy as jnp
    import optax

    from kevin_jax.rl import batch as rl_batch
    from kevin_jax.rl import loss as rl_loss
    from kevin_jax.rl import offload as offload_lib
    from kevin_jax.rl import state as rl_state

    optim = rl_state.OptimConfig(offload=args.offload, grad_dtype=args.grad_dtype)
    tx = rl_state.make_optimizer(optim, 100)
    host = rl_state.host_offload(optim, 100, options.compute_dtype)
    rl = rl_loss.RLConfig(pack=False, logprob_chunk=args.logprob_chunk)
    grad_dtype = rl_state.GRAD_DTYPES[args.grad_dtype]
    updater = rl_state.Updater(graphdef, tx, rl_state.learning_rate_schedule(optim, 100), rl, mesh, 0.9,
                               offload=host, grad_dtype=grad_dtype)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    master = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=s), abstract_params,
                          param_shardings)
    if host is not None:
        state = offload_lib.abstract_state(master, tx, options.compute_dtype, replicated)
    else:
        opt = jax.eval_shape(tx.init, master)
        opt_shardings = optax.tree_utils.tree_map_params(tx, lambda _, s: s, opt, param_shardings,
                                                         transform_non_params=lambda _: replicated)
        state = {"params": master,
                 "opt_state": jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), opt,
                                           opt_shardings),
                 "updates": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
    grads = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, grad_dtype, sharding=a.sharding), master)
    rows = args.per_device_batch * mesh.shape["data"] * mesh.shape["fsdp"]
    batch = {k: jax.ShapeDtypeStruct((rows, args.seq_len), v.dtype, sharding=updater.batch_sharding)
             for k, v in rl_batch._empty(1, 1).items()}

    def memory(compiled):
        ma = compiled.memory_analysis()
        out = {k: int(getattr(ma, k, 0) or 0) for k in (
            "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
            "host_argument_size_in_bytes", "host_temp_size_in_bytes")}
        out["peak_estimate_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                                      - out["alias_size_in_bytes"] + out["temp_size_in_bytes"])
        return out

    n = mesh.devices.size
    t0 = time.time()
    grad_step = memory(updater._grads.lower(state["params"], grads, batch, first=True).compile())
    t1 = time.time()
    shardings = jax.tree.map(lambda x: x.sharding, state)
    updater._state_shardings = shardings
    apply = jax.jit(updater._apply_impl, donate_argnums=(0,), out_shardings=(shardings, None))
    opt_step = memory(apply.lower(state, grads, None).compile())
    t2 = time.time()
    # what kevin_jax.rl.offload keeps in host memory (by structure: deviceless devices drop memory kinds)
    nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
    host_bytes = 0 if host is None else (nbytes(state["master"]) + nbytes(optax.tree_utils.tree_get(
        state["opt_state"], "mu")) + nbytes(optax.tree_utils.tree_get(state["opt_state"], "nu")))
    device_weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state["params"])) / n
    # deviceless: the host state counted as device arguments (subtract it); on a real GPU (gpu_mock) XLA reports
    # host memory apart
    host_apart = opt_step["host_argument_size_in_bytes"] > 0
    opt_step["device_peak_bytes"] = opt_step["peak_estimate_bytes"] - (0 if host_apart else host_bytes / n)
    # The gradient step runs with the rest of the train state resident on the device (the moments, when they are
    # not offloaded): not its arguments, but in the same memory.
    resident = (sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) - host_bytes) / n - device_weights
    grad_step["device_peak_bytes"] = grad_step["peak_estimate_bytes"] + resident
    peak = max(grad_step["device_peak_bytes"], opt_step["device_peak_bytes"])
    return {"grad_step": grad_step, "opt_step": opt_step, "host_state_bytes_per_node": host_bytes,
            "device_weight_bytes": device_weights, "device_state_bytes": device_weights + resident,
            "peak_bytes": peak,
            "grad_compile_s": round(t1 - t0, 1), "opt_compile_s": round(t2 - t1, 1)}


def worker(args) -> dict:
    n = args.worker
    extra = os.environ.get("AOT_EXTRA_XLA_FLAGS", "")      # e.g. --xla_dump_to=DIR to read buffer assignment
    if args.platform == "cpu":
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n} {extra}".strip()
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {extra}".strip()
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        if args.platform == "gpu_mock":
            os.environ.setdefault("JAX_PLATFORMS", "cuda")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from kevin_jax import parallel
    from kevin_jax.model import qwen2
    from kevin_jax.model.shapes import named_config

    note = ""
    if args.platform == "gpu_mock":
        # Flags, not environment variables: they must be set through jax.config before the GPU client starts.
        jax.config.update("jax_mock_gpu_topology", f"1x{n}x1")
        jax.config.update("jax_cuda_visible_devices", "0")
        devices = jax.devices()
        note = f"mock topology 1x{n}x1 on {devices[0].device_kind}"
    elif args.platform == "gpu_deviceless":
        devices, note = _deviceless_gpu_devices(jax, n, args.gpu_target)
    else:
        devices = jax.devices()
    if len(devices) != n:
        raise RuntimeError(f"asked for {n} devices, JAX sees {len(devices)} ({devices[:2]}...)")
    attention = args.attention or ("chunked" if args.platform == "cpu" else "cudnn")
    config = named_config(args.model)
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype=args.param_dtype, remat=args.remat,
                                 attention=attention, attention_chunk=args.attention_chunk)
    parallel_config = parallel.ParallelConfig(data=1, fsdp=-1, tensor=args.tensor)
    if args.platform != "cpu":   # mock / described devices: no real topology to optimise the device order for
        shape = parallel.mesh_shape(parallel_config, n)
        mesh = jax.sharding.Mesh(np.asarray(devices).reshape(shape), parallel.MESH_AXES,
                                 axis_types=(jax.sharding.AxisType.Auto,) * len(parallel.MESH_AXES))
    else:
        mesh = parallel.make_mesh(parallel_config)
    graphdef, abstract_params = nnx.split(qwen2.abstract_model(config, options))
    param_shardings = qwen2.param_shardings(abstract_params, mesh)
    params_in = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                             abstract_params, param_shardings)
    optimizer = optax.adamw(1e-6, b1=0.9, b2=0.999, weight_decay=0.01)
    opt_abstract = jax.eval_shape(optimizer.init, params_in)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    # AdamW moments are shaped like the params and sharded like them; the step count is replicated.
    opt_shardings = optax.tree_map_params(optimizer, lambda _, s: s, opt_abstract, param_shardings,
                                          transform_non_params=lambda _: replicated)
    opt_in = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), opt_abstract,
                          opt_shardings)

    if args.program == "trainer":
        t0 = time.time()
        result = trainer_programs(jax, mesh, graphdef, abstract_params, param_shardings, config, options, args)
        return {"devices": n, "mesh": parallel.describe(mesh), "platform": args.platform,
                "backend": jax.default_backend(), "device_kind": devices[0].device_kind, "note": note,
                "jax": jax.__version__, "model": args.model, "program": "trainer", "offload": args.offload,
                "grad_dtype": args.grad_dtype, "remat": args.remat, "seq_len": args.seq_len,
                "per_device_batch": args.per_device_batch, "compile_s": round(time.time() - t0, 1),
                "trainer": result}
    batch_size = args.per_device_batch * mesh.shape["data"] * mesh.shape["fsdp"]
    row = parallel.batch_sharding(mesh, 2)
    vec = parallel.batch_sharding(mesh, 1)
    shape2 = (batch_size, args.seq_len)
    batch_in = {
        "tokens": jax.ShapeDtypeStruct(shape2, jnp.int32, sharding=row),
        "segment_ids": jax.ShapeDtypeStruct(shape2, jnp.int32, sharding=row),
        "targets": jax.ShapeDtypeStruct(shape2, jnp.int32, sharding=row),
        "loss_mask": jax.ShapeDtypeStruct(shape2, jnp.float32, sharding=row),
        "advantages": jax.ShapeDtypeStruct((batch_size,), jnp.float32, sharding=vec),
    }

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            model = nnx.merge(graphdef, p)
            logprobs = model.token_logprobs(batch["tokens"], None, batch["segment_ids"], batch["targets"],
                                            chunk_size=args.logprob_chunk, right_padded=True)
            weights = batch["loss_mask"] * batch["advantages"][:, None]
            return -jnp.sum(logprobs * weights) / jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(train_step, in_shardings=(param_shardings, opt_shardings, None),
                   out_shardings=(param_shardings, opt_shardings, None), donate_argnums=(0, 1))
    t0 = time.time()
    with parallel.activation_sharding(mesh):
        lowered = step.lower(params_in, opt_in, batch_in)
    t1 = time.time()
    compiled = lowered.compile()
    t2 = time.time()
    ma = compiled.memory_analysis()
    xla = {k: int(getattr(ma, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                            "alias_size_in_bytes", "temp_size_in_bytes",
                                            "generated_code_size_in_bytes") if hasattr(ma, k)}
    xla["peak_estimate_bytes"] = (xla["argument_size_in_bytes"] + xla["output_size_in_bytes"]
                                  - xla["alias_size_in_bytes"] + xla["temp_size_in_bytes"])
    return {"devices": n, "mesh": parallel.describe(mesh), "platform": args.platform,
            "backend": jax.default_backend(), "device_kind": devices[0].device_kind, "note": note,
            "jax": jax.__version__, "model": args.model, "attention": attention, "remat": args.remat,
            "param_dtype": args.param_dtype, "seq_len": args.seq_len, "per_device_batch": args.per_device_batch,
            "global_batch": batch_size, "lower_s": round(t1 - t0, 1), "compile_s": round(t2 - t1, 1),
            "xla": xla, "analytic": analytic_budget(config, n, args)}


# ---------------------------------------------------------------------------------------------- report
def fits(peak: float) -> str:
    return " ".join(f"{name.split()[0]}:{'yes' if peak <= HEADROOM * cap else 'NO'}" for name, cap in HBM.items())


def table(results: list[dict]) -> str:
    lines = ["| devices | mesh | XLA args GB | XLA temp GB | XLA peak GB | analytic GB (params+grads+adam / act) "
             "| fits (<=90% HBM) | compile s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['devices']} | - | - | - | - | - | error: {r['error'][:80]} | - |")
            continue
        x, a = r["xla"], r["analytic"]
        states = (a["params"] + a["grads"] + a["adam_moments"]) / GB
        acts = (a["total"] / GB) - states
        lines.append(f"| {r['devices']} | {r['mesh']} | {x['argument_size_in_bytes'] / GB:.1f} | "
                     f"{x['temp_size_in_bytes'] / GB:.1f} | {x['peak_estimate_bytes'] / GB:.1f} | "
                     f"{a['total'] / GB:.1f} ({states:.1f} / {acts:.1f}) | {fits(x['peak_estimate_bytes'])} | "
                     f"{r['compile_s']} |")
    return "\n".join(lines)


def trainer_table(results: list[dict], jax_fraction: float) -> str:
    lines = ["| devices | mesh | offload | grads | tokens/GPU | grad step peak GB | optimizer step peak GB | state on "
             "GPU GB | host RAM GB (node) | "
             + " | ".join(f"{name}: fits / KV room / cuda_eval GB" for name in HBM) + " |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(HBM)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['devices']} | - | - | - | - | error: {r['error'][:100]} |")
            continue
        t = r["trainer"]
        cells = []
        for cap in HBM.values():
            pool = jax_fraction * cap
            fits = "yes" if t["peak_bytes"] <= pool else "NO"
            # between updates the JAX pool holds the train state's device part; the KV cache may take the rest
            cells.append(f"{fits} / {(pool - t['device_state_bytes']) / GB:.0f} / {(cap - pool) / GB:.0f}")
        lines.append(f"| {r['devices']} | {r['mesh']} | {r['offload']} | {r['grad_dtype']} | "
                     f"{r['per_device_batch']} x {r['seq_len']} | {t['grad_step']['device_peak_bytes'] / GB:.1f} | "
                     f"{t['opt_step']['device_peak_bytes'] / GB:.1f} | {t['device_state_bytes'] / GB:.1f} | "
                     f"{t['host_state_bytes_per_node'] / GB:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.worker is not None:
        worker_process.report(worker(args))
        return
    results = []
    for n in [int(x) for x in args.devices.split(",")]:
        start = time.time()
        r = worker_process.run_case(__file__, str(n), argv or sys.argv[1:], args.timeout)
        results.append({"devices": n, **r} if "error" in r else r)
        r = results[-1]
        if "trainer" in r:
            status = f"peak {r['trainer']['peak_bytes'] / GB:.1f} GB"
        else:
            status = f"peak {r['xla']['peak_estimate_bytes'] / GB:.1f} GB" if "xla" in r else r["error"]
        print(f"[{n} devices] {time.time() - start:.0f}s {status}", flush=True)
    print()
    if args.program == "trainer":
        print(f"model={args.model} program=trainer offload={args.offload} grad_dtype={args.grad_dtype} "
              f"seq_len={args.seq_len} per_device_batch={args.per_device_batch} remat={args.remat} "
              f"platform={args.platform} target={args.gpu_target} jax_fraction={args.jax_fraction}")
        print(trainer_table(results, args.jax_fraction))
        for r in results:
            if "trainer" in r:
                t = r["trainer"]
                print(f"{r['devices']} devices: grad step {t['grad_step']}; optimizer step {t['opt_step']}; "
                      f"compile {t['grad_compile_s']} + {t['opt_compile_s']} s; {r.get('note')}")
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "results": results}, f, indent=2)
        return
    print(f"model={args.model} seq_len={args.seq_len} per_device_batch={args.per_device_batch} remat={args.remat} "
          f"param_dtype={args.param_dtype} platform={args.platform} tensor={args.tensor}")
    print(table(results))
    for r in results:
        if r.get("note") or r.get("device_kind"):
            print(f"{r['devices']} devices: {r.get('device_kind')} ({r.get('backend')} backend); {r.get('note')}")
    for r in results:
        if "analytic" in r:
            parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in r["analytic"].items())
            print(f"analytic per device, {r['devices']} devices (GB): {parts}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
