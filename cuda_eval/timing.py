"""The timing protocol shared by reference and candidate (worker processes only; imports torch).

Per repetition: flush L2 (memset of a scratch buffer of twice the L2 size, outside the timed region), synchronise
the whole device, record a start event, call the model on the next of several input sets (rotated, so no input stays
hot in L2 across reps), synchronise the whole device again (work hidden on side streams or left to background
threads by the candidate is inside the measurement), record the end event. Warm-up reps are excluded; the number of
reps adapts to the call's duration (a quick estimate first) within [min_reps, max_reps]; the median is reported.

The timer is cuda_eval._native.CudaTimer (events recorded from C++, libcudart dlopen'ed) when the native module
provides it; TorchEventTimer implements the same protocol with torch.cuda events otherwise. CPU mode uses the host
monotonic clock with the same warm-up/rep/rotation logic.
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Callable

import torch

_perf_counter_ns = time.perf_counter_ns  # captured before candidate code can replace them
_cuda_synchronize = torch.cuda.synchronize
_CudaEvent = torch.cuda.Event


@dataclasses.dataclass(frozen=True)
class TimingConfig:
    target_s: float = 0.25      # aim for about this much timed work per model (reps adapt to the call's duration)
    warmup_s: float = 0.03      # and about this much warm-up
    min_reps: int = 20
    max_reps: int = 200
    min_warmup: int = 3
    max_warmup: int = 50


def stats(times_ms: list[float]) -> dict:
    return {"median_ms": statistics.median(times_ms), "mean_ms": statistics.fmean(times_ms),
            "std_ms": statistics.pstdev(times_ms) if len(times_ms) > 1 else 0.0, "min_ms": min(times_ms),
            "n": len(times_ms)}


class HostTimer:
    """CPU mode: the host clock around each call (no L2 flush: CPU caches are not ours to flush)."""
    name = "host_clock"

    def time(self, fn: Callable[[], None], *, warmup: int, reps: int, l2_flush_bytes: int = 0,
             sync_device: bool = True, stream: int = 0) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(reps):
            t0 = _perf_counter_ns()
            fn()
            out.append((_perf_counter_ns() - t0) / 1e6)
        return out


class TorchEventTimer:
    """The CUDA protocol with torch.cuda.Event, for when the native CudaTimer is unavailable."""
    name = "torch_events"
    fallback_reason = ""

    def __init__(self):
        self._scratch: torch.Tensor | None = None

    def time(self, fn: Callable[[], None], *, warmup: int, reps: int, l2_flush_bytes: int,
             sync_device: bool = True, stream: int = 0) -> list[float]:
        if l2_flush_bytes and (self._scratch is None or self._scratch.numel() < l2_flush_bytes):
            self._scratch = torch.empty(l2_flush_bytes, dtype=torch.uint8, device="cuda")
        for _ in range(warmup):
            fn()
        _cuda_synchronize()
        out = []
        for _ in range(reps):
            if self._scratch is not None:
                self._scratch.zero_()
            _cuda_synchronize()
            start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
            start.record()
            fn()
            if sync_device:
                _cuda_synchronize()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return out


class NativeTimer:
    """cuda_eval._native.CudaTimer (part 1): events recorded from C++ around fn, GIL released while waiting."""
    name = "native_cuda_timer"

    def __init__(self, native):
        self._native = native

    def time(self, fn: Callable[[], None], *, warmup: int, reps: int, l2_flush_bytes: int,
             sync_device: bool = True, stream: int = 0) -> list[float]:
        return list(self._native.time(fn, warmup=warmup, reps=reps, l2_flush_bytes=l2_flush_bytes,
                                      sync_device=sync_device, stream=stream))


def make_timer(device_type: str):
    """The host clock (CPU mode), else the native CUDA timer if it loads and runs here, else TorchEventTimer (its
    `fallback_reason` says why)."""
    if device_type != "cuda":
        return HostTimer()
    try:
        from cuda_eval import _native
        native = NativeTimer(_native.CudaTimer(None))
        native.time(lambda: None, warmup=1, reps=1, l2_flush_bytes=0)  # loads libcudart now, fails here if it can't
        return native
    except (ImportError, AttributeError, TypeError, RuntimeError) as e:
        timer = TorchEventTimer()
        timer.fallback_reason = f"{type(e).__name__}: {e}"[:300]
        return timer


def timer_name(timer) -> str:
    return getattr(timer, "name", type(timer).__name__)


def l2_flush_bytes(device_type: str) -> int:
    if device_type != "cuda":
        return 0
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
    return max(2 * l2, 64 << 20)


def time_rotating(call: Callable[[int], None], n_sets: int, *, timer, device_type: str,
                  config: TimingConfig) -> dict:
    """Time `call(i)` (the model on input set i) with the protocol above; returns stats + reps/warmup/n_sets."""
    counter = [0]

    def fn():
        i = counter[0]
        counter[0] = (i + 1) % n_sets
        call(i)

    flush = l2_flush_bytes(device_type)
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection inside a timed rep would be noise
    try:
        estimate = statistics.median(timer.time(fn, warmup=1, reps=3, l2_flush_bytes=flush, sync_device=True))
        estimate = max(estimate, 1e-3)
        reps = int(min(config.max_reps, max(config.min_reps, round(config.target_s * 1e3 / estimate))))
        warmup = int(min(config.max_warmup, max(config.min_warmup, round(config.warmup_s * 1e3 / estimate))))
        times = list(timer.time(fn, warmup=warmup, reps=reps, l2_flush_bytes=flush, sync_device=True))
    finally:
        if gc_was_enabled:
            gc.enable()
    out = stats(times)
    out.update(reps=reps, warmup=warmup, input_sets=n_sets, timer=timer_name(timer))
    return out
