"""Share of padding in a config's warm-start batches, host side only (no model, no GPU): the batches as kevin_jax.sft
draws them (seeded, warm_start.batch_size examples), laid out as the update lays them out (rl.micro_batches), against
the same examples sorted by length into micro-batches with their own row lengths, and against length-bucketed batches
(warm_start.length_buckets, kevin_jax.sft.batch_order) laid out as the update lays them out.

    python benchmarks/warm_start_padding.py --config configs/one_gpu.py --batches 400 --length-buckets 8

Prints the examples' length percentiles, the mean padding share of each layout and the micro-batch shapes the sorted
layout would compile.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "one_gpu.py"))
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length-buckets", type=int, default=8, help="K of the length-bucketed layout's row")
    args = p.parse_args(argv)

    from kevin_jax import policy_init, sft
    from kevin_jax.env.prompts import PromptRenderer
    from kevin_jax.rl import batch as rl_batch
    from kevin_jax.run_config import parse_config
    from kevin_jax.tasks.kernelbench import load_tasks, resolve_split, select

    spec_file = importlib.util.spec_from_file_location("padding_config", args.config)
    module = importlib.util.module_from_spec(spec_file)
    spec_file.loader.exec_module(module)
    spec = parse_config(module.get_config())
    tokenizer = policy_init.run_tokenizer(spec)
    tasks = load_tasks(spec.tasks).tasks
    renderer = PromptRenderer(tokenizer, spec.env.max_prompt_tokens, spec.env.gpu_name, spec.env.one_shot)
    samples = sft.warm_start_examples(spec.warm_start, select(tasks, resolve_split(tasks, spec.tasks), "train"),
                                      renderer, tokenizer.eos_id, max_response_tokens=spec.longest_response)
    lengths = np.array([len(s) for s in samples])
    per_step = min(len(samples), spec.warm_start.batch_size)
    now, by_length, shapes, random_padded = [], [], set(), 0
    for batch in sft.batch_order(lengths.tolist(), per_step, args.batches, args.seed):     # as the warm start draws
        chosen = [samples[j] for j in batch]
        real = sum(len(s) for s in chosen)
        _, layout = rl_batch.micro_batches(chosen, spec.rl, 1)
        now.append(1 - real / layout.padded_tokens)
        random_padded += layout.padded_tokens
        ordered, padded = sorted(chosen, key=len), 0
        for k in range(0, len(ordered), layout.rows_per_micro):
            _, part = rl_batch.micro_batches(ordered[k:k + layout.rows_per_micro], spec.rl, 1)
            padded += part.padded_tokens
            shapes.add((part.rows_per_micro, part.row_len))
        by_length.append(1 - real / padded)
    bucketed, bucket_padded, bucket_shapes = [], 0, set()
    for batch in sft.batch_order(lengths.tolist(), spec.warm_start.batch_size, args.batches, args.seed,
                                 args.length_buckets):
        chosen = [samples[j] for j in batch]
        _, layout = rl_batch.micro_batches(chosen, spec.rl, 1)
        bucketed.append(1 - sum(len(s) for s in chosen) / layout.padded_tokens)
        bucket_padded += layout.padded_tokens
        bucket_shapes.add((layout.rows_per_micro, layout.row_len))
    p10, p50, p90 = np.percentile(lengths, [10, 50, 90]).astype(int)
    print(f"{Path(args.config).name}: {len(samples)} warm-start examples, tokens p10/p50/p90/max "
          f"{p10}/{p50}/{p90}/{lengths.max()}; {per_step} per batch, rl.pack={spec.rl.pack}, "
          f"rl.row_len={spec.rl.row_len or 'auto (next power of two)'}; {args.batches} batches\n")
    print("| layout | padding share of tokens | micro-batch shapes (rows, row length) |")
    print("|---|---|---|")
    print(f"| random batches (warm_start.length_buckets=0), as the update lays them out | {np.mean(now):.2f} | "
          "one per batch |")
    print(f"| random batches, each sorted by length into micro-batches with their own row lengths | "
          f"{np.mean(by_length):.2f} | {sorted(shapes)} |")
    print(f"| length-bucketed batches (warm_start.length_buckets={args.length_buckets}) | {np.mean(bucketed):.2f} | "
          f"{sorted(bucket_shapes)} |")
    print(f"\npadded tokens processed, length-bucketed / random batches: {bucket_padded / random_padded:.2f} "
          f"(the warm start's GPU time moves with these)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
