"""A JAX sampler generating without pause on one GPU: the load of a trainer whose policy shares the GPU with cuda_eval
(configs/one_gpu.py places both on GPU 0). Used by benchmarks/timing_under_load.py --with-sampler.

    python benchmarks/jax_generate_load.py --out $OUT/gen_load.json           # until SIGTERM/SIGINT
    python benchmarks/jax_generate_load.py --tiny --seconds 20 --out /tmp/gen_load.json   # CPU smoke run

Random bf16 weights of --config, --batch sequences per generate call, prompts of --prompt-min..--prompt-max tokens,
--new-tokens each, rounds back to back. JAX gets what a shared GPU gives it (kevin_jax.placement: a memory fraction,
no preallocation). With --yield-to-timing it holds cuda_eval's DeviceShare of the GPU around each device call, as
a trainer sharing its GPU with the evaluator does. Writes the rounds so far (tokens/s, time spent waiting for
timings) to --out after every round, and prints "READY" on stdout once the first round (compilation) is done, so
that a caller can start its measurement then.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file: the rounds so far")
    p.add_argument("--config", default="qwen2.5_1.5b", help="model shape (kevin_jax.model.shapes.NAMED_CONFIGS)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-min", type=int, default=512)
    p.add_argument("--prompt-max", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--memory-fraction", type=float, default=0.3, help="XLA_PYTHON_CLIENT_MEM_FRACTION")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0 = until signalled)")
    p.add_argument("--tiny", action="store_true", help="tiny model and shapes: a CPU smoke run")
    p.add_argument("--yield-to-timing", action="store_true", help="hold cuda_eval's DeviceShare of this GPU around "
                   "each device call (as a trainer sharing its GPU with the evaluator does): timing waits for at "
                   "most one call and never overlaps sampling")
    args = p.parse_args(argv)
    if args.tiny:
        args.config, args.batch, args.prompt_min, args.prompt_max, args.new_tokens = "tiny", 4, 16, 32, 16
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(args.memory_fraction))

    import jax
    import numpy as np

    from kevin_jax import parallel
    from kevin_jax.model import qwen2
    from kevin_jax.model.shapes import named_config
    from kevin_jax.sampler import SamplerConfig, SamplerEngine, kv_cache
    from kevin_jax.sampler.engine import params_of

    stop = {"now": False}

    def on_signal(*_):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    config = named_config(args.config)
    mesh = parallel.make_mesh(parallel.ParallelConfig(fsdp=1), devices=jax.local_devices()[:1])
    model = qwen2.init_sharded(config, qwen2.ModelOptions(dtype="bfloat16", param_dtype="bfloat16", remat="none"),
                               mesh, seed=0)
    params = params_of(model)
    max_seq_len = args.prompt_max + args.new_tokens
    page = 16
    pages = kv_cache.pages_for(args.batch * max_seq_len, page) + 1
    on_gpu = jax.default_backend() == "gpu"
    share = None
    if args.yield_to_timing:
        from cuda_eval.orchestrator.gpu_pool import DeviceShare
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if v.strip()] or ["0"]
        share = DeviceShare.for_gpu(visible[0])
    config_ = SamplerConfig(temperature=0.9, max_slots=args.batch, max_seq_len=max_seq_len, page_size=page,
                            num_pages=pages, decode_steps=32, attention="pallas" if on_gpu else "xla")
    engine = SamplerEngine(model, config_, device_guard=(lambda: share) if share is not None else None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    record = {"config": args.config, "batch": args.batch, "new_tokens": args.new_tokens,
              "device": str(jax.devices()[0]), "yield_to_timing": args.yield_to_timing,
              "rounds": []}
    t_start = time.monotonic()
    k = 0
    while not stop["now"]:
        prompts = [rng.integers(0, config.vocab_size, int(rng.integers(args.prompt_min, args.prompt_max + 1))).tolist()
                   for _ in range(args.batch)]
        t0 = time.monotonic()
        results, stats = engine.generate(params, prompts, args.new_tokens, seed=k)
        wall = time.monotonic() - t0
        record["rounds"].append({"round": k, "start_s": round(t0 - t_start, 3), "wall_s": round(wall, 3),
                                 "tokens": stats.generated_tokens,
                                 "tok_s": round(stats.generated_tokens / max(wall, 1e-9), 1),
                                 "waited_for_timing_s": round(share.waited_s, 3) if share else None})
        Path(args.out).write_text(json.dumps(record, indent=1))
        if k == 0:
            print("READY", flush=True)
        k += 1
        if args.seconds and time.monotonic() - t_start > args.seconds:
            break
    print(f"stopped after {k} rounds", flush=True)


if __name__ == "__main__":
    main()
