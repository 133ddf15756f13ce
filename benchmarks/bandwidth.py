"""Device copy bandwidth, the roofline of memory-bound kernels: bytes read + bytes written per second.

    python benchmarks/bandwidth.py            # prints both measurements as JSON

torch: `y.copy_(x)` over 2 GiB of float32, 10 back-to-back copies timed with CUDA events (what
benchmarks/probe_machine.py measures: 4.25 TB/s on the H200). JAX: a jitted elementwise op `x * a + b` over 1-2 GiB,
its input donated so that it updates in place, 20 calls chained without waiting (dispatch overlaps the previous
call), one sync at the end. Each array stays under 2**31 elements: beyond that XLA indexes with 64 bits (the first
sampler benchmark timed `x + 1` over a 4 GiB bf16 array, 2**31 elements, one synchronised call at a time, and got
2.53 TB/s). The "old_method" entry re-measures exactly that, for the record.
"""
from __future__ import annotations

import json
import time

import numpy as np


def torch_copy(gib: float = 2.0, repeats: int = 10) -> dict:
    """torch device-to-device copy (read + write bytes), CUDA events; {} without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device for torch"}
    x = torch.empty(int(gib * 2**30) // 4, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / repeats
    moved = 2 * x.numel() * 4
    del x, y
    torch.cuda.empty_cache()
    return {"bytes_moved": moved, "seconds": seconds, "tb_s": moved / seconds / 1e12, "method": "torch copy_"}


def jax_elementwise(sizes_gib=(1.0, 2.0), dtypes=("float32", "bfloat16"), calls: int = 20,
                    old_method: bool = True) -> dict:
    """Best read+write rate of a donated, chained, jitted `x * a + b` over the given sizes and dtypes."""
    import jax
    import jax.numpy as jnp

    update = jax.jit(lambda x: x * jnp.asarray(1.0001, x.dtype) + jnp.asarray(1e-3, x.dtype), donate_argnums=0)
    rows = []
    for gib in sizes_gib:
        for name in dtypes:
            dtype = jnp.dtype(name)
            count = int(gib * 2**30) // dtype.itemsize
            x = jax.random.normal(jax.random.key(0), (count,), dtype)
            for _ in range(2):
                x = update(x)
            x.block_until_ready()
            t0 = time.perf_counter()
            for _ in range(calls):
                x = update(x)
            x.block_until_ready()
            seconds = (time.perf_counter() - t0) / calls
            moved = 2 * count * dtype.itemsize
            rows.append({"dtype": name, "gib": gib, "elements": count, "seconds": seconds,
                         "tb_s": moved / seconds / 1e12})
            del x
    best = max(rows, key=lambda r: r["tb_s"])
    out = {"tb_s": best["tb_s"], "best": best, "all": rows,
           "method": f"jitted donated x*a+b, {calls} chained calls, one sync"}
    if old_method:
        out["old_method"] = _first_benchmark_method()
    return out


def _first_benchmark_method() -> dict:
    """The first sampler benchmark's measurement (x + 1, 4 GiB bf16 = 2**31 elements, not donated, one synchronised
    call at a time): kept to show why it read low."""
    import jax
    import jax.numpy as jnp

    size = 4096 * 2**20
    x = jnp.ones((size // 2,), jnp.bfloat16)
    f = jax.jit(lambda a: a + 1)
    jax.block_until_ready(f(x))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    median = float(np.median(times))
    del x
    return {"bytes_moved": 2 * size, "seconds": median, "tb_s": 2 * size / median / 1e12}


def jax_matmul(size: int = 8192, calls: int = 10) -> dict:
    """bf16 x bf16 -> bf16 matmul rate of a square product (the compute roof of large-batch decode GEMMs)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.bfloat16)
    product = jax.jit(lambda a, b: a @ b)
    product(a, b).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(calls):
        out = product(a, b)
    out.block_until_ready()
    seconds = (time.perf_counter() - t0) / calls
    return {"size": size, "seconds": seconds, "tflop_s": 2 * size**3 / seconds / 1e12}


if __name__ == "__main__":
    print(json.dumps({"torch": torch_copy(), "jax": jax_elementwise(), "matmul": jax_matmul()}, indent=1))
