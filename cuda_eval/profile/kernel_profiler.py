"""Profile feedback, the half that runs things (judge and worker processes only; imports torch): a few forwards under
the CUDA profiler, the device's copy bandwidth and limits, the reference's FLOPs, cuobjdump on the candidate's build.
The data and the texts are kernel_profile.py's. Everything here runs after a verdict is complete, outside any timed
region; a failure is reported as a reason (the verdict never depends on it).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from typing import Any, Callable

import torch

from cuda_eval.profile import kernel_profile

# Captured at import, before any candidate code runs in a worker.
_cuda_synchronize = torch.cuda.synchronize
_cuda_sleep = getattr(torch.cuda, "_sleep", None)
_CudaEvent = torch.cuda.Event
_perf_counter_ns = time.perf_counter_ns
_json_load = json.load
MARKER_CYCLES = 1000           # a bracket kernel: well under a microsecond
GATE_MIN_MS, GATE_MAX_MS = 1.0, 100.0
CUOBJDUMP_TIMEOUT_S = 20.0
CUOBJDUMP_MAX_BYTES = 1 << 20


def forwards_for(forward_ms: float, target_ms: float = 5.0, most: int = 3) -> int:
    """How many forwards to profile: about `target_ms` of GPU time, 1 to `most`."""
    return int(max(1, min(most, round(target_ms / max(forward_ms, 1e-3)))))


def profile_forwards(call: Callable[[int], Any], forwards: int, *, device_type: str, flush_bytes: int = 0,
                     gate_cycles_per_ms: float | None = None, forward_ms: float = 0.0,
                     workdir: str | None = None) -> dict:
    """`call(i)` runs forward i; returns kernel_profile.parse_trace's raw side (CUDA) or the host times (CPU).

    CUDA: one warm-up call, then under torch.profiler (CUDA activity only) a gate (a spin kernel holding the current
    stream while the host queues everything, as the gated timing does), then per forward an L2 flush, a marker
    kernel, the forward, a marker kernel. The chrome trace is parsed from a file in `workdir`, then removed."""
    forwards = max(1, int(forwards))
    if device_type != "cuda":
        call(0)
        times = []
        for i in range(forwards):
            t0 = _perf_counter_ns()
            call(i)
            times.append((_perf_counter_ns() - t0) / 1e6)
        return {"forwards": forwards, "launches": 0, "host_ms": sorted(times)[len(times) // 2], "kernels": []}
    if _cuda_sleep is None:
        raise RuntimeError("torch.cuda._sleep is missing: no marker kernels")
    from torch.profiler import ProfilerActivity, profile
    scratch = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes else None
    call(0)
    _cuda_synchronize()
    gated = bool(gate_cycles_per_ms)
    gate_ms = min(GATE_MAX_MS, max(GATE_MIN_MS, 4.0 * forwards * max(forward_ms, 0.05)))
    held = None
    with profile(activities=[ProfilerActivity.CUDA], record_shapes=False) as prof:
        if gated:
            _cuda_sleep(int(gate_ms * gate_cycles_per_ms))
            gate_done = _CudaEvent()
            gate_done.record()
        for i in range(forwards):
            if scratch is not None:
                scratch.zero_()
            _cuda_sleep(MARKER_CYCLES)
            call(i)
            _cuda_sleep(MARKER_CYCLES)
        if gated:
            held = not gate_done.query()
        _cuda_synchronize()
    fd, path = tempfile.mkstemp(prefix="kernel_profile_", suffix=".json", dir=workdir or None)
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = _json_load(f)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    side = kernel_profile.parse_trace(events, forwards, gated)
    side["gate"] = {"ms": round(gate_ms, 3), "held": held} if gated else None
    del scratch
    return side


def copy_bandwidth(device_type: str, nbytes: int = 256 << 20, reps: int = 5) -> float | None:
    """GB/s of a device-to-device copy (bytes read + bytes written over the time), the best of `reps`; on CPU the
    same for a host copy (smaller)."""
    if device_type != "cuda":
        nbytes = min(nbytes, 64 << 20)
        a = torch.empty(nbytes, dtype=torch.uint8)
        b = torch.empty_like(a)
        b.copy_(a)
        best = min(_timed_host(lambda: b.copy_(a)) for _ in range(reps))
        return 2 * nbytes / best / 1e9 if best > 0 else None
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    _cuda_synchronize()
    best = None
    for _ in range(reps):
        start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        best = ms if best is None else min(best, ms)
    return 2 * nbytes / (best * 1e-3) / 1e9 if best else None


def tensor_core_peak(device_type: str, n: int = 8192, reps: int = 5) -> float | None:
    """FLOP/s of a dense bf16 matmul of n x n x n (cuBLAS on the tensor cores), the best of `reps`: the roofline's
    compute peak (judge/floor.py). None on the CPU."""
    if device_type != "cuda":
        return None
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    c = a @ b
    _cuda_synchronize()
    best = None
    for _ in range(reps):
        start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
        start.record()
        torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        best = ms if best is None else min(best, ms)
    del a, b, c
    return 2 * n ** 3 / (best * 1e-3) if best else None


def _timed_host(fn) -> float:
    t0 = _perf_counter_ns()
    fn()
    return (_perf_counter_ns() - t0) / 1e9


def device_limits(device_type: str) -> dict | None:
    """kernel_profile.DeviceLimits of GPU 0, from its properties where torch has them."""
    if device_type != "cuda":
        return None
    p = torch.cuda.get_device_properties(0)
    given = {"sm_count": getattr(p, "multi_processor_count", 0),
             "warp_size": getattr(p, "warp_size", 0),
             "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", 0),
             "max_threads_per_block": getattr(p, "max_threads_per_block", 0),
             "regs_per_sm": getattr(p, "regs_per_multiprocessor", 0),
             "smem_per_block": getattr(p, "shared_memory_per_block", 0),
             "smem_per_block_optin": getattr(p, "shared_memory_per_block_optin", 0),
             "smem_per_sm": getattr(p, "shared_memory_per_multiprocessor", 0)}
    return kernel_profile.DeviceLimits.for_capability(p.major, p.minor, **given).to_dict()


def count_flops(call: Callable[[], Any]) -> float | None:
    """FLOPs of one call's matmuls, convolutions and attention (torch.utils.flop_counter), None when none."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        call()
    total = counter.get_total_flops()
    return float(total) if total else None


def model_bytes(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


# --- cuobjdump (the candidate's worker only: the file is the candidate's) ------------------------------------
def start_cuobjdump(cuobjdump: str | None, so_paths: list[str]) -> subprocess.Popen | str:
    """`cuobjdump -res-usage` on the candidate's built extensions, started in the background (a reason string when
    it cannot start)."""
    paths = [p for p in so_paths if p and os.path.isfile(p)]
    if not cuobjdump:
        return "no cuobjdump found next to nvcc or on PATH"
    if not paths:
        return "no built extension to read"
    try:
        return subprocess.Popen([cuobjdump, "-res-usage", *paths], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, close_fds=True)
    except OSError as e:
        return f"cuobjdump did not start: {type(e).__name__}: {e}"


def finish_cuobjdump(proc: subprocess.Popen | str, capability: tuple[int, int]) -> tuple[dict, str | None]:
    """(resources by base name, None) or ({}, why not)."""
    if isinstance(proc, str):
        return {}, proc
    try:
        out, err = proc.communicate(timeout=CUOBJDUMP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {}, f"cuobjdump took over {CUOBJDUMP_TIMEOUT_S:.0f} s"
    if proc.returncode != 0:
        return {}, f"cuobjdump failed ({proc.returncode}): {err.decode('utf-8', 'replace')[-300:]}"
    text = out[:CUOBJDUMP_MAX_BYTES].decode("utf-8", "replace")
    res = kernel_profile.resource_usage(text, capability)
    return res, None if res else "cuobjdump found no kernel in the build"
