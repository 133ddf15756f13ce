"""Sampler throughput: copy roofline, where a decode step's time goes, and the throughput table; on one GPU, or
tensor-parallel over N GPUs at QwQ-32B's shape (--gpus N).

    python benchmarks/sampler.py --out $OUT/sampler.json           # one GPU (H200, ~6-7 min)
    python benchmarks/sampler.py --gpus 4 --out $OUT/sampler_tp4.json   # qwq_32b on 4 GPUs (~4-5 min on 4 x H100)
    python benchmarks/sampler.py --tiny --out /tmp/sampler.json     # the same code on a tiny config (CPU smoke run)
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python benchmarks/sampler.py --tiny --gpus 2 --out ...

--gpus N: see TensorParallelBench (random bf16 weights generated on the GPUs in the trainer's FSDP layout, the
sampler's own KV pool rule and weight copy; decode tok/s at --batches against the bandwidth roofline, where the time
goes, end to end with prefill tok/s). The one-GPU sections below are then skipped.

Random bf16 weights; prompts of 1-2k tokens, 16 sequences per distinct prompt (Kevin's trajectories share their
first-turn prompt); temperature 0.9; no EOS (lengths are set per sequence). Sections, in this order, each isolated
(a failure or OOM is recorded and the rest runs; the JSON is rewritten after every measurement):

  copy        the roofline: torch `copy_` (read + write bytes, CUDA events: what benchmarks/probe_machine.py
              measures) and a JAX elementwise op that reaches the copy rate (benchmarks/bandwidth.py). The roofline
              used below is the torch number (the JAX one when torch has no GPU).
  hf          transformers' generate (bf16, sdpa, left-padded batch), run before JAX takes the memory, on
              --hf-new-tokens new tokens: decode rate = batch x (n - 1) / (time of steps 2..n) (prefill excluded),
              compared per token with our decode rate at the same batch.
  per model (--configs), at its largest batch (the last of --batches), on a frozen scene (random KV at cache
  lengths uniform in [--scene-min, --scene-max], the mean cache length of the uniform run):
    sweep     the Pallas attention kernel's blocking (keys per block, keys per program, warps, stages) and the
              pure-JAX fallback, one layer's attention timed apart; the fastest kernel is used from then on.
    breakdown the parts of one decode step timed apart (benchmarks/sampler_breakdown.py): layers without attention
              ("unrolled" and "scan"), attention, KV writes, LM head + sampling, sampling alone, and the real decode
              call per step with the best settings and with 1-2 variants (layer_loop="scan", the first run's
              kernel blocking).
    runs      the throughput table: "uniform" (every sequence generates --new-tokens) at every batch, and "varied"
              at the largest (twice as many sequences as slots, lengths uniform in [new/16, new]: continuous
              batching refills slots). Decode tokens/s, ms per decode step, and bandwidth utilisation = (weight bytes
              + live KV bytes read) per step / step time / copy roofline.
  bf16_gap    sampler log-probs (bf16) vs token_logprobs recomputed in bf16 and fp32 (first model; if time is left).
Prints markdown tables for docs/LOG.md. --budget-s skips what no longer fits (recorded as skipped).
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # sibling benchmark modules

import numpy as np  # noqa: E402

RESULTS: dict = {"copy": {}, "hf": [], "models": {}, "runs": []}
START = time.perf_counter()
OUT_PATH = ""

# The first H200 run's kernel blocking (E's pallas_params: 128 keys per block, 16 programs per table, 8 warps,
# 2 stages), kept as a variant.
FIRST_RUN_BLOCKING = dict(block_tokens=128, split_tokens=-1, warps=8, stages=2)


def elapsed() -> float:
    return time.perf_counter() - START


def is_oom(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}"
    return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OutOfMemory"))


def error_record(error: BaseException) -> dict:
    return {"error": ("OOM: " if is_oom(error) else "") + f"{type(error).__name__}: {str(error)[:500]}",
            "trace": traceback.format_exc()[-1500:]}


def save() -> None:
    """Written after every measurement: a run cut short still leaves its results."""
    RESULTS["elapsed_s"] = elapsed()
    os.makedirs(os.path.dirname(os.path.abspath(OUT_PATH)), exist_ok=True)
    with open(OUT_PATH, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


def guarded(label: str, fn, *args, **kwargs) -> dict:
    """Runs one measurement; any failure (OOM included) becomes an {"error": ...} record. Prints and saves."""
    t0 = time.perf_counter()
    try:
        record = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - a benchmark records failures and goes on
        record = error_record(e)
    record = dict(record) if isinstance(record, dict) else {"value": record}
    record["wall_s"] = time.perf_counter() - t0
    brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in record.items()
             if k in ("ms_per_step", "tb_s", "roofline_fraction", "decode_tok_s", "step_ms", "error", "wall_s")}
    print(f"[{label}] {brief} t={elapsed():.0f}s", flush=True)
    gc.collect()
    return record


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--tiny", action="store_true", help="tiny config, small shapes: a CPU smoke run")
    p.add_argument("--configs", default="qwen2.5_1.5b,qwen2.5_7b")
    p.add_argument("--batches", default="64,256,512", help="decode slots; the last is the largest")
    p.add_argument("--prompt-min", type=int, default=1024)
    p.add_argument("--prompt-max", type=int, default=2048)
    p.add_argument("--new-tokens", type=int, default=2048)
    p.add_argument("--share", type=int, default=16, help="sequences per distinct prompt")
    p.add_argument("--hf-new-tokens", type=int, default=12, help="0 = skip transformers")
    p.add_argument("--hf-batches", default="64,256")
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--scene-min", type=int, default=1536, help="breakdown cache lengths (mean = uniform run's)")
    p.add_argument("--scene-max", type=int, default=3584)
    p.add_argument("--sweep", default="64:512:4:3,64:512:4:1,64:1024:4:3,64:256:4:3,64:2048:4:3,32:512:4:3,"
                                      "32:1024:2:3,64:512:2:3,64:512:8:3,128:512:4:3,128:1024:8:3,16:1024:2:3,first",
                   help="Pallas blockings block_tokens:split_tokens:warps:stages ('first' = the first run's)")
    p.add_argument("--no-varied", action="store_true")
    p.add_argument("--varied-at", default="qwen2.5_7b=256",
                   help="model=batch of the varied-lengths run (default: the largest batch)")
    p.add_argument("--budget-s", type=float, default=390.0,
                   help="skip what would end after this many seconds (runs are estimated from the breakdown)")
    p.add_argument("--memory-headroom-gb", type=float, default=6.0,
                   help="device memory left free when sizing the KV pool (activations, logits, workspace)")
    tp = p.add_argument_group("tensor parallel (--gpus N): the sampler over N GPUs, as training runs it")
    tp.add_argument("--gpus", type=int, default=0,
                    help="N >= 1: benchmark the tensor-parallel sampler over the first N GPUs instead "
                         "(TensorParallelBench; defaults then: --configs qwq_32b --batches 32,64,128, no transformers)")
    tp.add_argument("--tp-contexts", default="", help="mean cache length per batch (default: the longest that fits)")
    tp.add_argument("--tp-max-seq-len", type=int, default=40960, help="sampler.max_seq_len (QwQ's context)")
    tp.add_argument("--tp-prefill-tokens", type=int, default=8192)
    tp.add_argument("--tp-prefill-chunk", type=int, default=2048)
    tp.add_argument("--kv-cache-fraction", type=float, default=0.9, help="sampler.kv_cache_fraction")
    tp.add_argument("--e2e-new-tokens", type=int, default=256, help="new tokens of the end-to-end run")
    tp.add_argument("--cache-dir", default="", help="JAX's persistent compilation cache (a second run in the same "
                                                    "machine session then skips most compiles)")
    tp.add_argument("--tp-parts", default="decode,e2e,shard",
                    help="which sections run: decode (the throughput table and the step's parts), e2e (generate end "
                         "to end: prefill and decode tok/s), shard (one GPU's shard). All three in one process ran "
                         "out of memory in the end to end at QwQ-32B on 4 x H200; runs/kevin32b.sh runs e2e alone "
                         "first, then decode,shard")
    tp.add_argument("--tp-layers", action="store_true", help="also time the layers without attention (one more "
                                                             "64-layer compile)")
    first = p.parse_args(argv)
    unknown = set(first.tp_parts.split(",")) - {"decode", "e2e", "shard"}
    if not first.tp_parts.strip(","):
        p.error("--tp-parts: name at least one of decode, e2e, shard")
    if unknown:
        p.error(f"--tp-parts: unknown part(s) {', '.join(sorted(unknown))} (choose from decode, e2e, shard)")
    if first.gpus:
        p.set_defaults(configs="qwq_32b", batches="32,64,128", hf_new_tokens=0, decode_steps=32, budget_s=330.0)
    if first.tiny:                           # tiny defaults; explicit flags still win
        p.set_defaults(configs="tiny", batches="4,8", prompt_min=16, prompt_max=48, new_tokens=32, share=2,
                       hf_new_tokens=0 if first.gpus else 6, hf_batches="4", decode_steps=8, scene_min=24,
                       scene_max=40, sweep="16:32:4:2,first", memory_headroom_gb=0.0, tp_max_seq_len=256,
                       tp_prefill_tokens=64, tp_prefill_chunk=32, e2e_new_tokens=8)
        if first.gpus:
            p.set_defaults(batches="2,4")
    return p.parse_args(argv)


def make_prompts(rng, count: int, share: int, low: int, high: int, vocab: int) -> list[list[int]]:
    distinct = [rng.integers(0, vocab, int(rng.integers(low, high + 1))).tolist() for _ in range(-(-count // share))]
    return [distinct[i // share] for i in range(count)]


def parse_blocking(text: str) -> dict:
    if text == "first":
        return dict(FIRST_RUN_BLOCKING)
    block, split, warps, stages = (int(x) for x in text.split(":"))
    return dict(block_tokens=block, split_tokens=split, warps=warps, stages=stages)


def blocking_name(b: dict) -> str:
    split = "table/16" if b["split_tokens"] < 0 else b["split_tokens"]
    return f"block {b['block_tokens']} keys, split {split}, {b['warps']} warps, {b['stages']} stages"


# ----------------------------------------------------------------------------------------------- transformers
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
    try:
        record = {"model": config_name, "device": device, "batch": batch}
        record.update(_hf_rates(model, prompts[:batch], new_tokens, device))
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


# ----------------------------------------------------------------------------------------------- our sampler
def sampler_run(engine, params, prompts, max_new, seed, *, weight_bytes, kv_bytes_per_token, roofline,
                peak_flops=None) -> dict:
    import jax

    results, stats = engine.generate(params, prompts, max_new, seed)
    decode_tokens = stats.slot_steps_active
    step_s = stats.decode_s / max(1, stats.decode_steps)
    kv_bytes = stats.kv_tokens_read * kv_bytes_per_token / max(1, stats.decode_steps)
    bytes_per_step = weight_bytes + kv_bytes
    memory = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    compute_aware = {}
    if roofline and peak_flops:
        # Every slot goes through the matmuls; at large batch they are compute-bound, not weight-streaming-bound.
        flops = 2.0 * engine.model_config.matmul_param_count() * engine.config.max_slots
        ideal_s = max(weight_bytes / (roofline * 1e12), flops / peak_flops) + kv_bytes / (roofline * 1e12)
        compute_aware = {"matmul_tflop_per_step": flops / 1e12, "ideal_ms_compute_aware": 1e3 * ideal_s,
                         "compute_aware_fraction": ideal_s / max(step_s, 1e-12)}
    return {**compute_aware,
        "sequences": len(prompts), "generated_tokens": stats.generated_tokens,
        "mean_new_tokens": float(np.mean([len(r.tokens) for r in results])),
        "decode_tok_s": decode_tokens / max(stats.decode_s, 1e-9),
        "end_to_end_tok_s": stats.generated_tokens / max(stats.total_s, 1e-9),
        "step_ms": 1e3 * step_s, "decode_steps": stats.decode_steps, "decode_calls": stats.decode_calls,
        "bytes_per_step_gb": bytes_per_step / 1e9, "weight_gb": weight_bytes / 1e9,
        "bandwidth_tb_s": bytes_per_step / max(step_s, 1e-12) / 1e12,
        "roofline_fraction": bytes_per_step / max(step_s, 1e-12) / 1e12 / roofline if roofline else None,
        "slot_occupancy": stats.slot_occupancy, "prefill_s": stats.prefill_s, "decode_s": stats.decode_s,
        "total_s": stats.total_s, "prefill_tokens": stats.prefill_tokens,
        "reused_prefix_tokens": stats.reused_prefix_tokens, "preemptions": stats.preemptions,
        "peak_pages": stats.peak_pages_in_use, "peak_device_gb": memory / 1e9 if memory else None,
    }


class ModelBench:
    """One model's measurements: pool sizing, sweep, breakdown, throughput runs."""

    def __init__(self, name: str, args, roofline: float | None):
        import jax

        from kevin_jax import parallel
        from kevin_jax.model import qwen2
        from kevin_jax.model.shapes import named_config
        from kevin_jax.sampler import SamplerConfig, kv_cache
        from kevin_jax.sampler.engine import params_of

        self.name, self.args, self.roofline = name, args, roofline
        self.config = named_config(name)
        one_device = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.local_devices()[:1])
        options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="bfloat16", remat="none")
        self.model = qwen2.init_sharded(self.config, options, one_device, seed=0)
        self.params = params_of(self.model)
        self.weight_bytes = self.config.matmul_param_count() * 2
        self.layer_weight_bytes = self.config.num_hidden_layers * self.config.layer_param_count() * 2
        self.batches = sorted(int(b) for b in args.batches.split(","))
        self.largest = self.batches[-1]
        self.max_seq_len = args.prompt_max + args.new_tokens
        self.on_gpu = jax.default_backend() == "gpu"
        page = args.page_size
        bytes_per_page = kv_cache.make_geometry(self.config, pages_per_layer=2, page_size=page,
                                                max_seq_len=self.max_seq_len).bytes_per_token(np.dtype("bfloat16"))
        bytes_per_page *= page
        dense = kv_cache.pages_for(self.largest * self.max_seq_len, page) + 1
        # What the runs can hold at once: the distinct prompts plus every slot's generated tokens (and the pages
        # taken a decode call ahead), or the breakdown's scene, whichever is larger; 10% spare.
        import sampler_breakdown as parts
        run_tokens = -(-self.largest // args.share) * args.prompt_max \
            + self.largest * (args.new_tokens + 2 * args.decode_steps + page)
        self.scene_lengths = np.random.default_rng(7).integers(args.scene_min, args.scene_max + 1, self.largest)
        scene = parts.scene_pages(self.scene_lengths, 2 * args.decode_steps, page, args.share, args.prompt_min)
        self.pages = min(dense, int(1.1 * max(kv_cache.pages_for(run_tokens, page), scene)) + 1)
        stats = jax.local_devices()[0].memory_stats() or {}
        if stats.get("bytes_limit"):
            # Free memory minus the per-layer weight copies the unrolled decode makes and some headroom.
            free = stats["bytes_limit"] - stats.get("bytes_in_use", 0) - self.layer_weight_bytes \
                - args.memory_headroom_gb * 1e9
            self.pages = max(2, min(self.pages, int(free // bytes_per_page)))
        self.pool_gb = self.pages * bytes_per_page / 1e9
        self.base = SamplerConfig(temperature=0.9, max_slots=self.largest, max_seq_len=self.max_seq_len,
                                  page_size=page, num_pages=self.pages, decode_steps=args.decode_steps,
                                  attention="pallas" if self.on_gpu else "xla", layer_loop="unrolled")
        self.record = RESULTS["models"].setdefault(name, {})
        self.record.update(pool_pages=self.pages, pool_gb=self.pool_gb, dense_pages=dense,
                           weight_gb=self.weight_bytes / 1e9, layer_weight_gb=self.layer_weight_bytes / 1e9)
        print(f"[{name}] pool {self.pages} pages/layer = {self.pool_gb:.1f} GB (dense worst case {dense} pages)",
              flush=True)

    def engine(self, **changes):
        from kevin_jax.sampler import SamplerEngine
        return SamplerEngine(self.model, self.base.replace(**changes))

    def blocking_config(self, blocking: dict) -> dict:
        """SamplerConfig fields for a blocking; 'first' (split_tokens < 0) = 16 programs per table."""
        from kevin_jax.sampler import kv_cache
        split = blocking["split_tokens"]
        if split < 0:
            width = kv_cache.table_width_for(self.max_seq_len, self.args.page_size)
            split = width * self.args.page_size // 16
        return dict(attention_block_tokens=blocking["block_tokens"], attention_split_tokens=split,
                    attention_warps=blocking["warps"], attention_stages=blocking["stages"])

    # ------------------------------------------------------------------ sweep + breakdown at the largest batch
    def scene_sections(self, blockings: list[str], with_xla: bool, variants: list[str]) -> dict:
        """Attention sweep and step breakdown at the largest batch; returns the best SamplerConfig changes."""
        import dataclasses

        import sampler_breakdown as parts
        from kevin_jax.sampler import kv_cache

        args = self.args
        engine = self.engine()
        weights = engine.weights(self.params)
        lengths = self.scene_lengths
        scene = parts.make_scene(self.model, self.params, weights, engine.geometry, lengths,
                                 headroom=2 * args.decode_steps, dtype=engine.dtype, share=args.share,
                                 shared_tokens=args.prompt_min)
        self.record["scene"] = {"batch": self.largest, "mean_cache_len": float(lengths.mean()),
                                "kv_gb_per_step": scene.kv_bytes_per_layer() * self.config.num_hidden_layers / 1e9}
        best = {}
        # 1. attention sweep (one layer timed, x layers)
        sweep = self.record["sweep"] = []
        impls = [("pallas", text) for text in blockings] if self.on_gpu or args.tiny else []
        impls += [("xla", None)] if with_xla or not self.on_gpu else []
        for impl, text in impls:
            blocking = parse_blocking(text) if text else None
            label = "xla (pure JAX)" if impl == "xla" else blocking_name(blocking)
            if elapsed() > args.budget_s:
                sweep.append({"impl": impl, "label": label, "error": "skipped: time budget"})
                continue
            changes = self.blocking_config(blocking) if blocking else {}
            params = kv_cache.pallas_params(
                engine.geometry, interpret=not self.on_gpu, block_tokens=changes["attention_block_tokens"],
                split_tokens=changes["attention_split_tokens"], warps=changes["attention_warps"],
                stages=changes["attention_stages"]) if blocking else None
            record = guarded(f"{self.name} attention {label}", parts.attention_part, scene, impl, params,
                             self.roofline)
            record.update(impl=impl, blocking=text, label=label,
                          params=dataclasses.asdict(params) if params else None, config=changes)
            sweep.append(record)
            save()
        pallas_timed = sorted((r for r in sweep if "ms_per_step" in r and r["impl"] == "pallas"),
                              key=lambda r: r["ms_per_step"])
        self.record["sweep_order"] = [r["blocking"] for r in pallas_timed]
        if pallas_timed:
            best = dict(pallas_timed[0]["config"])
            self.record["best_attention"] = pallas_timed[0]["label"]
        # 2. parts of a step
        parts_record = self.record["breakdown"] = {}
        fastest = min((r for r in sweep if "ms_per_step" in r), key=lambda r: r["ms_per_step"], default=None)
        if fastest:
            parts_record[f"attention ({fastest['label']})"] = fastest
        jobs = [
            ("layers, unrolled (no attention)", parts.layers_part, (scene, "unrolled", self.roofline,
                                                                    self.layer_weight_bytes)),
            ("layers, scan (no attention)", parts.layers_part, (scene, "scan", self.roofline,
                                                                self.layer_weight_bytes)),
            ("kv write", parts.kv_write_part, (scene, self.roofline)),
            ("lm head + sampling", parts.sample_part, (scene, 0.9, self.roofline, True)),
            ("sampling alone", parts.sample_part, (scene, 0.9, self.roofline, False)),
        ]
        for label, fn, fn_args in jobs:
            if elapsed() > args.budget_s:
                parts_record[label] = {"error": "skipped: time budget"}
                continue
            parts_record[label] = guarded(f"{self.name} {label}", fn, *fn_args)
            save()
        # 3. the real decode call: best settings, then the variants of the most uncertain knobs
        del engine
        gc.collect()
        steps = [("step: best (unrolled layers, best kernel)", best)]
        if "scan" in variants:
            steps.append(("step: variant layer_loop=scan", dict(best, layer_loop="scan")))
        if "first" in variants and self.on_gpu:
            steps.append(("step: variant first-run kernel blocking", self.blocking_config(dict(FIRST_RUN_BLOCKING))))
        for label, changes in steps:
            if elapsed() > args.budget_s:
                parts_record[label] = {"error": "skipped: time budget"}
                continue
            parts_record[label] = guarded(f"{self.name} {label}", self._step, scene, changes)
            parts_record[label]["config"] = changes
            save()
        del scene, weights
        gc.collect()
        return best

    def _step(self, scene, changes):
        import sampler_breakdown as parts
        return parts.step_part(scene, self.engine(**changes), self.roofline, self.weight_bytes)

    # ------------------------------------------------------------------ throughput runs
    def estimate_s(self, batch: int, steps: int) -> float:
        """Rough duration of a run, from the breakdown's step time at the largest batch (weights + batch-linear)."""
        step = self.record.get("breakdown", {}).get("step: best (unrolled layers, best kernel)", {})
        ms = step.get("ms_per_step")
        if not ms:                                                 # no breakdown: assume 2 TB/s
            kv = self.record.get("scene", {}).get("kv_gb_per_step", 0.0)
            ms = (self.weight_bytes / 1e9 + kv) / 2.0
        weights_ms = self.weight_bytes / 1e12 / (self.roofline or 2.0) * 1e3
        scaled = weights_ms + (ms - weights_ms) * batch / self.largest
        return steps * scaled / 1e3 + 15.0                          # + compile and prefill

    def runs(self, best: dict, prompt_sets: dict, varied_batch: int) -> None:
        args = self.args
        order = [self.largest] + [b for b in reversed(self.batches) if b != self.largest]
        for batch in order:
            scenarios = [("uniform", prompt_sets[batch], args.new_tokens, args.new_tokens)]
            if batch == varied_batch and not args.no_varied:
                varied = prompt_sets["varied"][:2 * batch]
                lengths = np.random.default_rng(2).integers(args.new_tokens // 16, args.new_tokens + 1, len(varied))
                scenarios.append(("varied", varied, lengths.tolist(), int(1.8 * args.new_tokens)))
            engine = None
            for scenario, prompts, max_new, expected_steps in scenarios:
                record = {"model": self.name, "batch": batch, "scenario": scenario, "config": best}
                estimate = self.estimate_s(batch, expected_steps)
                if elapsed() + estimate > args.budget_s:
                    record["error"] = (f"skipped: would end at ~{elapsed() + estimate:.0f}s, past the "
                                       f"{args.budget_s:.0f}s budget")
                else:
                    try:
                        if engine is None:
                            engine = self.engine(max_slots=batch, **best)
                            t0 = time.perf_counter()
                            engine.generate(self.params, prompts[:batch], 2, seed=0)   # compiles prefill + decode
                            record["warmup_s"] = time.perf_counter() - t0
                        record["attention"] = engine.decode_impl
                        record.update(sampler_run(
                            engine, self.params, prompts, max_new, seed=1, weight_bytes=self.weight_bytes,
                            kv_bytes_per_token=engine.geometry.bytes_per_token(engine.dtype),
                            roofline=self.roofline, peak_flops=RESULTS.get("peak_flops")))
                    except Exception as e:  # noqa: BLE001 - e.g. an OOM in this configuration only
                        record.update(error_record(e))
                RESULTS["runs"].append(record)
                print(f"[run] {self.name} batch {batch} {scenario}: "
                      f"{ {k: record.get(k) for k in ('decode_tok_s', 'step_ms', 'roofline_fraction', 'error')} } "
                      f"t={elapsed():.0f}s", flush=True)
                save()
            if engine is not None:
                engine.release_memory()
            del engine
            gc.collect()


def bf16_gap(bench: ModelBench, args, rng) -> dict:
    """Sampler log-probs vs the policy's forward recomputation in bf16 and in fp32 (same weights)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from kevin_jax.model import qwen2
    from kevin_jax.sampler import SamplerConfig, SamplerEngine

    model = bench.model
    count, new = (4, 16) if args.tiny else (16, 256)
    length = min(512, args.prompt_max)
    prompts = make_prompts(rng, count, 4, length // 2, length, model.config.vocab_size)
    config = SamplerConfig(temperature=0.9, max_slots=count, max_seq_len=length + new, page_size=args.page_size,
                           decode_steps=args.decode_steps, attention=bench.base.attention)
    results, _ = SamplerEngine(model, config).generate(bench.params, prompts, new, seed=3)
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
        lp = np.asarray(recompute(bench.params, jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(targets)))
        gaps = np.concatenate([np.asarray(r.logprobs) - lp[i, len(p) - 1:len(p) - 1 + len(r.tokens)]
                               for i, (p, r) in enumerate(zip(prompts, results))])
        out[name] = {"mean_abs": float(np.mean(np.abs(gaps))), "max_abs": float(np.max(np.abs(gaps))),
                     "p99_abs": float(np.quantile(np.abs(gaps), 0.99)), "mean": float(np.mean(gaps)),
                     "mean_ratio_minus_1": float(np.mean(np.exp(gaps)) - 1), "tokens": int(gaps.size)}
    return out


# ----------------------------------------------------------------------------------------------- N GPUs, one model
class TensorParallelBench:
    """The sampler tensor-parallel over --gpus GPUs (kevin_jax.sampler.layout), as training runs it: the parameters
    in the trainer's layout (bf16, FSDP over the GPUs), the engine's KV pool sized by its own rule, its weight copy.

    Decode is timed on frozen scenes (sampler_breakdown.step_part: the real decode call over random KV at the given
    cache lengths), at each --batches B with the longest mean context the pool holds for B slots (<= 16k; or
    --tp-contexts). Roofline of a step = (bf16 weights + live KV bytes) / (GPUs x the per-GPU copy bandwidth measured
    above). Where the time goes, at the middle batch:
      no KV reads      the same call with every cache at one page: weights, all-reduces, sampling, loop overhead
      one GPU's shard  a model of 1/T of the heads, MLP width and vocabulary on one GPU (the per-GPU work of the
                       tensor-parallel step without any collective), at the same B and cache lengths, with and
                       without KV reads: (TP step - shard step) = all-reduces and the other tensor-parallel costs
      attention, lm head + sampling   timed apart under the same mesh (sampler_breakdown)
      host             end to end (generate) ms per decode step - the scene's at the run's mean cache length
    End to end at the middle batch: distinct prompts of --prompt-min..max tokens, --e2e-new-tokens new tokens:
    decode tok/s, prefill tok/s (prompt tokens computed / prefill seconds)."""

    def __init__(self, name: str, args, per_gpu_tb_s: float | None):
        import jax

        from kevin_jax.model.shapes import named_config
        from kevin_jax.sampler import layout

        self.name, self.args = name, args
        self.config = named_config(name)
        self.gpus = jax.local_devices()[:args.gpus]
        if len(self.gpus) < args.gpus:
            raise RuntimeError(f"--gpus {args.gpus} but JAX sees {len(self.gpus)} device(s)")
        self.tensor = layout.tensor_parallel_size(self.config, len(self.gpus))
        self.node_tb_s = per_gpu_tb_s * len(self.gpus) if per_gpu_tb_s else None
        self.weight_bytes = self.config.matmul_param_count() * 2
        self.batches = sorted(int(b) for b in args.batches.split(","))
        self.middle = self.batches[len(self.batches) // 2]
        self.record = RESULTS.setdefault("tp", {}).setdefault(name, {})
        self.record.update(gpus=len(self.gpus), tensor=self.tensor, weight_gb=self.weight_bytes / 1e9,
                           per_gpu_tb_s=per_gpu_tb_s, node_tb_s=self.node_tb_s, steps={}, breakdown={})

    def _options(self):
        from kevin_jax.model import qwen2
        return qwen2.ModelOptions(dtype="bfloat16", param_dtype="bfloat16", remat="none")

    def _config(self, **changes):
        from kevin_jax.sampler import SamplerConfig
        args = self.args
        return SamplerConfig(temperature=0.9, max_slots=self.batches[-1], max_seq_len=args.tp_max_seq_len,
                             page_size=args.page_size, decode_steps=args.decode_steps,
                             kv_cache_fraction=args.kv_cache_fraction, prefill_tokens=args.tp_prefill_tokens,
                             prefill_chunk=args.tp_prefill_chunk,
                             attention="pallas" if jax_backend() == "gpu" else "xla").replace(**changes)

    def _skip(self, label: str, estimate_s: float, key: str = "") -> bool:
        """True (and the skip recorded under record[key], or the breakdown's label) when it would end past the
        budget."""
        if elapsed() + estimate_s > self.args.budget_s:
            skipped = {"error": f"skipped: would end past the {self.args.budget_s:.0f}s budget (t={elapsed():.0f}s)"}
            if key:
                self.record[key] = skipped
            else:
                self.record["breakdown"][label] = skipped
            save()
            return True
        return False

    def _lengths(self, batch: int, context: int, seed: int) -> np.ndarray:
        """Cache lengths uniform in [0.75, 1.25] x context (mean = context)."""
        rng = np.random.default_rng(seed)
        return rng.integers(int(0.75 * context), int(1.25 * context) + 1, batch).astype(np.int32)

    def contexts(self, pool_tokens: int) -> dict[int, int]:
        """Mean cache length per batch: the longest that the pool holds (each slot up to 1.25x the mean plus two
        decode calls' headroom), <= 16k, a multiple of 256; or --tp-contexts."""
        if self.args.tp_contexts:
            given = [int(c) for c in self.args.tp_contexts.split(",")]
            return dict(zip(self.batches, given + given[-1:] * len(self.batches)))
        headroom = 2 * self.args.decode_steps + self.args.page_size
        longest = int((self.args.tp_max_seq_len - headroom) / 1.25)          # the longest slot fits the table
        out = {}
        for b in self.batches:
            context = min(16384, pool_tokens // b - headroom, longest)
            step = 256 if context >= 256 else self.args.page_size
            out[b] = max(self.args.page_size, context // step * step)
        return out

    def run(self) -> None:
        import jax

        from kevin_jax import parallel
        from kevin_jax.model import qwen2
        from kevin_jax.sampler import SamplerEngine, layout
        from kevin_jax.sampler.engine import params_of

        args, record = self.args, self.record
        trainer_mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=-1), devices=self.gpus)
        t0 = time.perf_counter()
        model = qwen2.init_sharded(self.config, self._options(), trainer_mesh, seed=0)
        params = params_of(model)
        jax.block_until_ready(params)
        record["init_s"] = time.perf_counter() - t0
        engine = SamplerEngine(model, self._config())
        plan = engine.pool_plan
        record.update(sampling_mesh=layout.describe(engine.mesh), pool_pages=plan.pages_per_layer,
                      pool_gb_per_gpu=plan.bytes_per_device / 1e9, pool_tokens=plan.tokens, pool_rule=plan.rule,
                      pool_line=plan.describe(engine.config.max_slots, engine.config.max_seq_len,
                                              layout.describe(engine.mesh)),
                      trainer_params_gb_per_gpu=layout.bytes_per_device(params) / 1e9)
        print(f"[tp {self.name}] {record['pool_line']}", flush=True)
        t0 = time.perf_counter()
        weights = jax.block_until_ready(engine.weights(params))
        record["copy_s"] = time.perf_counter() - t0                 # includes the copy functions' compile
        record["copy_gb_per_gpu"] = layout.bytes_per_device(weights) / 1e9
        t0 = time.perf_counter()
        jax.block_until_ready(engine.weights(params))               # compiled: the copy alone
        record["copy_again_s"] = time.perf_counter() - t0
        record["memory_after_copy_gb"] = _memory_gb(self.gpus)
        save()
        print(f"[tp {self.name}] trainer params {record['trainer_params_gb_per_gpu']:.1f} GB/GPU, copy "
              f"{record['copy_gb_per_gpu']:.1f} GB/GPU in {record['copy_again_s']:.2f}s (first "
              f"{record['copy_s']:.1f}s), t={elapsed():.0f}s", flush=True)

        parts_wanted = set(args.tp_parts.split(","))
        contexts = self.contexts(plan.tokens)
        record["contexts"] = contexts
        if "decode" in parts_wanted:
            self.decode_sections(model, params, engine, weights, contexts)
        del weights
        gc.collect()

        # End to end: an engine's own pool and weight copy. Half the benchmark's pool (the middle batch's prompts
        # and new tokens need a third of it): at QwQ-32B on 4 x H100 the whole pool left the prefill no room (the
        # allocator failed 67 MiB requests until the stage's time ran out); on 4 x H200 after the decode sections,
        # 125 of 128 GB were still in use and the prefill's autotuning failed, so runs/kevin32b.sh runs it in a
        # process of its own (--tp-parts e2e).
        if "e2e" in parts_wanted and not self._skip("end to end", 60, key="e2e"):
            e2e_engine = SamplerEngine(model, self._config(max_slots=self.middle,
                                                           num_pages=max(1, plan.pages_per_layer // 2)))
            record["e2e"] = guarded(f"tp {self.name} end to end", self.end_to_end, e2e_engine, params)
            e2e_engine.release_memory()
            save()
        del engine, model, params
        gc.collect()
        if "shard" in parts_wanted and self.tensor > 1 and not self._skip("one GPU's shard", 90):
            self.shard_part(contexts[self.middle])

    def decode_sections(self, model, params, engine, weights, contexts) -> None:
        """The throughput table (decode steps at each batch on a frozen random pool) and the parts of a step."""
        import jax

        import sampler_breakdown as parts

        from kevin_jax.sampler import SamplerEngine, layout

        args, record = self.args, self.record
        plan = engine.pool_plan
        pool = parts.random_pool(engine.geometry, engine.dtype, 0, layout.sharding_of_pool(engine.mesh,
                                                                                          engine.tensor_axis))
        engines = {b: SamplerEngine(model, self._config(max_slots=b, num_pages=plan.pages_per_layer))
                   for b in self.batches}
        scene_of = lambda b, lengths: parts.make_scene(                                          # noqa: E731
            model, params, weights, engine.geometry, lengths, 2 * args.decode_steps, engine.dtype,
            engine=engines[b], pool=pool)

        def step(label: str, batch: int, lengths: np.ndarray) -> dict:
            scene = scene_of(batch, lengths)
            out = guarded(f"tp {self.name} {label}", parts.step_part, scene, engines[batch], self.node_tb_s,
                          self.weight_bytes)
            nonlocal pool
            pool = scene.pool                                      # donated through the decode call
            out.update(batch=batch, mean_context=float(np.mean(lengths)))
            if "ms_per_step" in out:
                out["decode_tok_s"] = batch / out["ms_per_step"] * 1e3
            return out

        order = [self.middle] + [b for b in self.batches if b != self.middle]
        for batch in order:
            if batch != self.middle and self._skip(f"step batch {batch}", 60):
                record["steps"][batch] = {"error": "skipped: time budget"}
                continue
            record["steps"][batch] = step(f"step batch {batch}", batch, self._lengths(batch, contexts[batch], 1))
            save()
            if batch == self.middle:
                breakdown = record["breakdown"]
                breakdown["no KV reads"] = step("no KV reads", batch, np.full(batch, args.page_size, np.int32))
                e2e_context = (args.prompt_min + args.prompt_max) // 2 + args.e2e_new_tokens // 2
                breakdown["at the end-to-end context"] = step(
                    "at the end-to-end context", batch, self._lengths(batch, e2e_context, 2))
                save()
        scene = scene_of(self.middle, self._lengths(self.middle, contexts[self.middle], 1))
        breakdown = record["breakdown"]
        for label, fn, fn_args, estimate in (
                ("attention (Pallas, TP)", parts.attention_part,
                 (scene, "pallas" if jax_backend() == "gpu" else "xla", engine.pallas_params, self.node_tb_s), 20),
                ("lm head + sampling (TP)", parts.sample_part, (scene, 0.9, self.node_tb_s, True), 15)):
            if not self._skip(label, estimate):
                breakdown[label] = guarded(f"tp {self.name} {label}", fn, *fn_args)
                breakdown[label].update(batch=self.middle, mean_context=float(np.mean(scene.lengths)))
                save()
        if args.tp_layers and not self._skip("layers, no attention (TP)", 60):
            breakdown["layers, no attention (TP)"] = guarded(
                f"tp {self.name} layers", parts.layers_part, scene, "unrolled", self.node_tb_s,
                self.config.num_hidden_layers * self.config.layer_param_count() * 2)
            save()
        del scene, pool
        for e in engines.values():
            e.release_memory()
        del engines
        gc.collect()
        jax.clear_caches()       # compiled scenes may hold device constants; nothing of these sections may stay

    def end_to_end(self, engine, params) -> dict:
        args = self.args
        batch = engine.config.max_slots
        prompts = make_prompts(np.random.default_rng(5), batch, 1, args.prompt_min, args.prompt_max,
                               self.config.vocab_size)
        t0 = time.perf_counter()
        engine.generate(params, prompts, 2, seed=0)                 # compiles the prefill shapes
        warmup = time.perf_counter() - t0
        _, stats = engine.generate(params, prompts, args.e2e_new_tokens, seed=1)
        step_ms = 1e3 * stats.decode_s / max(1, stats.decode_steps)
        return {"batch": batch, "pool_pages": engine.config.num_pages, "warmup_s": warmup,
                "prompt_tokens": stats.prompt_tokens,
                "prefill_tokens": stats.prefill_tokens, "prefill_s": stats.prefill_s,
                "prefill_tok_s": stats.prefill_tokens / max(stats.prefill_s, 1e-9),
                "decode_tok_s": stats.slot_steps_active / max(stats.decode_s, 1e-9), "step_ms": step_ms,
                "decode_steps": stats.decode_steps, "decode_calls": stats.decode_calls,
                "mean_context": stats.kv_tokens_read / max(1, stats.slot_steps_active),
                "total_s": stats.total_s, "peak_gb": _memory_gb(self.gpus, "peak_bytes_in_use")}

    def shard_part(self, context: int) -> None:
        """One GPU, one tensor-parallel shard of the model: the same per-GPU work without collectives."""
        import jax

        import sampler_breakdown as parts
        from kevin_jax import parallel
        from kevin_jax.model import qwen2
        from kevin_jax.sampler import SamplerEngine, layout
        from kevin_jax.sampler.engine import params_of

        c, t = self.config, self.tensor
        shard = c.replace(num_attention_heads=c.num_attention_heads // t,
                          num_key_value_heads=c.num_key_value_heads // t,
                          intermediate_size=c.intermediate_size // t, vocab_size=c.vocab_size // t)
        one = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=self.gpus[:1])
        model = qwen2.init_sharded(shard, self._options(), one, seed=0)
        params = params_of(model)
        batch = self.middle
        engine = SamplerEngine(model, self._config(max_slots=batch))
        weights = engine.weights(params)
        bytes_shard = shard.matmul_param_count() * 2
        breakdown = self.record["breakdown"]
        pool = None
        for label, lengths in (("one GPU's shard (no collectives)", self._lengths(batch, context, 1)),
                               ("one GPU's shard, no KV reads", np.full(batch, self.args.page_size, np.int32))):
            scene = parts.make_scene(model, params, weights, engine.geometry, lengths, 2 * self.args.decode_steps,
                                     engine.dtype, pool=pool)
            out = guarded(f"tp {self.name} {label}", parts.step_part, scene, engine,
                          self.node_tb_s / len(self.gpus) if self.node_tb_s else None, bytes_shard)
            pool = scene.pool
            out.update(batch=batch, mean_context=float(np.mean(lengths)), shard_config=dataclass_dict(shard))
            breakdown[label] = out
            save()
        del pool, weights, engine, model, params
        gc.collect()
        jax.clear_caches()


def jax_backend() -> str:
    import jax
    return jax.default_backend()


def dataclass_dict(obj) -> dict:
    import dataclasses
    return {k: v for k, v in dataclasses.asdict(obj).items() if isinstance(v, (int, float, str))}


def _memory_gb(devices, key: str = "bytes_in_use") -> list[float] | None:
    values = [(d.memory_stats() or {}).get(key) for d in devices]
    return [round(v / 1e9, 2) for v in values] if all(v is not None for v in values) else None


def tp_tables(results: dict) -> str:
    lines = []
    for name, r in results.get("tp", {}).items():
        if "error" in r and "steps" not in r:
            lines.append(f"{name} on {r.get('gpus')} GPUs: {r['error']}")
            continue
        node = r.get("node_tb_s")
        lines += [f"{name}, {r.get('gpus')} GPUs ({r.get('sampling_mesh')}): roofline = (bf16 weights "
                  f"{r.get('weight_gb', 0):.1f} GB + live KV) per step / {node or float('nan'):.2f} TB/s "
                  f"({r.get('gpus')} x {r.get('per_gpu_tb_s') or float('nan'):.2f} TB/s, torch copy_ measured on GPU "
                  f"0); trainer params {r.get('trainer_params_gb_per_gpu', 0):.1f} GB/GPU, weight copy "
                  f"{r.get('copy_gb_per_gpu', 0):.1f} GB/GPU in {r.get('copy_again_s', float('nan')):.2f} s; "
                  f"{r.get('pool_line', '')}"]
        if r.get("steps"):
            lines += ["", "| batch | mean context | decode tok/s | ms/step | GB/step (weights + KV) | roofline ms | "
                      "% of roofline | compile + first call s |", "|---|---|---|---|---|---|---|---|"]
        for batch, s in sorted(r.get("steps", {}).items(), key=lambda kv: int(kv[0])):
            if "error" in s:
                lines.append(f"| {batch} | | {s['error'][:100]} | | | | | |")
                continue
            ideal = s["bytes_per_step_gb"] / node if node else float("nan")
            lines.append(f"| {batch} | {s['mean_context']:.0f} | {s['decode_tok_s']:.0f} | {s['ms_per_step']:.2f} | "
                         f"{s['bytes_per_step_gb']:.1f} | {ideal:.2f} | "
                         f"{100 * (s.get('roofline_fraction') or float('nan')):.0f}% | {s.get('compile_s', 0):.0f} |")
        b = r.get("breakdown", {})
        if b:
            lines += ["", f"where a step's time goes (batch {next(iter(b.values()), {}).get('batch', '')}):", "",
                      "| part | ms/step | GB/step | % of its roofline |", "|---|---|---|---|"]
        for label, s in b.items():
            if "error" in s:
                lines.append(f"| {label} | {s['error'][:100]} | | |")
            else:
                roof = f"{100 * s['roofline_fraction']:.0f}%" if s.get("roofline_fraction") else ""
                lines.append(f"| {label} (context {s.get('mean_context', 0):.0f}) | {s['ms_per_step']:.2f} | "
                             f"{s.get('bytes_per_step_gb', 0):.1f} | {roof} |")
        steps, e2e = r.get("steps", {}), r.get("e2e", {})
        middle = next((s for s in b.values() if "batch" in s), {}).get("batch")
        full, no_kv = steps.get(middle, {}), b.get("no KV reads", {})
        shard, shard_nokv = b.get("one GPU's shard (no collectives)", {}), b.get("one GPU's shard, no KV reads", {})
        at_e2e = b.get("at the end-to-end context", {})
        derived = []
        if "ms_per_step" in full and "ms_per_step" in no_kv:
            derived.append(f"KV reads {full['ms_per_step'] - no_kv['ms_per_step']:.2f} ms")
        if "ms_per_step" in full and "ms_per_step" in shard:
            without = no_kv.get("ms_per_step", float("nan")) - shard_nokv.get("ms_per_step", float("nan"))
            derived.append(f"all-reduces and other tensor-parallel costs "
                           f"{full['ms_per_step'] - shard['ms_per_step']:.2f} ms (with KV), {without:.2f} ms (without)")
        if "ms_per_step" in shard_nokv:
            derived.append(f"weights + sampling on one GPU's shard {shard_nokv['ms_per_step']:.2f} ms")
        if "step_ms" in e2e and "ms_per_step" in at_e2e:
            derived.append(f"host and scheduling {e2e['step_ms'] - at_e2e['ms_per_step']:.2f} ms (end to end "
                           f"{e2e['step_ms']:.2f} - scene {at_e2e['ms_per_step']:.2f} at context "
                           f"{at_e2e.get('mean_context', 0):.0f})")
        if derived:
            lines += ["", "derived: " + "; ".join(derived)]
        if "decode_tok_s" in e2e:
            lines += ["", f"end to end (batch {e2e['batch']}, distinct prompts): decode {e2e['decode_tok_s']:.0f} "
                      f"tok/s ({e2e['step_ms']:.2f} ms/step, mean context {e2e['mean_context']:.0f}), prefill "
                      f"{e2e['prefill_tok_s']:.0f} tok/s ({e2e['prefill_tokens']} tokens in {e2e['prefill_s']:.1f} s), "
                      f"warm-up (prefill compiles) {e2e['warmup_s']:.0f} s, peak GB per GPU {e2e.get('peak_gb')}"]
        elif e2e:
            lines += ["", f"end to end: {e2e.get('error', '')[:200]}"]
        lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- main
def main(argv=None):
    global OUT_PATH
    args = parse_args(argv)
    OUT_PATH = args.out
    configs = args.configs.split(",")
    batches = sorted(int(b) for b in args.batches.split(","))
    from kevin_jax.model.shapes import named_config

    prompt_sets = {}
    for name in configs:
        vocab = named_config(name).vocab_size
        prompt_sets[name] = {b: make_prompts(np.random.default_rng(b), b, args.share, args.prompt_min,
                                             args.prompt_max, vocab) for b in batches}
        prompt_sets[name]["varied"] = make_prompts(np.random.default_rng(1), 2 * batches[-1], args.share,
                                                   args.prompt_min, args.prompt_max, vocab)

    # torch first (copy roofline, transformers): JAX takes most of the device memory once it starts.
    import bandwidth

    RESULTS["copy"]["torch"] = guarded("copy torch", bandwidth.torch_copy)
    save()
    if args.hf_new_tokens > 0:
        hf_batches = sorted(int(b) for b in args.hf_batches.split(","))
        for name in configs:
            for batch in hf_batches:
                record = guarded(f"hf {name} batch {batch}", hf_generate, name, batch,
                                 prompt_sets[name].get(batch) or make_prompts(
                                     np.random.default_rng(batch), batch, args.share, args.prompt_min,
                                     args.prompt_max, named_config(name).vocab_size), args.hf_new_tokens)
                record.update(model=name, batch=batch)
                RESULTS["hf"].append(record)
                save()
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass

    import jax

    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    RESULTS["env"] = {"jax": jax.__version__, "backend": jax.default_backend(),
                      "device": str(jax.local_devices()[0].device_kind), "python": platform.python_version(),
                      "args": vars(args)}
    RESULTS["copy"]["jax"] = guarded("copy jax", bandwidth.jax_elementwise,
                                     sizes_gib=(0.0625,) if args.tiny else (1.0, 2.0), old_method=not args.tiny)
    save()
    RESULTS["matmul"] = guarded("matmul jax", bandwidth.jax_matmul, size=512 if args.tiny else 8192)
    roofline = RESULTS["copy"]["torch"].get("tb_s") or RESULTS["copy"]["jax"].get("tb_s")
    RESULTS["roofline_tb_s"] = roofline
    RESULTS["peak_flops"] = RESULTS["matmul"].get("tflop_s", 0) * 1e12 or None
    import sampler_breakdown

    sampler_breakdown.PEAK_FLOPS = RESULTS["peak_flops"]
    print(f"[copy] roofline {roofline} TB/s (torch {RESULTS['copy']['torch'].get('tb_s')}, "
          f"jax {RESULTS['copy']['jax'].get('tb_s')})", flush=True)

    if args.gpus:
        for name in configs:
            try:
                TensorParallelBench(name, args, roofline).run()
            except Exception as e:  # noqa: BLE001 - recorded, the JSON and tables still come out
                RESULTS.setdefault("tp", {}).setdefault(name, {}).update(error_record(e))
                print(f"[tp {name}] {RESULTS['tp'][name]['error']}", flush=True)
            save()
        print(tables(RESULTS, one_gpu=False))
        print(tp_tables(RESULTS))
        print(f"wrote {args.out} ({elapsed():.0f}s)")
        return
    varied_at = dict(item.split("=") for item in args.varied_at.split(",") if item)
    first_order: list[str] = []
    for index, name in enumerate(configs):
        if elapsed() > args.budget_s:
            RESULTS["models"].setdefault(name, {})["error"] = "skipped: time budget"
            continue
        try:
            bench = ModelBench(name, args, roofline)
        except Exception as e:  # noqa: BLE001
            RESULTS["models"].setdefault(name, {}).update(error_record(e))
            print(f"[{name}] {RESULTS['models'][name]['error']}", flush=True)
            continue
        # The first model gets the whole sweep and every variant; later ones its 3 best blockings and the
        # first run's, and the layer-loop variant.
        blockings = args.sweep.split(",")
        if index > 0 and first_order:
            blockings = list(dict.fromkeys(first_order[:3] + ["first"]))
        try:
            best = bench.scene_sections(blockings, with_xla=index == 0,
                                        variants=["scan", "first"] if index == 0 else ["scan"])
            if index == 0:
                first_order = bench.record.get("sweep_order", [])
        except Exception as e:  # noqa: BLE001 - e.g. the scene does not fit: the table still runs
            bench.record["scene_error"] = error_record(e)
            print(f"[{name}] scene sections failed: {bench.record['scene_error']['error']}", flush=True)
            best = {}
        bench.record["chosen_config"] = best
        save()
        bench.runs(best, prompt_sets[name], int(varied_at.get(name, bench.largest)))
        del bench
        gc.collect()
    if configs and elapsed() < args.budget_s - 30 and "error" not in RESULTS["models"].get(configs[0], {}):
        bench = ModelBench(configs[0], args, roofline)
        RESULTS["bf16_gap"] = guarded(f"{configs[0]} bf16 gap", bf16_gap, bench, args, np.random.default_rng(0))
        del bench
        save()

    save()
    print(tables(RESULTS))
    print(f"wrote {args.out} ({elapsed():.0f}s)")


def tables(results: dict, one_gpu: bool = True) -> str:
    roofline = results.get("roofline_tb_s")
    copy = results.get("copy", {})
    jax_copy = copy.get("jax", {})
    matmul = results.get("matmul", {})
    lines = [f"bf16 matmul (jax, {matmul.get('size')}^3): {matmul.get('tflop_s') or float('nan'):.0f} TFLOP/s; "
             f"copy roofline: torch copy_ {copy.get('torch', {}).get('tb_s') or float('nan'):.2f} TB/s; "
             f"JAX elementwise {jax_copy.get('tb_s') or float('nan'):.2f} TB/s "
             f"({jax_copy.get('best', {}).get('dtype')}, {jax_copy.get('best', {}).get('gib')} GiB); "
             f"first run's method {jax_copy.get('old_method', {}).get('tb_s') or float('nan'):.2f} TB/s. "
             f"Roofline used: {roofline or float('nan'):.2f} TB/s" + ("" if one_gpu else " per GPU"), ""]
    if not one_gpu:
        return "\n".join(lines)
    for name, m in results.get("models", {}).items():
        scene = m.get("scene", {})
        lines += [f"{name}: breakdown of one decode step at batch {scene.get('batch')}, mean cache "
                  f"{scene.get('mean_cache_len', 0):.0f} tokens (KV {scene.get('kv_gb_per_step', 0):.1f} GB/step, "
                  f"weights {m.get('weight_gb', 0):.2f} GB); pool {m.get('pool_gb', 0):.0f} GB",
                  "", "| part | ms/step | GB/step (ideal bytes) | TB/s | % of roofline | compute-aware ideal ms | "
                  "% of compute-aware ideal |", "|---|---|---|---|---|---|---|"]
        for label, r in m.get("breakdown", {}).items():
            lines.append(_part_row(label, r))
        lines += ["", f"{name}: attention kernel sweep (one layer timed, x layers; best: {m.get('best_attention')})",
                  "", "| kernel | ms/step | TB/s | % of roofline | compile s |", "|---|---|---|---|---|"]
        for r in m.get("sweep", []):
            label = r.get("label") or r.get("impl")
            if "error" in r:
                lines.append(f"| {label} | {r['error'][:90]} | | | |")
            else:
                lines.append(f"| {label} | {r['ms_per_step']:.2f} | {r.get('tb_s', 0):.2f} | "
                             f"{100 * r.get('roofline_fraction', 0):.0f}% | {r.get('compile_s', 0):.1f} |")
        lines.append("")
    hf = {(r.get("model"), r.get("batch")): r for r in results.get("hf", [])}
    lines += [f"throughput (roofline {roofline or float('nan'):.2f} TB/s)", "",
              "| model | batch | scenario | decode tok/s | ms/step | GB/step (weights+KV) | % of roofline | "
              "% of compute-aware ideal | occupancy | prefill s | HF decode tok/s | x HF | peak GB | preemptions |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results.get("runs", []):
        if "error" in r:
            lines.append(f"| {r.get('model')} | {r.get('batch')} | {r.get('scenario', '')} | {r['error'][:90]} |"
                         + " |" * 10)
            continue
        h = hf.get((r["model"], r["batch"])) or max(
            (v for (m, _), v in hf.items() if m == r["model"] and v.get("decode_tok_s")),
            key=lambda v: v["batch"], default={})
        hf_rate = h.get("decode_tok_s")
        ratio = f"{r['decode_tok_s'] / hf_rate:.1f}" if hf_rate else "n/a"
        hf_text = (f"{hf_rate:.0f}" + (f" (batch {h['batch']})" if h.get("batch") != r["batch"] else "")
                   if hf_rate else str(h.get("error", "n/a"))[:40])
        roof = f"{100 * r['roofline_fraction']:.0f}%" if r.get("roofline_fraction") else "n/a"
        peak = f"{r['peak_device_gb']:.0f}" if r.get("peak_device_gb") else "n/a"
        aware = f"{100 * r['compute_aware_fraction']:.0f}%" if r.get("compute_aware_fraction") else "n/a"
        lines.append(f"| {r['model']} | {r['batch']} | {r['scenario']} | {r['decode_tok_s']:.0f} | "
                     f"{r['step_ms']:.2f} | {r['bytes_per_step_gb']:.2f} | {roof} | {aware} | "
                     f"{r['slot_occupancy']:.2f} | "
                     f"{r['prefill_s']:.1f} | {hf_text} | {ratio} | {peak} | {r.get('preemptions', 0)} |")
    gap = results.get("bf16_gap")
    if gap and "error" not in gap:
        lines += ["", "bf16 log-prob gap (sampler - recomputed token_logprobs, T=0.9): " + "; ".join(
            f"vs {k} forward: mean |d| {v['mean_abs']:.4f}, p99 {v['p99_abs']:.4f}, max {v['max_abs']:.4f}, "
            f"mean ratio-1 {v['mean_ratio_minus_1']:+.4f} over {v['tokens']} tokens"
            for k, v in gap.items() if isinstance(v, dict))]
    return "\n".join(lines)


def _part_row(label: str, r: dict) -> str:
    if "error" in r:
        return f"| {label} | {r['error'][:90]} | | | | | |"
    tb = f"{r['tb_s']:.2f}" if r.get("tb_s") else ""
    roof = f"{100 * r['roofline_fraction']:.0f}%" if r.get("roofline_fraction") else ""
    ideal = f"{r['ideal_ms_compute_aware']:.2f}" if r.get("ideal_ms_compute_aware") else ""
    aware = f"{100 * r['compute_aware_fraction']:.0f}%" if r.get("compute_aware_fraction") else ""
    return (f"| {label} | {r['ms_per_step']:.2f} | {r.get('bytes_per_step_gb', 0):.2f} | {tb} | {roof} | {ideal} | "
            f"{aware} |")


if __name__ == "__main__":
    sys.exit(main())
