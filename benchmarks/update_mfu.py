"""The RL update's gradient MFU at Kevin's length mix, row layouts side by side; and their padding table.

    python benchmarks/update_mfu.py --padding-only                                   # any CPU: the padding table
    python benchmarks/update_mfu.py --config configs/kevin32b.py:h200x4 --out $OUT/update_mfu.json \\
        --set model.shape=qwq_32b                                                    # 4 GPUs: QwQ-32B's shapes
    python benchmarks/update_mfu.py --config configs/tiny_cpu.py --samples 24 --prompt 16,64 --response 32,192 \\
        --set rl.row_len_step=64 --set rl.pack=False --set rl.micro_batch_tokens=1024 --max-row-len 512   # CPU smoke

A batch of --samples samples (Kevin: 8 tasks x 16 trajectories x 4 turns = 512) with prompt and response lengths drawn
uniformly from --prompt and --response (default 1-4k and 2-16k tokens), random token ids, non-zero advantages and
Dr. GRPO weights, is laid out by kevin_jax.rl.batch in each layout:
  uniform   rl.pack=False, one row length for the whole batch (a power of two >= its longest sample, capped at the
            context): every row is as long as the longest sample needs
  bucketed  rl.pack=False with rl.row_len_step (the config's, or --step): a row length per micro-batch, samples of
            similar length together; one right-padded sample per row (cuDNN flash attention, causal)
  packed    rl.pack=True: several samples per row of the uniform length (first-fit decreasing); the attention of a
            packed row is the blockwise one over the full row x row grid ("chunked": no flash kernel, no causal skip)
The padding table (all layouts, and bucketed at several steps) needs no accelerator. With a model (not
--padding-only), each layout in --layouts runs the trainer's own gradient step (kevin_jax.rl.state.Updater.accumulate:
forward + backward of the policy-gradient loss, the config's remat, attention, mesh and gradient dtype; the weights in
the compute dtype where the optimiser state is offloaded, as the trainer holds them) on a measured part of its
micro-batches: for every distinct shape its first micro-batch untimed (the compile), then the next --per-shape ones
timed (the longest shapes first). MFU counts the real tokens' FLOPs only (kevin_jax.logs.FlopModel, as the trainer
logs perf/mfu_gradients): padding is waste. The whole batch's gradient time is projected from the measured rate:
each micro-batch not timed takes the median time of the timed ones of its shape (a micro-batch's time depends on its
shape, not on its tokens' values), or, for a shape whose budget ran out, the seconds per padded token of the nearest
timed row length. The optimiser step (clip + AdamW, host-streamed at 32B) is not part of it.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kevin_jax.rl import batch as rl_batch  # noqa: E402  (numpy only: the padding table needs no jax)
from kevin_jax.rl.config import RLConfig  # noqa: E402
from kevin_jax.rl.loss import aggregation_weights  # noqa: E402

log = logging.getLogger("update_mfu")
TAG = "[update benchmark] "


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "kevin32b.py") + ":h200x4",
                   help="a config file, optionally with get_config's argument after a colon (kevin32b.py:h200x4)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--prompt", default="1024,4096", help="prompt lengths: low,high (uniform, inclusive)")
    p.add_argument("--response", default="2048,16384", help="response lengths: low,high (uniform, inclusive)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", type=int, default=4, help="data-parallel devices of the padding table")
    p.add_argument("--max-row-len", type=int, default=40960, help="the context (cap of an automatic row length)")
    p.add_argument("--step", type=int, default=1024, help="bucketed row-length step where the config has none")
    p.add_argument("--padding-only", action="store_true", help="the padding table only (no model, no jax)")
    p.add_argument("--layouts", default="bucketed,uniform", help="layouts timed with the model, in this order")
    p.add_argument("--per-shape", type=int, default=1, help="micro-batches timed per shape (after its compile)")
    p.add_argument("--budget-s", type=float, default=1e9, help="no micro-batch starts after this many seconds")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def load_config(path: str, overrides: list[str]):
    path, _, argument = path.partition(":")
    spec = importlib.util.spec_from_file_location("bench_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(argument) if argument else module.get_config()
    for item in overrides:
        key, _, text = item.partition("=")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        node = config
        *parents, leaf = key.split(".")
        for name in parents:
            node = node[name]
        node[leaf] = value
    return config


def _range(text: str) -> tuple[int, int]:
    low, high = (int(x) for x in text.split(","))
    return low, high


def length_mix(n: int, prompt: tuple[int, int], response: tuple[int, int], seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return list(zip(rng.integers(prompt[0], prompt[1] + 1, n).tolist(),
                    rng.integers(response[0], response[1] + 1, n).tolist()))


def make_samples(mix, vocab: int, constant_length: int, seed: int) -> list[rl_batch.Sample]:
    """Random tokens, the sampler's log-probs made up (-0.5 .. -3), advantages ~ N(0, 1) (never 0)."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for p, r in mix:
        out.append(rl_batch.Sample(rng.integers(0, vocab, p).tolist(), rng.integers(0, vocab, r).tolist(),
                                   (-rng.uniform(0.5, 3.0, r)).tolist(), float(rng.normal()) or 0.5))
    for s, w in zip(out, aggregation_weights(np.array([r for _, r in mix]), "constant_length", constant_length)):
        s.weight = float(w)
    return out


def layout_config(rl: RLConfig, name: str, step: int) -> RLConfig:
    if name == "uniform":
        return dataclasses.replace(rl, pack=False, row_len_step=0)
    if name == "bucketed":
        return dataclasses.replace(rl, pack=False, row_len=0, row_len_step=rl.row_len_step or step)
    if name == "packed":
        return dataclasses.replace(rl, pack=True, row_len_step=0)
    raise ValueError(f"unknown layout {name!r} (uniform, bucketed, packed)")


def padding_row(name: str, lengths, rl: RLConfig, divisor: int, max_row_len: int) -> dict:
    layout, rows = rl_batch.plan_layout(lengths, rl, divisor, max_row_len)
    shapes = layout.micro_shapes()
    ideal = sum(n * n for n in lengths) / 2
    if rl.pack:     # the blockwise attention computes the whole row x row grid
        grid = sum(rows_ * length * length for rows_, length in shapes)
    else:           # cuDNN's causal kernel: the lower triangle of each padded row
        grid = sum(rows_ * length * length / 2 for rows_, length in shapes)
    return {"layout": name, "micro_batches": layout.num_micro, "shapes": len(set(shapes)),
            "row_lens": f"{min(s[1] for s in shapes)}-{max(s[1] for s in shapes)}",
            "real_mtok": sum(lengths) / 1e6, "padded_mtok": layout.padded_tokens / 1e6,
            "padding": 1 - sum(lengths) / layout.padded_tokens, "attention_grid_x": grid / ideal}


def padding_table(lengths, rl: RLConfig, divisor: int, max_row_len: int, step: int) -> list[dict]:
    rows = [padding_row("uniform (one row length)", lengths, layout_config(rl, "uniform", step), divisor,
                        max_row_len),
            padding_row(f"fixed rows of {max_row_len}", lengths,
                        dataclasses.replace(rl, pack=False, row_len=max_row_len, row_len_step=0), divisor, max_row_len),
            padding_row("packed (rl.pack=True)", lengths, layout_config(rl, "packed", step), divisor, max_row_len)]
    for s in sorted({x for x in (512, 1024, 2048, 4096) if x < max_row_len} | {rl.row_len_step or step}):
        rows.append(padding_row(f"bucketed, step {s}", lengths, dataclasses.replace(rl, pack=False, row_len_step=s),
                                divisor, max_row_len))
    return rows


def print_padding(rows: list[dict], n: int, devices: int, micro_tokens: int) -> None:
    print(f"{TAG}padding of {n} samples, {devices} data-parallel devices, {micro_tokens} tokens per micro-batch")
    print(f"{'layout':28s} {'micro':>5s} {'shapes':>6s} {'row lengths':>12s} {'real Mtok':>9s} {'padded':>8s} "
          f"{'padding':>8s} {'attn grid/ideal':>15s}")
    for r in rows:
        print(f"{r['layout']:28s} {r['micro_batches']:5d} {r['shapes']:6d} {r['row_lens']:>12s} "
              f"{r['real_mtok']:9.2f} {r['padded_mtok']:8.2f} {r['padding'] * 100:7.1f}% {r['attention_grid_x']:15.2f}")


# ------------------------------------------------------------------------------------------------ timed
def time_layout(name, samples, rl, spec, mesh, graphdef, params, flops, peak, per_shape, deadline, max_row_len):
    import jax
    import optax

    from kevin_jax.rl import state as rl_state

    divisor = mesh.shape["data"] * mesh.shape["fsdp"]
    updater = rl_state.Updater(graphdef, rl_state.make_optimizer(spec.optim, 1), optax.constant_schedule(0.0), rl,
                               mesh, spec.sampler.temperature, grad_dtype=rl_state.GRAD_DTYPES[spec.optim.grad_dtype])
    host, layout = rl_batch.micro_batches(samples, rl, divisor, max_row_len)
    shapes = layout.micro_shapes()
    seen: dict = {}
    picked = []
    for i, shape in enumerate(shapes):
        seen[shape] = seen.get(shape, 0) + 1
        if seen[shape] <= 1 + per_shape:
            picked.append(i)
    # real tokens of each micro-batch (segment ids > 0)
    real = [int((mb["segment_ids"] > 0).sum()) for mb in host]
    lengths_of = [[int(n) for n in (mb["segment_ids"] > 0).sum(axis=1) if n] if not rl.pack else
                  [int(c) for row in mb["segment_ids"] for c in np.bincount(row)[1:] if c] for mb in host]
    first_s, times, norm = {}, {}, float("nan")
    for i in picked:
        if time.perf_counter() > deadline:
            log.info("%s%s: time budget used after %d of %d picked micro-batches", TAG, name, len(times), len(picked))
            break
        mb = updater.device_batch(host[i])
        if shapes[i] not in first_s:          # its compile: untimed for the rate
            t0 = time.perf_counter()
            jax.block_until_ready(updater.accumulate(params, [mb])[0])
            first_s[shapes[i]] = time.perf_counter() - t0
            log.info("%s%s shape %s: compile and first run %.1f s", TAG, name, shapes[i], first_s[shapes[i]])
            continue
        t0 = time.perf_counter()
        grads, parts = updater.accumulate(params, [mb])
        jax.block_until_ready(grads)
        times[i] = time.perf_counter() - t0
        loss = float(parts[0]["loss"])
        if not np.isfinite(loss):
            raise FloatingPointError(f"{name}: loss {loss} in micro-batch {i}")
        norm = float(optax.global_norm(grads))
        log.info("%s%s micro-batch %d/%d %s: %.2f s, %d real tokens, MFU %.1f%%", TAG,
                 name, i + 1, len(host), shapes[i], times[i], real[i],
                 100 * _mfu(flops.train(lengths_of[i]), times[i], peak))
        del grads, parts, mb
    if not times:
        return {"layout": name, "error": "no micro-batch timed"}
    timed = sorted(times)
    timed_s = sum(times.values())
    timed_flops = sum(flops.train(lengths_of[i]) for i in timed)
    # projection: measured times, else the nearest timed row length's seconds per padded token
    per_shape_s, per_token = {}, {}
    for i in timed:
        rows, length = shapes[i]
        per_shape_s.setdefault(shapes[i], []).append(times[i])
        per_token.setdefault(length, []).append(times[i] / (rows * length))
    per_shape_s = {k: float(np.median(v)) for k, v in per_shape_s.items()}
    per_token = {k: float(np.median(v)) for k, v in per_token.items()}
    projected = 0.0
    for i, (rows, length) in enumerate(shapes):
        if (rows, length) in per_shape_s:
            projected += per_shape_s[(rows, length)]
        else:
            nearest = min(per_token, key=lambda k: abs(k - length))
            projected += per_token[nearest] * rows * length
    all_flops = sum(flops.train(x) for x in lengths_of)
    padding = 1 - sum(real) / layout.padded_tokens
    return {"layout": name, "micro_batches": len(host), "timed": len(timed), "shapes": len(set(shapes)),
            "padding": padding, "compile_s": sum(first_s.values()), "timed_s": timed_s,
            "timed_tokens_per_s": sum(real[i] for i in timed) / timed_s, "mfu": _mfu(timed_flops, timed_s, peak),
            "projected_s": projected, "projected_mfu": _mfu(all_flops, projected, peak), "grad_norm": norm}


_N_DEVICES = [1]


def _mfu(flops: float, seconds: float, peak) -> float:
    if not peak or seconds <= 0:
        return float("nan")
    return flops / (seconds * _N_DEVICES[0] * peak)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = load_config(args.config, args.set)
    rl = RLConfig(**config.rl)
    mix = length_mix(args.samples, _range(args.prompt), _range(args.response), args.seed)
    lengths = [p + r for p, r in mix]
    began = time.perf_counter()
    result = {"samples": args.samples, "prompt": args.prompt, "response": args.response, "seed": args.seed}
    table = padding_table(lengths, rl, args.devices, args.max_row_len, args.step)
    result["padding"] = table
    print_padding(table, args.samples, args.devices, rl.micro_batch_tokens)
    if args.padding_only:
        _save(args.out, result)
        return 0

    from cuda_eval.api import visible_gpu_count
    from kevin_jax.placement import GpuConfig, apply_gpu_placement
    apply_gpu_placement(GpuConfig(**config.gpu), config.eval.devices, visible_gpu_count())
    import jax
    from flax import nnx

    from kevin_jax import logs, multihost
    from kevin_jax.model import qwen2
    from kevin_jax.policy_init import architecture
    from kevin_jax.run_config import parse_config

    spec = parse_config(config)
    mesh, _ = multihost.build_meshes(spec.mesh)
    arch = architecture(spec)
    options = spec.model_options
    if spec.optim.offload != "none":      # the trainer's device weights are then in the compute dtype
        options = dataclasses.replace(options, param_dtype=spec.model.dtype)
    t0 = time.perf_counter()
    graphdef, params = nnx.split(qwen2.init_sharded(arch, options, mesh, seed=args.seed))
    jax.block_until_ready(params)
    init_s = time.perf_counter() - t0
    flops = logs.FlopModel.of(arch)
    peak = logs.peak_flops(jax.devices()[0].device_kind)
    _N_DEVICES[0] = jax.device_count()
    constant_length = rl.constant_length or _range(args.response)[1]
    samples = make_samples(mix, arch.vocab_size, constant_length, args.seed)
    log.info("%s%s: %.2fB parameters on %d %s, mesh %s, remat %s, attention %s; weights built in %.0f s", TAG,
             spec.model.shape or spec.model.hf_checkpoint, arch.param_count() / 1e9 if hasattr(arch, "param_count")
             else flops.matmul_params / 1e9, jax.device_count(), jax.devices()[0].device_kind, dict(mesh.shape),
             options.remat, options.attention, init_s)
    deadline = began + args.budget_s
    runs = []
    for name in [x.strip() for x in args.layouts.split(",") if x.strip()]:
        runs.append(time_layout(name, samples, layout_config(rl, name, args.step), spec, mesh, graphdef, params,
                                flops, peak, args.per_shape, deadline, args.max_row_len))
        result["timed"] = runs
        _save(args.out, result)
    print(f"{TAG}gradient step (forward + backward, no optimiser) of {args.samples} samples (prompts {args.prompt}, "
          f"responses {args.response}) on {jax.device_count()} x {jax.devices()[0].device_kind}, "
          f"{args.per_shape} timed micro-batch(es) per shape after its compile")
    print(f"{'layout':10s} {'micro':>5s} {'timed':>5s} {'shapes':>6s} {'padding':>8s} {'compile s':>9s} "
          f"{'timed s':>8s} {'tok/s':>9s} {'MFU':>6s} {'batch s (proj.)':>15s} {'MFU (proj.)':>11s} {'last |g|':>9s}")
    for r in runs:
        if "error" in r:
            print(f"{r['layout']:10s} {r['error']}")
            continue
        print(f"{r['layout']:10s} {r['micro_batches']:5d} {r['timed']:5d} {r['shapes']:6d} {r['padding'] * 100:7.1f}% "
              f"{r['compile_s']:9.1f} {r['timed_s']:8.1f} {r['timed_tokens_per_s']:9.0f} {r['mfu'] * 100:5.1f}% "
              f"{r['projected_s']:15.1f} {r['projected_mfu'] * 100:10.1f}% {r['grad_norm']:9.3g}")
    result["elapsed_s"] = time.perf_counter() - began
    _save(args.out, result)
    return 0


def _save(path: str, result: dict) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1, default=float) + "\n")


if __name__ == "__main__":
    sys.exit(main())
