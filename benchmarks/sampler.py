"""Sampler throughput on one GPU against the memory-bandwidth roofline and against transformers' generate.

    python benchmarks/sampler.py --out $OUT/sampler.json          # the device run: 1.5B and 7B, batch 64 and 256
    python benchmarks/sampler.py --tiny --out /tmp/sampler.json    # the same code on a tiny config (CPU, ~2 min)

Random bf16 weights; prompts of 1-2k tokens, 16 sequences per distinct prompt (Kevin's trajectories share their
first-turn prompt); temperature 0.9; no EOS (lengths are set per sequence). Sections, each surviving failures (an OOM
in one configuration is recorded and the next one runs):
  copy      device copy bandwidth (read + write bytes / time of x + 1 over a 4 GiB array): the roofline.
  hf        transformers' generate (bf16, sdpa, left-padded batch) on the same shapes, run first, before JAX takes
            the memory. Measured on --hf-new-tokens new tokens: decode rate = batch x (n - 1) / (t(n) - t(1)), i.e.
            per generated token with prefill excluded, comparable to our decode tokens/s.
  runs      ours, per (model, batch): "uniform" = every sequence generates --new-tokens; "varied" (largest batch
            only) = twice as many sequences as slots, lengths uniform in [new/16, new]: continuous batching refills
            slots. Decode tokens/s, ms per decode step, and bandwidth utilisation = (weight bytes + live KV bytes
            read) per step / step time / copy bandwidth.
  bf16_gap  sampler log-probs (bf16) vs token_logprobs recomputed by the bf16 and the fp32 forward (what the RL
            loss compares against), on the first model.
  attention Pallas paged attention vs the pure-JAX fallback, decode tokens/s on the first model's largest batch.
Prints a markdown table for docs/LOG.md and writes everything to --out as JSON.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.85")   # leaves room for torch's CUDA context
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import numpy as np  # noqa: E402

RESULTS: dict = {"runs": [], "hf": []}
START = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - START


def is_oom(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}"
    return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OutOfMemory"))


def error_record(error: BaseException) -> dict:
    return {"error": ("OOM: " if is_oom(error) else "") + f"{type(error).__name__}: {str(error)[:500]}",
            "trace": traceback.format_exc()[-1500:]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--tiny", action="store_true", help="tiny config, small shapes: a CPU smoke run")
    p.add_argument("--configs", default="qwen2.5_1.5b,qwen2.5_7b")
    p.add_argument("--batches", default="64,256", help="decode slots (concurrent sequences)")
    p.add_argument("--prompt-min", type=int, default=1024)
    p.add_argument("--prompt-max", type=int, default=2048)
    p.add_argument("--new-tokens", type=int, default=2048)
    p.add_argument("--share", type=int, default=16, help="sequences per distinct prompt")
    p.add_argument("--hf-new-tokens", type=int, default=64, help="0 = skip transformers")
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--attention", default="auto")
    p.add_argument("--layer-unroll", type=int, default=1, help="SamplerConfig.layer_unroll (0 = fully unrolled)")
    p.add_argument("--budget-s", type=float, default=320.0, help="skip remaining runs after this many seconds")
    p.add_argument("--no-varied", action="store_true")
    if p.parse_args(argv).tiny:              # tiny defaults; explicit flags still win
        p.set_defaults(configs="tiny", batches="4,8", prompt_min=16, prompt_max=48, new_tokens=32, share=2,
                       hf_new_tokens=8, decode_steps=8)
    return p.parse_args(argv)


def make_prompts(rng, count: int, share: int, low: int, high: int, vocab: int) -> list[list[int]]:
    distinct = [rng.integers(0, vocab, int(rng.integers(low, high + 1))).tolist() for _ in range(-(-count // share))]
    return [distinct[i // share] for i in range(count)]


# ----------------------------------------------------------------------------------------------- sections
def copy_bandwidth(tiny: bool) -> dict:
    import jax
    import jax.numpy as jnp

    size = (64 if tiny else 4096) * 2**20
    x = jnp.ones((size // 2,), jnp.bfloat16)
    f = jax.jit(lambda a: a + 1)
    jax.block_until_ready(f(x))
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    median = float(np.median(times))
    return {"bytes": 2 * size, "median_s": median, "tb_s": 2 * size / median / 1e12}


def hf_generate(config_name: str, batch: int, prompts: list[list[int]], new_tokens: int) -> dict:
    """transformers' generate on random bf16 weights of the same shapes; per-token decode rate."""
    import torch
    import transformers

    from kevin_jax.model.shapes import named_config, to_hf_config

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf_config = transformers.Qwen2Config.from_dict(to_hf_config(named_config(config_name)))
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM._from_config(hf_config, dtype=torch.bfloat16).eval()
    record = {"model": config_name, "device": device}
    try:
        for attempt_batch in (batch, batch // 2):
            try:
                record.update(_hf_rates(model, prompts[:attempt_batch], new_tokens, device))
                record["batch"] = attempt_batch
                if attempt_batch != batch:
                    record["note"] = f"batch {batch} ran out of memory; measured at {attempt_batch}"
                break
            except torch.OutOfMemoryError as e:
                record["error_first_try"] = f"OOM at batch {attempt_batch}: {str(e)[:200]}"
                torch.cuda.empty_cache()
    finally:
        del model
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return record


def _hf_rates(model, prompts, new_tokens, device) -> dict:
    """One generate call; a logits processor time-stamps every step (generate syncs each step for its stopping
    check anyway), so decode time = last stamp - first stamp, prefill excluded."""
    import torch
    import transformers

    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):                        # left padding, as generate expects
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)

    class StepClock(transformers.LogitsProcessor):
        def __init__(self):
            self.stamps = []

        def __call__(self, input_ids, scores):
            if device == "cuda":
                torch.cuda.synchronize()
            self.stamps.append(time.perf_counter())
            return scores

    def run(n, rows):
        clock = StepClock()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids[:rows], attention_mask=mask[:rows], max_new_tokens=n, min_new_tokens=n,
                                 do_sample=True, temperature=0.9, top_p=1.0, top_k=0, eos_token_id=None,
                                 pad_token_id=0, logits_processor=transformers.LogitsProcessorList([clock]))
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == width + n
        return time.perf_counter() - t0, clock.stamps

    run(2, 2)                                              # warm-up (CUDA context, cuBLAS handles)
    total, stamps = run(new_tokens, len(prompts))
    decode_s = stamps[-1] - stamps[0]                      # new_tokens - 1 decode steps
    return {"new_tokens": new_tokens, "t_all_s": total, "decode_ms_per_step": 1e3 * decode_s / max(1, new_tokens - 1),
            "decode_tok_s": len(prompts) * (new_tokens - 1) / max(decode_s, 1e-9),
            "end_to_end_tok_s": len(prompts) * new_tokens / total}


def sampler_run(engine, params, prompts, max_new, seed, *, weight_bytes, kv_bytes_per_token, copy_tb_s) -> dict:
    import jax

    results, stats = engine.generate(params, prompts, max_new, seed)
    decode_tokens = stats.slot_steps_active
    step_s = stats.decode_s / max(1, stats.decode_steps)
    bytes_per_step = weight_bytes + stats.kv_tokens_read * kv_bytes_per_token / max(1, stats.decode_steps)
    device = jax.local_devices()[0]
    memory = (device.memory_stats() or {}).get("peak_bytes_in_use")
    return {
        "sequences": len(prompts), "generated_tokens": stats.generated_tokens,
        "mean_new_tokens": float(np.mean([len(r.tokens) for r in results])),
        "decode_tok_s": decode_tokens / max(stats.decode_s, 1e-9),
        "end_to_end_tok_s": stats.generated_tokens / max(stats.total_s, 1e-9),
        "step_ms": 1e3 * step_s, "decode_steps": stats.decode_steps, "decode_calls": stats.decode_calls,
        "bytes_per_step_gb": bytes_per_step / 1e9,
        "weight_gb": weight_bytes / 1e9,
        "bandwidth_tb_s": bytes_per_step / max(step_s, 1e-12) / 1e12,
        "roofline_fraction": bytes_per_step / max(step_s, 1e-12) / 1e12 / copy_tb_s if copy_tb_s else None,
        "slot_occupancy": stats.slot_occupancy, "prefill_s": stats.prefill_s, "decode_s": stats.decode_s,
        "total_s": stats.total_s, "prefill_tokens": stats.prefill_tokens,
        "reused_prefix_tokens": stats.reused_prefix_tokens, "preemptions": stats.preemptions,
        "peak_pages": stats.peak_pages_in_use, "peak_device_gb": memory / 1e9 if memory else None,
    }


def bf16_gap(model, engine_cls, config_cls, args, rng) -> dict:
    """Sampler log-probs vs the policy's forward recomputation in bf16 and in fp32 (same weights)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from kevin_jax.model import qwen2
    from kevin_jax.sampler.engine import params_of

    count, new = (4, 16) if args.tiny else (16, 256)
    length = min(512, args.prompt_max)
    prompts = make_prompts(rng, count, 4, length // 2, length, model.config.vocab_size)
    config = config_cls(temperature=0.9, max_slots=count, max_seq_len=length + new, page_size=args.page_size,
                        decode_steps=args.decode_steps, attention=args.attention)
    results, _ = engine_cls(model, config).generate(params_of(model), prompts, new, seed=3)
    width = length + new
    tokens = np.zeros((count, width), np.int32)
    segments = np.zeros((count, width), np.int32)
    for i, (p, r) in enumerate(zip(prompts, results)):
        seq = p + r.tokens
        tokens[i, :len(seq)], segments[i, :len(seq)] = seq, 1
    targets = np.roll(tokens, -1, axis=1)
    out = {}
    for name, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        options = qwen2.ModelOptions(dtype=dtype, param_dtype=model.options.param_dtype, remat="none")
        graphdef = nnx.split(qwen2.abstract_model(model.config, options))[0]
        recompute = jax.jit(lambda s, t, seg, tg: nnx.merge(graphdef, s).token_logprobs(
            t, None, seg, tg, chunk_size=256, temperature=0.9, right_padded=True))
        lp = np.asarray(recompute(params_of(model), jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(targets)))
        gaps = np.concatenate([np.asarray(r.logprobs) - lp[i, len(p) - 1:len(p) - 1 + len(r.tokens)]
                               for i, (p, r) in enumerate(zip(prompts, results))])
        out[name] = {"mean_abs": float(np.mean(np.abs(gaps))), "max_abs": float(np.max(np.abs(gaps))),
                     "p99_abs": float(np.quantile(np.abs(gaps), 0.99)), "mean": float(np.mean(gaps)),
                     "mean_ratio_minus_1": float(np.mean(np.exp(gaps)) - 1), "tokens": int(gaps.size)}
    return out


# ----------------------------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    configs = args.configs.split(",")
    batches = sorted(int(b) for b in args.batches.split(","))
    rng = np.random.default_rng(0)
    from kevin_jax.model.shapes import named_config

    prompt_sets = {}
    for name in configs:
        vocab = named_config(name).vocab_size
        prompt_sets[name] = {b: make_prompts(np.random.default_rng(b), b, args.share, args.prompt_min,
                                             args.prompt_max, vocab) for b in batches}
        prompt_sets[name]["varied"] = make_prompts(np.random.default_rng(1), 2 * batches[-1], args.share,
                                                   args.prompt_min, args.prompt_max, vocab)

    # transformers first: JAX takes most of the device memory once it starts.
    if args.hf_new_tokens > 0:
        for name in configs:
            for batch in batches:
                t0 = time.perf_counter()
                try:
                    record = hf_generate(name, batch, prompt_sets[name][batch], args.hf_new_tokens)
                except Exception as e:  # noqa: BLE001 - a benchmark records failures and goes on
                    record = {"model": name, "batch": batch, **error_record(e)}
                record.update(requested_batch=batch, seconds=time.perf_counter() - t0)
                RESULTS["hf"].append(record)
                print(f"[hf] {name} batch {batch}: {record.get('decode_tok_s', record.get('error'))} "
                      f"({record['seconds']:.0f}s)", flush=True)
        try:
            import torch

            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass

    import jax

    from kevin_jax import parallel
    from kevin_jax.model import qwen2
    from kevin_jax.sampler import SamplerConfig, SamplerEngine, kv_cache
    from kevin_jax.sampler.engine import params_of

    RESULTS["env"] = {"jax": jax.__version__, "backend": jax.default_backend(),
                      "device": str(jax.local_devices()[0].device_kind), "python": platform.python_version(),
                      "args": vars(args)}
    try:
        RESULTS["copy"] = copy_bandwidth(args.tiny)
    except Exception as e:  # noqa: BLE001
        RESULTS["copy"] = error_record(e)
    copy_tb_s = RESULTS["copy"].get("tb_s")
    print(f"[copy] {RESULTS['copy']}", flush=True)

    max_seq_len = args.prompt_max + args.new_tokens

    def build_model(name):
        one_device = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.local_devices()[:1])
        options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="bfloat16", remat="none")
        return qwen2.init_sharded(named_config(name), options, one_device, seed=0)

    for name in configs:
        config = named_config(name)
        try:
            model = build_model(name)
        except Exception as e:  # noqa: BLE001
            RESULTS["runs"].append({"model": name, **error_record(e)})
            continue
        params = params_of(model)
        weight_bytes = config.matmul_param_count() * 2
        pages = kv_cache.pages_for(batches[-1] * max_seq_len, args.page_size) + 1
        for batch in batches:
            scenarios = [("uniform", prompt_sets[name][batch], args.new_tokens)]
            if batch == batches[-1] and not args.no_varied:
                varied = prompt_sets[name]["varied"]
                lengths = np.random.default_rng(2).integers(args.new_tokens // 16, args.new_tokens + 1, len(varied))
                scenarios.append(("varied", varied, lengths.tolist()))
            if elapsed() > args.budget_s:
                for scenario, _, _ in scenarios:
                    RESULTS["runs"].append({"model": name, "batch": batch, "scenario": scenario,
                                            "error": f"skipped: time budget {args.budget_s:.0f}s spent"})
                continue
            engine = None
            try:
                sampler_config = SamplerConfig(temperature=0.9, max_slots=batch, max_seq_len=max_seq_len,
                                               page_size=args.page_size, num_pages=pages,
                                               decode_steps=args.decode_steps, attention=args.attention,
                                               layer_unroll=args.layer_unroll or True)
                engine = SamplerEngine(model, sampler_config)
                t0 = time.perf_counter()
                engine.generate(params, scenarios[0][1], 2, seed=0)          # compiles prefill buckets + decode
                compile_s = time.perf_counter() - t0
                for scenario, prompts, max_new in scenarios:
                    record = {"model": name, "batch": batch, "scenario": scenario,
                              "attention": engine.decode_impl, "warmup_s": compile_s}
                    try:
                        record.update(sampler_run(
                            engine, params, prompts, max_new, seed=1, weight_bytes=weight_bytes,
                            kv_bytes_per_token=engine.geometry.bytes_per_token(engine.dtype), copy_tb_s=copy_tb_s))
                    except Exception as e:  # noqa: BLE001 - e.g. an OOM in this configuration only
                        record.update(error_record(e))
                    RESULTS["runs"].append(record)
                    print(f"[run] {name} batch {batch} {scenario}: "
                          f"{ {k: record.get(k) for k in ('decode_tok_s', 'step_ms', 'roofline_fraction', 'error')} } "
                          f"t={elapsed():.0f}s", flush=True)
                    save(args.out)
            except Exception as e:  # noqa: BLE001
                RESULTS["runs"].append({"model": name, "batch": batch, **error_record(e)})
                print(f"[run] {name} batch {batch}: {RESULTS['runs'][-1]['error']}", flush=True)
            finally:
                if engine is not None:
                    engine.release_memory()                               # the next batch size gets the memory
                del engine
                gc.collect()
        del model, params
        gc.collect()

    # Extras on the first model, only if time is left (the main table comes first).
    if elapsed() < args.budget_s - 60:
        model = build_model(configs[0])
        try:
            RESULTS["bf16_gap"] = bf16_gap(model, SamplerEngine, SamplerConfig, args, rng)
        except Exception as e:  # noqa: BLE001
            RESULTS["bf16_gap"] = error_record(e)
        print(f"[bf16_gap] {RESULTS['bf16_gap']}", flush=True)
        save(args.out)
        if elapsed() < args.budget_s - 30 and jax.default_backend() == "gpu":
            base = SamplerConfig(temperature=0.9, max_slots=batches[-1], max_seq_len=max_seq_len,
                                 page_size=args.page_size, decode_steps=args.decode_steps,
                                 layer_unroll=args.layer_unroll or True,
                                 num_pages=kv_cache.pages_for(batches[-1] * max_seq_len, args.page_size) + 1)
            RESULTS["attention"] = compare_attention(
                model, params_of(model), base, prompt_sets[configs[0]][batches[-1]], args,
                named_config(configs[0]).matmul_param_count() * 2, copy_tb_s)
            print(f"[attention] {RESULTS['attention']}", flush=True)
        del model
        gc.collect()

    RESULTS["elapsed_s"] = elapsed()
    save(args.out)
    print(table(RESULTS))
    print(f"wrote {args.out} ({elapsed():.0f}s)")


def save(path: str) -> None:
    """Written after every measurement: a run cut short still leaves its results."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def compare_attention(model, params, base_config, prompts, args, weight_bytes, copy_tb_s) -> dict:
    """Decode tokens/s of the Pallas kernel and of the pure-JAX fallback on the same shapes (256 new tokens)."""
    from kevin_jax.sampler import SamplerEngine

    out = {}
    new = min(256, args.new_tokens)
    for impl in ("pallas", "xla"):
        other = None
        try:
            other = SamplerEngine(model, base_config.replace(attention=impl))
            other.generate(params, prompts, 2, seed=0)
            out[impl] = sampler_run(other, params, prompts, new, seed=1, weight_bytes=weight_bytes,
                                    kv_bytes_per_token=other.geometry.bytes_per_token(other.dtype),
                                    copy_tb_s=copy_tb_s)
        except Exception as e:  # noqa: BLE001
            out[impl] = error_record(e)
        finally:
            if other is not None:
                other.release_memory()
    return out


def table(results: dict) -> str:
    copy = results.get("copy", {}).get("tb_s")
    hf = {(r.get("model"), r.get("requested_batch")): r for r in results.get("hf", [])}
    lines = [f"copy bandwidth {copy:.2f} TB/s (read+write)" if copy else "copy bandwidth: n/a", "",
             "| model | batch | scenario | decode tok/s | ms/step | GB/step (weights+KV) | % of copy roofline | "
             "occupancy | prefill s | HF decode tok/s | x HF | peak GB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results.get("runs", []):
        if "error" in r:
            lines.append(f"| {r.get('model')} | {r.get('batch')} | {r.get('scenario', '')} | {r['error'][:80]} |"
                         + " |" * 8)
            continue
        h = hf.get((r["model"], r["batch"]), {})
        hf_rate = h.get("decode_tok_s")
        ratio = f"{r['decode_tok_s'] / hf_rate:.1f}" if hf_rate else "n/a"
        hf_text = f"{hf_rate:.0f}" + (f" (batch {h['batch']})" if h.get("batch") != r["batch"] else "") \
            if hf_rate else str(h.get("error", "n/a"))[:40]
        roof = f"{100 * r['roofline_fraction']:.0f}%" if r.get("roofline_fraction") else "n/a"
        peak = f"{r['peak_device_gb']:.0f}" if r.get("peak_device_gb") else "n/a"
        lines.append(f"| {r['model']} | {r['batch']} | {r['scenario']} | {r['decode_tok_s']:.0f} | "
                     f"{r['step_ms']:.2f} | {r['bytes_per_step_gb']:.2f} | {roof} | {r['slot_occupancy']:.2f} | "
                     f"{r['prefill_s']:.1f} | {hf_text} | {ratio} | {peak} |")
    gap = results.get("bf16_gap")
    if gap and "error" not in gap:
        lines += ["", "bf16 log-prob gap (sampler - recomputed token_logprobs, T=0.9): " + "; ".join(
            f"vs {k} forward: mean |d| {v['mean_abs']:.4f}, p99 {v['p99_abs']:.4f}, max {v['max_abs']:.4f}, "
            f"mean ratio-1 {v['mean_ratio_minus_1']:+.4f} over {v['tokens']} tokens" for k, v in gap.items())]
    att = results.get("attention")
    if att:
        lines += ["", "decode attention (256 new tokens): " + "; ".join(
            f"{k}: {v['decode_tok_s']:.0f} tok/s, {v['step_ms']:.2f} ms/step"
            if "error" not in v else f"{k}: {v['error'][:80]}" for k, v in att.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
