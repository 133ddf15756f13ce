"""Time the import of an HF checkpoint directory onto this node's devices, as the trainer does it.

    python scripts/write_hf_checkpoint.py --shape qwq_32b --out /ckpt/qwq32b-random           # 65.5 GB, once
    python benchmarks/load_checkpoint.py --checkpoint /ckpt/qwq32b-random --cold --out $OUT/load.json
    python benchmarks/load_checkpoint.py --checkpoint /tmp/tiny-ckpt --config configs/tiny_cpu.py   # CPU smoke run

The run config (default configs/kevin32b.py, with --config.model.hf_checkpoint set to --checkpoint) gives the mesh
(FSDP over every device) and the parameter dtype; the import is kevin_jax.model.hf.load_hf_params with exactly the
arguments policy_init.initial_params passes. --cold first evicts the shard files from the page cache
(posix_fadvise DONTNEED: what a fresh boot or a new download looks like; without it a checkpoint written just before
is read from memory). Prints one table row: checkpoint GB, devices, parameter dtype, seconds, GB/s, the host memory
the import held (its own count, and the process's anonymous RSS high-water mark sampled every 20 ms), and each
device's bytes in use after the import against its share of the parameters.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout


def _anon_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class _RssSampler(threading.Thread):
    def __init__(self, period_s: float = 0.02):
        super().__init__(daemon=True)
        self.period_s, self.peak, self._done = period_s, _anon_rss_bytes(), threading.Event()

    def run(self):
        while not self._done.wait(self.period_s):
            self.peak = max(self.peak, _anon_rss_bytes())

    def stop(self) -> int:
        self._done.set()
        self.join()
        return max(self.peak, _anon_rss_bytes())


def _evict_page_cache(paths) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)                                   # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _load_config(path: str, checkpoint: str):
    spec = importlib.util.spec_from_file_location("run_config_file", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.model.shape = ""
    config.model.hf_checkpoint = checkpoint
    return config


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="HF checkpoint directory")
    parser.add_argument("--config", default="configs/kevin32b.py", help="run config giving the mesh and dtypes")
    parser.add_argument("--param-dtype", default=None, help="override the config's model.param_dtype")
    parser.add_argument("--cold", action="store_true", help="evict the shard files from the page cache first")
    parser.add_argument("--repeats", type=int, default=1, help="imports in a row (the first one compiles)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)

    config = _load_config(args.config, os.path.abspath(args.checkpoint))
    if args.param_dtype:
        config.model.param_dtype = args.param_dtype
    import jax

    from kevin_jax import multihost, parallel
    from kevin_jax.model import hf
    from kevin_jax.run_config import parse_config

    spec = parse_config(config)
    parallel.initialize_distributed(spec.mesh)
    mesh, _ = multihost.build_meshes(spec.mesh)
    shards = sorted(glob.glob(os.path.join(args.checkpoint, "*.safetensors")))
    checkpoint_bytes = sum(os.path.getsize(p) for p in shards)
    rows = []
    for repeat in range(args.repeats):
        if args.cold:
            _evict_page_cache(shards)
        sampler = _RssSampler()
        rss_before = _anon_rss_bytes()
        sampler.start()
        start = time.perf_counter()
        _, state, stats = hf.load_hf_params(spec.model.hf_checkpoint, spec.model_options, mesh=mesh)
        seconds = time.perf_counter() - start
        rss_peak = sampler.stop()
        param_bytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state))
        in_use = []
        for device in jax.local_devices():
            memory = device.memory_stats() or {}
            in_use.append(memory.get("bytes_in_use", 0))
        rows.append({
            "checkpoint_GB": round(checkpoint_bytes / 1e9, 3), "devices": len(jax.devices()),
            "mesh": parallel.describe(mesh), "param_dtype": spec.model_options.param_dtype, "cold": args.cold,
            "repeat": repeat, "load_s": round(seconds, 2), "GB_per_s": round(stats.bytes_read / 1e9 / seconds, 3),
            "held_host_GB": round(stats.peak_host_bytes / 1e9, 2),
            "rss_anon_growth_GB": round((rss_peak - rss_before) / 1e9, 2),
            "params_per_device_GB": round(param_bytes / len(jax.devices()) / 1e9, 2),
            "device_in_use_GB": [round(b / 1e9, 2) for b in in_use]})
        del state
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
