"""Training throughput and MFU of the kevin_jax Qwen2 forward+backward on one GPU (several configurations per run).

    python benchmarks/mfu.py --out $OUT/mfu.json --profile-dir $OUT/mfu_profile   # qwen2.5_1.5b, seq 8192, on the GPU
    python benchmarks/mfu.py --model tiny --seq-len 256 --budget-s 60             # CPU smoke run (proves it works)

What is timed: jax.value_and_grad of the RL-shaped loss (sum of advantage-weighted per-token log-probs from
Qwen2ForCausalLM.token_logprobs, i.e. the chunked log-prob head, through the decoder) w.r.t. all parameters, jitted;
no optimizer update. Each configuration (remat policy, attention kernel, batch size, parameter dtype, scanned or
unrolled layers, log-prob chunk) is compiled, warmed up, then timed step by step.

The run is split into groups, each in its own process: group "default" tries the configurations with the default XLA
flags (in order, best guesses first), then each XLA-flag variant (XLA reads XLA_FLAGS once per process) re-runs the
first configuration. An out-of-memory or failing configuration is recorded and the next one runs; a process that
dies or overruns its share of --budget-s is recorded and the next group runs. With --profile-dir, the first
configuration that runs is also profiled for one step and the GPU time is broken down by HLO op (matmuls, cuDNN
attention, fusions, copies), which says where the time goes.

FLOPs per step, MaxText's way (recomputation from remat is NOT counted):
  6 * N * tokens            N = parameters that enter a matmul per token (all layer weights + the LM head)
  + 6 * L * B * T^2 * Hq * D   causal attention: QK^T and PV, forward (x1) + backward (x2), half the T x T grid
MFU = FLOPs per step / step time / peak (default 989 TFLOP/s: H100/H200 SXM dense bf16).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

# Tried in this order (best guesses first, so a budget cut keeps the informative ones). Keys left out take their
# defaults: scan_layers=True, logprob_chunk=--logprob-chunk.
DEFAULT_CONFIGS = [
    # Every matmul output + the cuDNN attention residuals saved: backward recomputes elementwise ops only.
    dict(remat="dots_attn", batch=4, attention="cudnn", param_dtype="bfloat16"),
    # Same, layers unrolled: no zero-filled [L, ...] residual stacks and copies into them (slower compile).
    dict(remat="dots_attn", batch=4, attention="cudnn", param_dtype="bfloat16", scan_layers=False),
    # The first run's best (43.1%) with the new log-prob head: the A/B of saving the attention residuals.
    dict(remat="dots_no_batch", batch=4, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="none", batch=2, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="dots_attn", batch=4, attention="cudnn", param_dtype="bfloat16", logprob_chunk=4096),
    dict(remat="qkv_attn", batch=4, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="dots_attn", batch=4, attention="cudnn", param_dtype="float32"),
    dict(remat="full", batch=8, attention="cudnn", param_dtype="bfloat16"),
]
# XLA flags worth trying on the GPU (each re-runs DEFAULT_CONFIGS[0] in its own process). NVIDIA's JAX-Toolbox and
# MaxText's GPU recipes turn Triton GEMMs off (cuBLAS only) and command buffers (CUDA graphs) off. (They also turn the
# latency hiding scheduler on, which matters for overlapping collectives: none on one GPU, so not tried here.)
DEFAULT_XLA_VARIANTS = [
    "--xla_gpu_enable_triton_gemm=false",
    "--xla_gpu_enable_command_buffer=",
]
CPU_CONFIGS = [
    dict(remat="none", batch=2, attention="xla", param_dtype="float32"),
    dict(remat="full", batch=2, attention="chunked", param_dtype="bfloat16"),
    dict(remat="dots_attn", batch=2, attention="xla", param_dtype="bfloat16", scan_layers=False),
]
CONFIG_KEYS = ("remat", "batch", "attention", "param_dtype", "scan_layers", "logprob_chunk")
RESULT_TAG = "MFU_RESULT "
HEADER_TAG = "MFU_HEADER "
PROFILE_TAG = "MFU_PROFILE "


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5_1.5b")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation")
    p.add_argument("--logprob-chunk", type=int, default=2048)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--budget-s", type=float, default=220.0,
                   help="wall-clock budget of the whole run: no configuration starts after it, a group process "
                        "that overruns its share is stopped")
    p.add_argument("--configs", default=None, help="JSON list of dicts with keys " + ", ".join(CONFIG_KEYS))
    p.add_argument("--xla-flags", default=None, help="extra XLA_FLAGS for the default group")
    p.add_argument("--xla-variants", default=None,
                   help="JSON list of XLA_FLAGS strings, each re-running the first configuration in its own process "
                        "(default: a few GPU flags on the GPU, none on CPU; '[]' for none)")
    p.add_argument("--profile-dir", default=None, help="profile one step of the first configuration that runs here")
    p.add_argument("--out", default=None, help="JSON results (rewritten after every group)")
    p.add_argument("--group", default=None, help=argparse.SUPPRESS)      # set in the group processes
    return p.parse_args(argv)


def step_flops(config, batch: int, seq_len: int) -> float:
    tokens = batch * seq_len
    dense = 6.0 * config.matmul_param_count() * tokens
    attention = 6.0 * config.num_hidden_layers * batch * seq_len ** 2 * config.num_attention_heads * config.head_dim
    return dense + attention


# ---------------------------------------------------------------------------------------------- group process
def matmul_ceiling(jax, jnp) -> float:
    """Achieved bf16 TFLOP/s of a large square matmul (context for the MFU numbers)."""
    n = 8192
    a = jnp.ones((n, n), jnp.bfloat16)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        out = f(a, a)
    out.block_until_ready()
    return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e12


def run_config(jax, jnp, nnx, qwen2, config, cfg: dict, args, log, profile_dir=None) -> tuple[dict, dict | None]:
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype=cfg["param_dtype"], remat=cfg["remat"],
                                 attention=cfg["attention"], scan_layers=cfg["scan_layers"])
    batch, seq, chunk = cfg["batch"], args.seq_len, cfg["logprob_chunk"]
    graphdef, _ = nnx.split(qwen2.abstract_model(config, options))

    @jax.jit
    def create():
        return nnx.state(qwen2.Qwen2ForCausalLM(config, options, rngs=nnx.Rngs(0)))

    params = create()
    rng = jax.random.PRNGKey(1)
    tokens = jax.random.randint(rng, (batch, seq), 0, config.vocab_size, jnp.int32)
    segments = jnp.ones((batch, seq), jnp.int32)
    targets = jnp.roll(tokens, -1, axis=1)
    advantages = jnp.linspace(-1.0, 1.0, batch, dtype=jnp.float32)

    def loss_fn(p, tokens, segments, targets, advantages):
        model = nnx.merge(graphdef, p)
        logprobs = model.token_logprobs(tokens, None, segments, targets, chunk_size=chunk, right_padded=True)
        return -jnp.sum(logprobs * advantages[:, None]) / (batch * seq)

    step = jax.jit(jax.value_and_grad(loss_fn))
    t0 = time.perf_counter()
    compiled = step.lower(params, tokens, segments, targets, advantages).compile()
    compile_s = time.perf_counter() - t0
    memory = None
    try:
        ma = compiled.memory_analysis()
        memory = (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
                  + ma.temp_size_in_bytes) / 1e9
    except Exception:  # memory_analysis is best-effort information
        pass
    for _ in range(args.warmup):
        loss, grads = compiled(params, tokens, segments, targets, advantages)
        jax.block_until_ready((loss, grads))
    if not bool(jnp.isfinite(loss)):
        raise FloatingPointError(f"loss is {float(loss)}")
    flops = step_flops(config, batch, seq)
    times = []
    for i in range(args.steps):
        start = time.perf_counter()
        loss, grads = compiled(params, tokens, segments, targets, advantages)
        jax.block_until_ready((loss, grads))
        times.append(time.perf_counter() - start)
        log(f"    step {i}: {times[-1] * 1e3:8.1f} ms  {batch * seq / times[-1]:10.0f} tok/s  "
            f"MFU {flops / times[-1] / (args.peak_tflops * 1e12) * 100:5.1f}%")
    median = sorted(times)[len(times) // 2]
    profile = None
    if profile_dir:
        try:
            profile = profile_one_step(jax, compiled, (params, tokens, segments, targets, advantages), profile_dir,
                                       log)
        except Exception as e:  # the profile is extra information; the timing above stands
            log(f"  profile failed: {type(e).__name__}: {e}")
    del grads, params
    result = {**cfg, "compile_s": round(compile_s, 1), "step_ms": round(median * 1e3, 2),
              "step_ms_all": [round(t * 1e3, 2) for t in times], "tokens_per_s": round(batch * seq / median),
              "tflops": round(flops / median / 1e12, 1), "mfu": round(flops / median / (args.peak_tflops * 1e12), 4),
              "xla_peak_gb": None if memory is None else round(memory, 1), "loss": float(loss)}
    return result, profile


# ---------------------------------------------------------------------------------------------- profile summary
def _hlo_categories(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> category, from the optimized module text."""
    gemm_computations = set()
    current = None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
        if head and not line.startswith(" "):
            current = head.group(1)
        elif current and re.search(r"= [^=]*\bdot\(", line):
            gemm_computations.add(current)
    categories = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = .*? ([\w\-]+)\(", line)
        if not m:
            continue
        name, op = m.groups()
        if op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', line)
            target = target.group(1) if target else ""
            if "fmha" in target.lower():
                categories[name] = "attention bwd (cuDNN)" if "Backward" in target else "attention fwd (cuDNN)"
            elif "gemm" in target.lower() or "cublas" in target.lower():
                categories[name] = "matmul"
            else:
                categories[name] = f"custom call {target}"
        elif op == "fusion":
            callee = re.search(r"calls=%([\w.\-]+)", line)
            kind = re.search(r"kind=(k\w+)", line)
            if callee and callee.group(1) in gemm_computations:
                categories[name] = "matmul"
            elif "dynamic_update_slice" in name or "dynamic-update-slice" in line.split("calls=")[0]:
                categories[name] = "dynamic-update-slice (scan stacking)"
            elif "scatter" in name:
                categories[name] = "scatter"
            else:
                categories[name] = {"kInput": "reduction fusion", "kLoop": "elementwise fusion"}.get(
                    kind.group(1) if kind else "", "other fusion")
        elif op in ("copy", "copy-start", "transpose"):
            categories[name] = "copy/transpose"
    return categories


def _category_of_kernel(name: str) -> str:
    lowered = name.lower()
    if any(k in lowered for k in ("fmha", "flash", "cudnn")):
        return "attention (cuDNN, unattributed)"
    if any(k in lowered for k in ("gemm", "xmma", "cutlass", "sm90", "cublas")):
        return "matmul"
    if "memcpy" in lowered or "memset" in lowered:
        return "memcpy/memset"
    return "other kernels"


def _op_of_event(event) -> str:
    """The HLO op a GPU kernel event belongs to: the profiler's hlo_op stat, or the XLA launch annotation
    ("name:#hlo_op=...,hlo_module=...#"), or else the kernel's own name."""
    stats = {str(k): v for k, v in event.stats}
    if stats.get("hlo_op"):
        return str(stats["hlo_op"])
    for value in stats.values():
        if isinstance(value, str):
            found = re.search(r"hlo_op=([^,#]+)", value)
            if found:
                return found.group(1)
    return event.name


def profile_one_step(jax, compiled, call_args, profile_dir, log) -> dict:
    """Runs one step under jax.profiler and sums the GPU time per HLO op and per category."""
    os.makedirs(profile_dir, exist_ok=True)
    with jax.profiler.trace(profile_dir):
        jax.block_until_ready(compiled(*call_args))
    paths = sorted(glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"no *.xplane.pb under {profile_dir}")
    data = jax.profiler.ProfileData.from_file(paths[-1])
    per_op = collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        lines = list(plane.lines)
        chosen = [l for l in lines if l.name == "XLA Ops"] or [l for l in lines if l.name.startswith("Stream")] or lines
        for line in chosen:
            for event in line.events:
                per_op[_op_of_event(event)] += event.duration_ns / 1e6
    if not per_op:
        raise RuntimeError("the profile has no GPU events (is CUPTI available?)")
    categories = _hlo_categories(compiled.as_text())
    # Kernels named after their fusion ("loop_add_fusion_3") map back to the HLO name ("loop_add_fusion.3").
    category_of = lambda op: (categories.get(op) or categories.get(re.sub(r"_(\d+)$", r".\1", op))
                              or _category_of_kernel(op))
    per_category = collections.Counter()
    for op, ms in per_op.items():
        per_category[category_of(op)] += ms
    total = sum(per_op.values())
    log(f"  GPU time of one step by category (sum of kernel times {total:.1f} ms; profile in {paths[-1]}):")
    for cat, ms in per_category.most_common():
        log(f"    {cat:38s} {ms:8.1f} ms  {ms / total * 100:5.1f}%")
    log("  top ops:")
    for op, ms in per_op.most_common(15):
        log(f"    {op[:60]:60s} {category_of(op):24s} {ms:7.2f} ms")
    return {"kernel_ms": round(total, 1), "by_category_ms": {k: round(v, 2) for k, v in per_category.items()},
            "top_ops_ms": {k: round(v, 2) for k, v in per_op.most_common(40)}, "xplane": paths[-1]}


def run_group(args) -> None:
    """One process: the configurations of one XLA_FLAGS setting, results printed as tagged JSON lines."""
    began = time.time()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from kevin_jax.model import qwen2
    from kevin_jax.model.shapes import named_config

    log = lambda msg: print(msg, flush=True)
    config = named_config(args.model)
    on_gpu = jax.default_backend() == "gpu"
    configs = _complete_configs(json.loads(args.configs), args)
    device = jax.devices()[0]
    header = {"model": args.model, "seq_len": args.seq_len, "device": device.device_kind,
              "backend": jax.default_backend(), "jax": jax.__version__, "peak_tflops": args.peak_tflops,
              "params": config.param_count(), "matmul_params": config.matmul_param_count(),
              "flops_per_token": step_flops(config, 1, args.seq_len) / args.seq_len,
              "xla_flags": os.environ.get("XLA_FLAGS", "")}
    if on_gpu and args.group == "default":
        try:
            header["matmul_ceiling_tflops"] = round(matmul_ceiling(jax, jnp), 1)
        except Exception as e:  # context only
            header["matmul_ceiling_error"] = repr(e)
    print(HEADER_TAG + json.dumps(header), flush=True)
    profile_dir = args.profile_dir
    for cfg in configs:
        if time.time() - began > args.budget_s:
            print(RESULT_TAG + json.dumps({**cfg, "group": args.group,
                                           "skipped": f"time budget {args.budget_s:.0f}s used"}), flush=True)
            continue
        log(f"[{args.group}] config {cfg}")
        try:
            result, profile = run_config(jax, jnp, nnx, qwen2, config, cfg, args, log, profile_dir)
            log(f"  -> {result['step_ms']} ms/step, {result['tokens_per_s']} tok/s, {result['tflops']} TFLOP/s, "
                f"MFU {result['mfu'] * 100:.1f}% (compile {result['compile_s']} s, "
                f"XLA peak {result['xla_peak_gb']} GB)")
            if profile is not None:
                print(PROFILE_TAG + json.dumps({**cfg, "group": args.group, **profile}), flush=True)
            profile_dir = None          # one profile per run (the first configuration that runs)
        except Exception as e:  # OOM, unsupported kernel, bad option: record and go on
            message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            oom = "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()
            result = {**cfg, "error": message, "oom": oom}
            log(f"  -> FAILED ({'OOM' if oom else 'error'}): {message}")
            if not oom:
                traceback.print_exc(limit=3)
        print(RESULT_TAG + json.dumps({**result, "group": args.group}), flush=True)
        jax.clear_caches()


def _complete_configs(configs: list[dict], args) -> list[dict]:
    out = []
    for cfg in configs:
        unknown = set(cfg) - set(CONFIG_KEYS)
        if unknown:
            raise SystemExit(f"--configs: unknown keys {sorted(unknown)}; allowed: {CONFIG_KEYS}")
        out.append({"scan_layers": True, "logprob_chunk": args.logprob_chunk, **cfg})
    return out


# ---------------------------------------------------------------------------------------------- orchestration
def _group_command(args, name: str, configs: list[dict], budget_s: float, profile: bool) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), f"--group={name}", "--configs", json.dumps(configs),
           "--model", args.model, "--seq-len", str(args.seq_len), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--logprob-chunk", str(args.logprob_chunk),
           "--peak-tflops", str(args.peak_tflops), "--budget-s", str(round(budget_s, 1))]
    if profile and args.profile_dir:
        cmd += ["--profile-dir", args.profile_dir]
    return cmd


def _run_group_process(cmd, env, timeout_s: float, log) -> tuple[dict | None, list[dict], list[dict], str]:
    """Runs one group process, echoing its output; returns (header, results, profiles, failure note or '')."""
    header, results, profiles = None, [], []
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: queue.Queue = queue.Queue()

    def reader():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    deadline = time.time() + timeout_s
    note = ""
    finished = False
    while not finished:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.time()))
        except queue.Empty:
            proc.kill()
            note = f"stopped after {timeout_s:.0f}s (its share of --budget-s)"
            break
        if line is None:
            finished = True
            continue
        line = line.rstrip("\n")
        if line.startswith(RESULT_TAG):
            results.append(json.loads(line[len(RESULT_TAG):]))
        elif line.startswith(HEADER_TAG):
            header = json.loads(line[len(HEADER_TAG):])
        elif line.startswith(PROFILE_TAG):
            profiles.append(json.loads(line[len(PROFILE_TAG):]))
        elif "bfc_allocator.cc" not in line and not line.startswith("*"):   # allocator dumps are noise
            log(line)
    proc.wait()
    while not finished:           # after a kill: keep what the process printed before it
        try:
            line = lines.get(timeout=5)
        except queue.Empty:
            break
        if line is None:
            break
        if line.startswith(RESULT_TAG):
            results.append(json.loads(line[len(RESULT_TAG):]))
    if not note and proc.returncode != 0:
        note = f"process exited with code {proc.returncode}"
    return header, results, profiles, note


def _table(results: list[dict], seq_len: int) -> list[str]:
    lines = ["| group / XLA flags | remat | attention | batch x seq | params | layers | logprob chunk | step ms | "
             "tokens/s | TFLOP/s | MFU | compile s | XLA GB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        name = (f"| {r.get('group', '')} | {r.get('remat')} | {r.get('attention')} | {r.get('batch')} x {seq_len} | "
                f"{r.get('param_dtype')} | {'scan' if r.get('scan_layers', True) else 'unrolled'} | "
                f"{r.get('logprob_chunk')} |")
        if "mfu" in r:
            lines.append(f"{name} {r['step_ms']} | {r['tokens_per_s']} | {r['tflops']} | {r['mfu'] * 100:.1f}% | "
                         f"{r['compile_s']} | {r['xla_peak_gb']} |")
        else:
            lines.append(f"{name} {(r.get('error') or r.get('skipped') or '')[:160]} | | | | | |")
    return lines


def main(argv=None):
    args = parse_args(argv)
    if args.group is not None:
        run_group(args)
        return
    began = time.time()
    log = lambda msg: print(msg, flush=True)
    on_gpu = _gpu_visible()
    configs = json.loads(args.configs) if args.configs else (DEFAULT_CONFIGS if on_gpu else CPU_CONFIGS)
    variants = (json.loads(args.xla_variants) if args.xla_variants is not None
                else (DEFAULT_XLA_VARIANTS if on_gpu and not args.configs else []))
    _complete_configs(configs, args)          # fail fast on a typo in --configs
    groups = [("default", args.xla_flags or "", configs)]
    groups += [(flags, flags, configs[:1]) for flags in variants]
    base_env = dict(os.environ)
    base_env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")   # room for the large-batch configurations
    # The default group gets what the variants do not need (~40 s each: start-up, compile, a few steps).
    variant_share = 40.0
    header, results, profiles, notes = None, [], [], {}

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({**(header or {}), "results": results, "profiles": profiles, "group_notes": notes,
                           "elapsed_s": round(time.time() - began, 1)}, f, indent=2)

    for index, (name, flags, group_configs) in enumerate(groups):
        left = args.budget_s - (time.time() - began)
        remaining_variants = len(groups) - index - 1
        share = left - variant_share * remaining_variants if index == 0 else left / (len(groups) - index)
        if share < 20:
            for cfg in group_configs:
                results.append({**cfg, "group": name, "skipped": f"time budget {args.budget_s:.0f}s used"})
            continue
        env = dict(base_env)
        if flags:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
        log(f"=== group {name!r}: {len(group_configs)} configuration(s), {share:.0f}s")
        # A configuration starts only with >= ~15 s of its group's share left; the process is stopped at the share's
        # end plus a grace period for a configuration already running.
        cmd = _group_command(args, name, group_configs, max(share - 15, 1), profile=index == 0)
        group_header, group_results, group_profiles, note = _run_group_process(cmd, env, share + 25, log)
        header = header or group_header
        results += group_results
        profiles += group_profiles
        done = {json.dumps({k: r.get(k) for k in CONFIG_KEYS}) for r in group_results}
        for cfg in _complete_configs(group_configs, args):
            if json.dumps({k: cfg.get(k) for k in CONFIG_KEYS}) not in done:
                results.append({**cfg, "group": name, "error": note or "no result"})
        if note:
            notes[name] = note
            log(f"  group {name!r}: {note}")
        save()

    log("")
    if header:
        log(f"{args.model} ({header['params'] / 1e9:.2f}B params) seq {args.seq_len} on {header['device']} "
            f"(jax {header['jax']}); {header['flops_per_token'] / 1e9:.2f} GFLOP/token; peak {args.peak_tflops} "
            f"TFLOP/s; bf16 8192^3 matmul: {header.get('matmul_ceiling_tflops', '-')} TFLOP/s")
    for line in _table(results, args.seq_len):
        log(line)
    done = [r for r in results if "mfu" in r]
    if done:
        best = max(done, key=lambda r: r["mfu"])
        log(f"best: MFU {best['mfu'] * 100:.1f}% with group={best['group']!r} remat={best['remat']} "
            f"attention={best['attention']} batch={best['batch']} params={best['param_dtype']} "
            f"layers={'scan' if best['scan_layers'] else 'unrolled'} logprob_chunk={best['logprob_chunk']}")
    save()


def _gpu_visible() -> bool:
    """Whether the group processes will run on a GPU (this process must not initialise JAX: it would hold the GPU)."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu" or shutil.which("nvidia-smi") is None:
        return False
    try:
        probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0 and "GPU" in probe.stdout


if __name__ == "__main__":
    main()
