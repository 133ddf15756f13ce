"""Training throughput and MFU of the kevin_jax Qwen2 forward+backward on one GPU (several configurations per run).

    python benchmarks/mfu.py --out $OUT/mfu.json                     # qwen2.5_1.5b, seq 8192, bf16, on the GPU
    python benchmarks/mfu.py --model tiny --seq-len 256 --budget-s 60 # CPU smoke run (proves the script works)

What is timed: jax.value_and_grad of the RL-shaped loss (sum of advantage-weighted per-token log-probs from
Qwen2ForCausalLM.token_logprobs, i.e. the chunked log-prob head, through the scanned decoder) w.r.t. all parameters,
jitted; no optimizer update. Each configuration (remat policy, attention kernel, batch size, parameter dtype) is
compiled, warmed up, then timed step by step; out-of-memory or compile failures are recorded and the next
configuration runs. A wall-clock budget stops starting new configurations so the whole run fits the device slot.

FLOPs per step, MaxText's way (recomputation from remat is NOT counted):
  6 * N * tokens            N = parameters that enter a matmul per token (all layer weights + the LM head)
  + 6 * L * B * T^2 * Hq * D   causal attention: QK^T and PV, forward (x1) + backward (x2), half the T x T grid
MFU = FLOPs per step / step time / peak (default 989 TFLOP/s: H100/H200 SXM dense bf16).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

# Tried in this order (best guesses first, so a budget cut keeps the informative ones).
DEFAULT_CONFIGS = [
    dict(remat="none", batch=2, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="none", batch=4, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="qkv_attn", batch=4, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="dots_no_batch", batch=4, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="none", batch=2, attention="cudnn", param_dtype="float32"),
    dict(remat="full", batch=8, attention="cudnn", param_dtype="bfloat16"),
    dict(remat="full", batch=1, attention="xla", param_dtype="bfloat16"),
]
CPU_CONFIGS = [
    dict(remat="none", batch=2, attention="xla", param_dtype="float32"),
    dict(remat="full", batch=2, attention="chunked", param_dtype="bfloat16"),
    dict(remat="qkv_attn", batch=2, attention="xla", param_dtype="bfloat16"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5_1.5b")
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation")
    p.add_argument("--logprob-chunk", type=int, default=2048)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--budget-s", type=float, default=210.0, help="start no new configuration after this many seconds")
    p.add_argument("--configs", default=None, help="JSON list of dicts (remat, batch, attention, param_dtype)")
    p.add_argument("--xla-flags", default=None, help="extra XLA_FLAGS (set before JAX starts)")
    p.add_argument("--out", default=None, help="JSON results (rewritten after every configuration)")
    return p.parse_args(argv)


def step_flops(config, batch: int, seq_len: int) -> float:
    tokens = batch * seq_len
    dense = 6.0 * config.matmul_param_count() * tokens
    attention = 6.0 * config.num_hidden_layers * batch * seq_len ** 2 * config.num_attention_heads * config.head_dim
    return dense + attention


def matmul_ceiling(jax, jnp) -> float | None:
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


def run_config(jax, jnp, nnx, qwen2, config, cfg: dict, args, log) -> dict:
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype=cfg["param_dtype"], remat=cfg["remat"],
                                 attention=cfg["attention"])
    batch, seq = cfg["batch"], args.seq_len
    graphdef, abstract = nnx.split(qwen2.abstract_model(config, options))

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
        logprobs = model.token_logprobs(tokens, None, segments, targets, chunk_size=args.logprob_chunk,
                                        right_padded=True)
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
    del grads, params
    median = sorted(times)[len(times) // 2]
    return {**cfg, "compile_s": round(compile_s, 1), "step_ms": round(median * 1e3, 2),
            "step_ms_all": [round(t * 1e3, 2) for t in times], "tokens_per_s": round(batch * seq / median),
            "tflops": round(flops / median / 1e12, 1), "mfu": round(flops / median / (args.peak_tflops * 1e12), 4),
            "xla_peak_gb": None if memory is None else round(memory, 1), "loss": float(loss)}


def main(argv=None):
    args = parse_args(argv)
    if args.xla_flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from kevin_jax.model import qwen2
    from kevin_jax.model.shapes import named_config

    began = time.time()
    log = lambda msg: print(msg, flush=True)
    config = named_config(args.model)
    on_gpu = jax.default_backend() == "gpu"
    configs = json.loads(args.configs) if args.configs else (DEFAULT_CONFIGS if on_gpu else CPU_CONFIGS)
    device = jax.devices()[0]
    header = {"model": args.model, "seq_len": args.seq_len, "device": device.device_kind,
              "backend": jax.default_backend(), "jax": jax.__version__, "peak_tflops": args.peak_tflops,
              "params": config.param_count(), "matmul_params": config.matmul_param_count(),
              "flops_per_token": step_flops(config, 1, args.seq_len) / args.seq_len}
    log(f"{args.model} ({config.param_count() / 1e9:.2f}B params) seq {args.seq_len} on {device.device_kind} "
        f"(jax {jax.__version__}); {header['flops_per_token'] / 1e9:.2f} GFLOP/token; peak {args.peak_tflops} TFLOP/s")
    if on_gpu:
        try:
            header["matmul_ceiling_tflops"] = round(matmul_ceiling(jax, jnp), 1)
            log(f"bf16 8192^3 matmul: {header['matmul_ceiling_tflops']} TFLOP/s")
        except Exception as e:  # context only
            header["matmul_ceiling_error"] = repr(e)
    results = []

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump({**header, "results": results, "elapsed_s": round(time.time() - began, 1)}, f, indent=2)

    for cfg in configs:
        if time.time() - began > args.budget_s:
            results.append({**cfg, "skipped": f"time budget {args.budget_s:.0f}s used"})
            log(f"skip {cfg}: budget used")
            continue
        log(f"config {cfg}")
        try:
            results.append(run_config(jax, jnp, nnx, qwen2, config, cfg, args, log))
            r = results[-1]
            log(f"  -> {r['step_ms']} ms/step, {r['tokens_per_s']} tok/s, {r['tflops']} TFLOP/s, "
                f"MFU {r['mfu'] * 100:.1f}% (compile {r['compile_s']} s, XLA peak {r['xla_peak_gb']} GB)")
        except Exception as e:  # OOM, unsupported kernel, ...: record and go on
            message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            oom = "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()
            results.append({**cfg, "error": message, "oom": oom})
            log(f"  -> FAILED ({'OOM' if oom else 'error'}): {message}")
            if not oom:
                traceback.print_exc(limit=3)
        jax.clear_caches()
        save()

    log("")
    log(f"| remat | attention | batch x seq | params | step ms | tokens/s | TFLOP/s | MFU | compile s | XLA GB |")
    log("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        name = f"| {r['remat']} | {r['attention']} | {r['batch']} x {args.seq_len} | {r['param_dtype']} |"
        if "error" in r or "skipped" in r:
            log(f"{name} {r.get('error') or r.get('skipped')} | | | | | |")
        else:
            log(f"{name} {r['step_ms']} | {r['tokens_per_s']} | {r['tflops']} | {r['mfu'] * 100:.1f}% | "
                f"{r['compile_s']} | {r['xla_peak_gb']} |")
    done = [r for r in results if "mfu" in r]
    if done:
        best = max(done, key=lambda r: r["mfu"])
        log(f"best: MFU {best['mfu'] * 100:.1f}% with remat={best['remat']} attention={best['attention']} "
            f"batch={best['batch']} params={best['param_dtype']}")
    save()


if __name__ == "__main__":
    main()
