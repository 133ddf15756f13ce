"""One sampling round at full lengths: one sampler call per pipeline group (each ends with its longest response)
against the groups' requests streamed through one continuous batch (kevin_jax.sampler.engine.SamplerStream, what
the round loop does with env.stream_rounds), in tokens/s over the whole round against the decode roofline.

    python benchmarks/sampler_round.py --model qwq_32b --gpus 4 --modes streamed --out $OUT/round_streamed.json
    python benchmarks/sampler_round.py --model qwq_32b --gpus 4 --modes per_call --out $OUT/round_per_call.json
    python benchmarks/sampler_round.py --model qwen2.5_1.5b --gpus 1 --out $OUT/round_1gpu.json   # both modes
    python benchmarks/sampler_round.py --tiny --out /tmp/round.json                               # CPU smoke run

The round: --groups groups of --per-group sequences (Kevin: 8 tasks x 16 trajectories = 2 groups of 64), prompts of
--prompt-min..max tokens, --share sequences per distinct prompt (a task's trajectories share their prompt), response
lengths drawn uniform in [--new-min, --new-max] (8-16k: what QwQ-32B writes) and forced (no EOS: random weights),
--slots decode slots, temperature 0.9, random bf16 weights in the trainer's layout (FSDP over the GPUs) and the
sampler's own tensor-parallel copy and KV pool, as training runs it. Each group has its own seed, as in the round
loop, and both modes sample the same prompts, lengths and seeds, so they draw the same tokens (the table says how
many sequences match: on a GPU, prefill shapes that differ between the modes may flip a rare token).
A warm-up (untimed) compiles the prefill and decode shapes first.

Per mode: wall seconds for the round (prefill + decode + host), generated tokens, tokens/s, decode steps, slot
occupancy (slot-steps that produced a token / all slot-steps), the fraction of decode steps with every slot busy,
and two roofline fractions, with node bandwidth = GPUs x the per-GPU copy rate (--roofline-tb-s, or measured here
with benchmarks/bandwidth.py's JAX elementwise copy):
  round vs full batch   the time the round's tokens need at the roofline with every decode step full (tokens /
                        slots steps, each reading the bf16 weights once, plus the KV the tokens attend to) over the
                        measured wall: what straggling, prefill, host time and the kernels' own efficiency cost
  per step              bytes the decode steps actually read (weights per step + live KV) over decode seconds: the
                        kernels' efficiency alone (59-61% at B = 64 at QwQ-32B on 4 x H200, docs/LOG.md)
The JSON is rewritten after each mode and every --progress-s while one runs (a run cut short keeps its numbers).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))                   # sibling benchmark modules

import numpy as np  # noqa: E402

MODES = ("per_call", "streamed")
START = time.perf_counter()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--tiny", action="store_true", help="tiny model and shapes on whatever device (CPU smoke run)")
    p.add_argument("--model", default="qwq_32b", help="a named config (kevin_jax.model.shapes)")
    p.add_argument("--gpus", type=int, default=0, help="devices to sample on (0 = all local devices)")
    p.add_argument("--modes", default="per_call,streamed", help=f"which of {MODES}, in this order")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--per-group", type=int, default=64, help="sequences per group (one sampler call per_call)")
    p.add_argument("--slots", type=int, default=64, help="sampler.max_slots")
    p.add_argument("--prompt-min", type=int, default=1024)
    p.add_argument("--prompt-max", type=int, default=4096)
    p.add_argument("--share", type=int, default=16, help="sequences per distinct prompt")
    p.add_argument("--new-min", type=int, default=8192)
    p.add_argument("--new-max", type=int, default=16384)
    p.add_argument("--decode-steps", type=int, default=64, help="sampler.decode_steps")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--prefill-tokens", type=int, default=8192)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--kv-cache-fraction", type=float, default=0.9)
    p.add_argument("--roofline-tb-s", type=float, default=0.0, help="per-GPU copy rate, TB/s (0 = measure)")
    p.add_argument("--progress-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.model = "tiny"
        for name, value in (("groups", 2), ("per_group", 6), ("slots", 4), ("prompt_min", 8), ("prompt_max", 24),
                            ("share", 3), ("new_min", 6), ("new_max", 40), ("decode_steps", 4), ("page_size", 4),
                            ("prefill_tokens", 128), ("prefill_chunk", 32)):
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--modes: choose from {', '.join(MODES)}")
    args.modes = modes
    if args.new_min > args.new_max or args.prompt_min > args.prompt_max or min(args.new_min, args.prompt_min) < 1:
        p.error("need 1 <= --new-min <= --new-max and 1 <= --prompt-min <= --prompt-max")
    return args


def workload(args, vocab: int):
    """Per group: prompts (--share per distinct prompt), forced response lengths, and the group's seed."""
    rng = np.random.default_rng(args.seed)
    groups = []
    for g in range(args.groups):
        distinct = [rng.integers(0, vocab, int(rng.integers(args.prompt_min, args.prompt_max + 1))).tolist()
                    for _ in range(-(-args.per_group // args.share))]
        prompts = [distinct[i // args.share] for i in range(args.per_group)]
        lengths = rng.integers(args.new_min, args.new_max + 1, args.per_group).tolist()
        groups.append((prompts, lengths, 1000 + g))
    return groups


class Round:
    """Runs the round in one mode and measures it."""

    def __init__(self, args, engine, params, groups, node_tb_s, weight_bytes, record, save):
        self.args, self.engine, self.params, self.groups = args, engine, params, groups
        self.node_tb_s, self.weight_bytes = node_tb_s, weight_bytes
        self.kv_bytes_per_token = engine.geometry.bytes_per_token(engine.dtype)
        self.record, self.save = record, save

    def run(self, mode: str) -> tuple[dict, list]:
        from kevin_jax.sampler.engine import GenerateStats

        t0 = time.perf_counter()
        last = [t0]
        stats_list, results = [], []

        def progress(stats: GenerateStats, done: int) -> None:
            if time.perf_counter() - last[0] >= self.args.progress_s:
                last[0] = time.perf_counter()
                self.record[mode] = {"partial": True, **self.measure(stats_list + [stats],
                                                                     time.perf_counter() - t0)}
                self.save()
                print(f"[{mode}] {time.perf_counter() - t0:.0f}s: {done} requests done, "
                      f"{self.record[mode]['tok_s']:.0f} tok/s so far", flush=True)

        if mode == "per_call":
            for prompts, lengths, seed in self.groups:
                stream = self.engine.stream(self.params)
                request = stream.add(prompts, lengths, seed)
                while stream.busy:
                    stream.step()
                    progress(stream.stats, len(results))
                stream.close()
                stats_list.append(stream.stats)
                results.append(request.results())
        else:
            stream = self.engine.stream(self.params)
            requests = [stream.add(prompts, lengths, seed) for prompts, lengths, seed in self.groups]
            done = 0
            while stream.busy:
                done += len(stream.step())
                progress(stream.stats, done)
            stream.close()
            stats_list.append(stream.stats)
            results = [r.results() for r in requests]
        return self.measure(stats_list, time.perf_counter() - t0), results

    def measure(self, stats_list, wall_s: float) -> dict:
        slots = self.engine.config.max_slots
        tokens = sum(s.generated_tokens for s in stats_list)
        decode_tokens = sum(s.slot_steps_active for s in stats_list)
        steps = sum(s.decode_steps for s in stats_list)
        decode_s = sum(s.decode_s for s in stats_list)
        kv_bytes = sum(s.kv_tokens_read for s in stats_list) * self.kv_bytes_per_token
        live = np.concatenate([np.asarray(s.live_per_step, np.int64) for s in stats_list] or [np.zeros(0)])
        out = {"wall_s": wall_s, "generated_tokens": tokens, "tok_s": tokens / max(wall_s, 1e-9),
               "decode_tok_s": decode_tokens / max(decode_s, 1e-9), "decode_steps": steps, "decode_s": decode_s,
               "prefill_s": sum(s.prefill_s for s in stats_list),
               "prefill_tokens": sum(s.prefill_tokens for s in stats_list),
               "reused_prefix_tokens": sum(s.reused_prefix_tokens for s in stats_list),
               "preemptions": sum(s.preemptions for s in stats_list),
               "slot_occupancy": decode_tokens / max(1, steps * slots),
               "full_steps_fraction": float(np.mean(live == slots)) if live.size else 0.0,
               "live_percentiles": {str(q): float(np.percentile(live, q)) for q in (1, 10, 50)} if live.size else {},
               "kv_gb_read": kv_bytes / 1e9, "mean_context": sum(s.kv_tokens_read for s in stats_list)
               / max(1, decode_tokens)}
        if self.node_tb_s:
            ideal_s = (decode_tokens / slots * self.weight_bytes + kv_bytes) / (self.node_tb_s * 1e12)
            moved = steps * self.weight_bytes + kv_bytes
            out.update(ideal_full_batch_s=ideal_s, roofline_tok_s=decode_tokens / max(ideal_s, 1e-12),
                       round_vs_full_batch_roofline=ideal_s / max(wall_s, 1e-9),
                       per_step_roofline=moved / max(decode_s, 1e-9) / (self.node_tb_s * 1e12))
        return out


def main(argv=None) -> int:
    args = parse_args(argv)
    results: dict = {"args": vars(args), "modes": {}}

    def save() -> None:
        results["elapsed_s"] = time.perf_counter() - START
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)

    import jax

    import bandwidth
    from kevin_jax import parallel
    from kevin_jax.model import qwen2
    from kevin_jax.model.shapes import named_config
    from kevin_jax.sampler import SamplerConfig, SamplerEngine, layout
    from kevin_jax.sampler.engine import params_of

    devices = jax.local_devices()[:args.gpus] if args.gpus else jax.local_devices()
    if args.gpus and len(devices) < args.gpus:
        raise SystemExit(f"--gpus {args.gpus} but JAX sees {len(devices)} device(s)")
    config = named_config(args.model)
    results["env"] = {"jax": jax.__version__, "backend": jax.default_backend(), "device": devices[0].device_kind,
                      "devices": len(devices), "python": platform.python_version()}
    if args.roofline_tb_s:
        per_device = args.roofline_tb_s
    else:
        copy = bandwidth.jax_elementwise(sizes_gib=(0.0625,) if args.tiny else (1.0, 2.0), old_method=False)
        per_device = copy["tb_s"]
    node_tb_s = per_device * len(devices)
    results.update(per_device_tb_s=per_device, node_tb_s=node_tb_s)

    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=-1), devices=devices)
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="bfloat16", remat="none")
    t0 = time.perf_counter()
    model = qwen2.init_sharded(config, options, mesh, seed=0)
    params = params_of(model)
    jax.block_until_ready(params)
    results["init_s"] = time.perf_counter() - t0
    sampler_config = SamplerConfig(
        temperature=0.9, max_slots=args.slots, max_seq_len=args.prompt_max + args.new_max + args.page_size,
        page_size=args.page_size, decode_steps=args.decode_steps, kv_cache_fraction=args.kv_cache_fraction,
        prefill_tokens=args.prefill_tokens, prefill_chunk=args.prefill_chunk,
        attention="auto" if jax.default_backend() == "gpu" else "xla")
    engine = SamplerEngine(model, sampler_config, stop_ids=())         # no EOS: the lengths are forced
    plan = engine.pool_plan
    results["pool"] = plan.describe(args.slots, sampler_config.max_seq_len, layout.describe(engine.mesh))
    weight_bytes = config.matmul_param_count() * 2
    groups = workload(args, config.vocab_size)
    print(f"{args.model} on {len(devices)} x {devices[0].device_kind}: {results['pool']}; roofline "
          f"{node_tb_s:.2f} TB/s ({per_device:.2f} per device)", flush=True)

    t0 = time.perf_counter()               # warm-up: the prefill buckets and the decode call, not timed
    engine.generate(params, groups[0][0], 2 * args.decode_steps, seed=7)
    results["warmup_s"] = time.perf_counter() - t0
    save()

    bench = Round(args, engine, params, groups, node_tb_s, weight_bytes, results["modes"], save)
    tokens = {}
    for mode in args.modes:
        record, out = bench.run(mode)
        results["modes"][mode] = record
        tokens[mode] = [r.tokens for group in out for r in group]
        expected = [n for _, lengths, _ in groups for n in lengths]
        record["lengths_as_forced"] = [len(t) for t in tokens[mode]] == [min(n, sampler_config.max_seq_len)
                                                                          for n in expected]
        save()
        print(f"[{mode}] {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in record.items()})}",
              flush=True)
    if len(tokens) == 2:
        a, b = tokens.values()
        results["same_tokens"] = f"{sum(x == y for x, y in zip(a, b))}/{len(a)}"
    save()
    print_table(args, results, len(devices), devices[0].device_kind)
    return 0


def print_table(args, results: dict, gpus: int, device: str) -> None:
    modes = results["modes"]
    print(f"\none round of {args.groups} groups x {args.per_group} sequences, {args.slots} slots, prompts "
          f"{args.prompt_min}-{args.prompt_max}, responses {args.new_min}-{args.new_max} tokens, {args.model} on "
          f"{gpus} x {device}; roofline {results['node_tb_s']:.2f} TB/s")
    print("| mode | wall s | tokens | tok/s | roofline tok/s (full batch) | round vs full-batch roofline | "
          "per-step roofline | decode steps | slot occupancy | steps with every slot busy | prefill s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in modes.items():
        pct = lambda key: f"{100 * r[key]:.0f}%" if r.get(key) is not None else "-"          # noqa: E731
        print(f"| {mode} | {r['wall_s']:.1f} | {r['generated_tokens']} | {r['tok_s']:.0f} | "
              f"{r.get('roofline_tok_s', 0):.0f} | {pct('round_vs_full_batch_roofline')} | {pct('per_step_roofline')} "
              f"| {r['decode_steps']} | {pct('slot_occupancy')} | {pct('full_steps_fraction')} | "
              f"{r['prefill_s']:.1f} |")
    if "per_call" in modes and "streamed" in modes:
        print(f"streamed / per_call tokens/s: {modes['streamed']['tok_s'] / modes['per_call']['tok_s']:.2f}x; "
              f"same tokens: {results.get('same_tokens')}")


if __name__ == "__main__":
    sys.exit(main())
