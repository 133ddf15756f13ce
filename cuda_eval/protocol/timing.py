"""The timing protocols shared by reference and candidate (judge and worker processes only; imports torch).

`TimingConfig.method` (EvalConfig.timing_method) picks one; docs/EVALUATOR.md, "Timing", says what each measures:
- "gated" (default): the host queues a group of repetitions behind a spin kernel (the gate) on the current stream,
  each one an L2 flush (memset of twice the L2 size), a start event, the call, an end event; the gate then opens and
  the GPU runs the group back to back. The host's launch latency, and any delay of the host thread by a busy CPU,
  stay outside the measurement, which is the GPU's time from the first to the last work of the call on the current
  stream. If the host could not queue a group before the gate opened, the group is measured again behind a longer
  gate; a call that waits for the device itself (a synchronise, an .item()) cannot be queued ahead and is measured
  as it runs (meta says so). Work a candidate leaves on other streams is not in the measurement: the fork check and
  the kernel trace (worker/) flag it.
- "device_sync": per repetition flush, synchronise the whole device, start event, call, synchronise the whole device
  again, end event (work on any stream is inside, and so are the host's launch latency and its delays).
- "kernelbench": KernelBench's cuda_event protocol (src/kernelbench/timing.py at its main): 3 synchronised warm-up
  calls, then per trial synchronise, a 256 MB L2-thrashing fill, start event, call, end event, synchronise; 100
  trials after one discarded; one input set. For numbers comparable with papers and leaderboards.
Warm-up reps are excluded; outside "kernelbench" the number of reps adapts to the call's duration (a quick estimate
first) within [min_reps, max_reps] and input sets are rotated between reps (no input stays hot in L2). The median is
reported. The device_sync timer is cuda_eval._native.CudaTimer (events recorded from C++) when the native module
provides it, else the same protocol with torch events. CPU mode uses the host monotonic clock for every method.

Every timer calls `fn(k)` with the logical call number k: 0..warmup-1 for warm-up calls, warmup..warmup+reps-1 for
timed ones. A group the gated timer measures again is called again with the same k's, so a caller that picks its
input set by k (time_rotating, KernelBench's loop in the worker) sees the same sets on every attempt, and the last
timed call is always k = warmup+reps-1 (docs/LOG.md, "timing under load on one H100": a retried group used to shift
the rotation and flag honest slow kernels).

`time_group` is one group of the judge-driven protocol that times every call of a candidate (harness.run_group;
docs/EVALUATOR.md, "Timing"): no warm-up, no retry of its own, the gate's length the judge's.
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from typing import Callable

import torch

Call = Callable[[int], None]  # fn(k), k the logical call number (module doc)

# Captured before candidate code can replace them, and held by every function that calls them as a keyword-only
# default (`_clock=_perf_counter_ns`), bound when the function is made: rebinding these module names changes no
# timer (the worker's identity snapshot flags a rebinding of either, private names and defaults included).
_perf_counter_ns = time.perf_counter_ns
_cuda_synchronize = torch.cuda.synchronize
_CudaEvent = torch.cuda.Event
_cuda_sleep = getattr(torch.cuda, "_sleep", None)
METHODS = ("gated", "device_sync", "kernelbench")
GATE_GROUP = 32           # reps queued behind one gate (a stream's launch queue holds ~1000 entries)
GATE_START_MS = 1.0
GATE_MAX_MS = 250.0
KERNELBENCH_WARMUP, KERNELBENCH_TRIALS, KERNELBENCH_L2_BYTES = 3, 100, 256 << 20


@dataclasses.dataclass(frozen=True)
class TimingConfig:
    target_s: float = 0.25      # aim for about this much timed work per model (reps adapt to the call's duration)
    warmup_s: float = 0.03      # and about this much warm-up
    min_reps: int = 20
    max_reps: int = 200
    min_warmup: int = 3
    max_warmup: int = 50
    method: str = "gated"

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"timing method {self.method!r}: expected one of {METHODS}")

    def plan(self, estimate_ms: float) -> tuple[int, int]:
        """(warmup, reps) for a call of about `estimate_ms`."""
        if self.method == "kernelbench":
            return KERNELBENCH_WARMUP, KERNELBENCH_TRIALS
        estimate_ms = max(estimate_ms, 1e-3)
        reps = int(min(self.max_reps, max(self.min_reps, round(self.target_s * 1e3 / estimate_ms))))
        warmup = int(min(self.max_warmup, max(self.min_warmup, round(self.warmup_s * 1e3 / estimate_ms))))
        return warmup, reps


def stats(times_ms: list[float]) -> dict:
    return {"median_ms": statistics.median(times_ms), "mean_ms": statistics.fmean(times_ms),
            "std_ms": statistics.pstdev(times_ms) if len(times_ms) > 1 else 0.0, "min_ms": min(times_ms),
            "n": len(times_ms)}


class HostTimer:
    """CPU mode: the host clock around each call (no L2 flush: CPU caches are not ours to flush)."""
    name = "host_clock"

    def time(self, fn: Call, *, warmup: int, reps: int, l2_flush_bytes: int = 0,
             sync_device: bool = True, stream: int = 0, _clock=_perf_counter_ns) -> list[float]:
        for k in range(warmup):
            fn(k)
        out = []
        for k in range(warmup, warmup + reps):
            t0 = _clock()
            fn(k)
            out.append((_clock() - t0) / 1e6)
        return out


def _warm_up(fn: Call, warmup: int, scratch: torch.Tensor | None,
             l2_flush_bytes: int, *, _sync=_cuda_synchronize) -> torch.Tensor | None:
    """The flush buffer (grown to l2_flush_bytes), after `warmup` calls of fn and a synchronise."""
    if l2_flush_bytes and (scratch is None or scratch.numel() < l2_flush_bytes):
        scratch = torch.empty(l2_flush_bytes, dtype=torch.uint8, device="cuda")
    for k in range(warmup):
        fn(k)
    _sync()
    return scratch


class TorchEventTimer:
    """The CUDA protocol with torch.cuda.Event, for when the native CudaTimer is unavailable."""
    name = "torch_events"
    fallback_reason = ""

    def __init__(self):
        self._scratch: torch.Tensor | None = None

    def time(self, fn: Call, *, warmup: int, reps: int, l2_flush_bytes: int,
             sync_device: bool = True, stream: int = 0, _sync=_cuda_synchronize,
             _event=_CudaEvent) -> list[float]:
        self._scratch = _warm_up(fn, warmup, self._scratch, l2_flush_bytes)
        out = []
        for k in range(warmup, warmup + reps):
            if self._scratch is not None:
                self._scratch.zero_()
            _sync()
            start, end = _event(enable_timing=True), _event(enable_timing=True)
            start.record()
            fn(k)
            if sync_device:
                _sync()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return out


class NativeTimer:
    """cuda_eval._native.CudaTimer: events recorded from C++ around fn, GIL released while waiting."""
    name = "native_cuda_timer"

    def __init__(self, native):
        self._native = native

    def time(self, fn: Call, *, warmup: int, reps: int, l2_flush_bytes: int,
             sync_device: bool = True, stream: int = 0) -> list[float]:
        calls = iter(range(warmup + reps))  # the C++ loop calls fn() once per k, in order, never again
        return list(self._native.time(lambda: fn(next(calls)), warmup=warmup, reps=reps, l2_flush_bytes=l2_flush_bytes,
                                      sync_device=sync_device, stream=stream))


class GatedTimer:
    """The "gated" protocol (module doc). `meta` describes the last call of time()."""
    name = "gated_events"

    def __init__(self, cycles_per_ms: float):
        self.cycles_per_ms = float(cycles_per_ms)
        self._scratch: torch.Tensor | None = None
        self.meta: dict = {}
        # flush(buffer) -> bool: zeroes the flush buffer with a kernel of our own (device_kernels), so that the kernel
        # trace knows the flush by this process's name for it; set by harness.Device before any candidate code runs
        self.flush = None

    def time(self, fn: Call, *, warmup: int, reps: int, l2_flush_bytes: int,
             sync_device: bool = True, stream: int = 0, _spin=_cuda_sleep) -> list[float]:
        self._scratch = _warm_up(fn, warmup, self._scratch, l2_flush_bytes)
        out: list[float] = []
        gate_ms, retries, waits_for_device, max_host_ms = GATE_START_MS, 0, False, 0.0
        while len(out) < reps:
            n = min(GATE_GROUP, reps - len(out))
            _spin(int(gate_ms * self.cycles_per_ms))
            first = warmup + len(out)  # a retried group repeats its k's (module doc)
            pairs, host_ms, held = self._calls_behind_gate(fn, range(first, first + n))
            max_host_ms = max(max_host_ms, host_ms)
            if not held and not waits_for_device:
                # A slow host (long calls, a busy CPU) gets a gate of twice its queueing time. If the queueing then
                # grows with the gate, the call itself waits for the device: it cannot be queued ahead.
                if (retries and host_ms >= 0.9 * gate_ms) or gate_ms >= GATE_MAX_MS:
                    waits_for_device = True
                else:
                    retries += 1
                    gate_ms = min(GATE_MAX_MS, max(2.0 * gate_ms, 2.0 * host_ms))
                    continue  # measured again behind a longer gate
            out += [s.elapsed_time(e) for s, e in pairs]
        self.meta = {"gate_ms": round(gate_ms, 3), "retries": retries, "host_ms_per_group": round(max_host_ms, 3),
                     "waits_for_device": waits_for_device}
        return out

    def reserve(self, l2_flush_bytes: int) -> None:
        """The flush buffer, now: made at start-up, it cannot take the freed memory a trial poisons (made at the
        first group, it took the poisoned block, and an output never written got fresh zeroed memory)."""
        if l2_flush_bytes and (self._scratch is None or self._scratch.numel() < l2_flush_bytes):
            self._scratch = torch.empty(l2_flush_bytes, dtype=torch.uint8, device="cuda")

    def time_group(self, fn: Call, n: int, *, gate_ms: float, l2_flush_bytes: int,
                   gate=None, _spin=_cuda_sleep) -> tuple[list[float], dict]:
        """One group behind a gate of `gate_ms` (the caller's, never lengthened here): the same per-call sequence as
        time(). `held` says whether the host had queued the whole group before the gate opened."""
        self.reserve(l2_flush_bytes)
        if gate is None or not gate(gate_ms):
            _spin(int(gate_ms * self.cycles_per_ms))
        pairs, host_ms, held = self._calls_behind_gate(fn, range(n))
        return [s.elapsed_time(e) for s, e in pairs], {"held": held, "host_ms": round(host_ms, 3),
                                                       "gate_ms": round(gate_ms, 3)}

    def _calls_behind_gate(self, fn: Call, ks: range, *, _clock=_perf_counter_ns, _sync=_cuda_synchronize,
                           _event=_CudaEvent) -> tuple[list, float, bool]:
        """The per-call sequence of both protocols, queued behind a gate the caller has just launched: per call an
        L2 flush, a start event, fn(k), an end event. Returns (the event pairs, the host's milliseconds to queue
        them all, whether the gate still held when it had), the device synchronised."""
        gate_open = _event()
        gate_open.record()
        t0 = _clock()
        pairs = []
        for k in ks:
            if self._scratch is not None and (self.flush is None or not self.flush(self._scratch)):
                self._scratch.zero_()
            start, end = _event(enable_timing=True), _event(enable_timing=True)
            start.record()
            fn(k)
            end.record()
            pairs.append((start, end))
        if self.flush is not None and self._scratch is not None:
            self.flush(self._scratch[:4])   # closes the last call in the kernel trace as the flushes close the others
        host_ms = (_clock() - t0) / 1e6
        held = not gate_open.query()
        _sync()
        return pairs, host_ms, held


def time_group(timer, fn: Call, n: int, *, l2_flush_bytes: int, gate_ms: float = 0.0, gate=None,
               marker=None) -> tuple[list[float], dict]:
    """One group of the judge-driven protocol (docs/EVALUATOR.md, "Timing"): calls fn(0..n-1), each timed by `timer`'s
    method, no warm-up, no retry: the judge decides the gate's length and whether a group is measured again.
    Returns (times in ms, meta: held, host_ms, gate_ms). `gate(ms)` holds the stream for that wall time (False where
    it cannot; the gated timer then spins torch.cuda._sleep); `marker()` puts one marker kernel on the stream before
    the group, where there is no gate (the kernel trace finds each group's calls between it and the digests)."""
    if isinstance(timer, GatedTimer):
        return timer.time_group(fn, n, gate_ms=gate_ms, l2_flush_bytes=l2_flush_bytes, gate=gate)
    if marker is not None:
        marker()
    times = list(timer.time(fn, warmup=0, reps=n, l2_flush_bytes=l2_flush_bytes, sync_device=True))
    return times, {"held": True, "host_ms": 0.0, "gate_ms": 0.0}


class KernelBenchTimer:
    """KernelBench's cuda_event protocol (module doc); `reps` trials after one discarded."""
    name = "kernelbench_cuda_event"

    def __init__(self):
        self._thrash: torch.Tensor | None = None

    def time(self, fn: Call, *, warmup: int, reps: int, l2_flush_bytes: int = 0,
             sync_device: bool = True, stream: int = 0, _sync=_cuda_synchronize,
             _event=_CudaEvent) -> list[float]:
        if self._thrash is None:
            self._thrash = torch.empty(KERNELBENCH_L2_BYTES // 8, dtype=torch.int64, device="cuda")
        for k in range(warmup):
            fn(k)
            _sync()
        out = []
        for trial in range(reps + 1):
            _sync()
            start, end = _event(enable_timing=True), _event(enable_timing=True)
            self._thrash.fill_(42)
            start.record()
            fn(warmup + max(trial - 1, 0))  # the discarded trial repeats the first timed k
            end.record()
            _sync()
            if trial:
                out.append(start.elapsed_time(end))
        return out


def make_timer(device_type: str):
    """The host clock (CPU mode), else the native CUDA timer if it loads and runs here, else TorchEventTimer (its
    `fallback_reason` says why)."""
    if device_type != "cuda":
        return HostTimer()
    try:
        from cuda_eval import _native
        native = NativeTimer(_native.CudaTimer(None))
        native.time(lambda _k: None, warmup=1, reps=1, l2_flush_bytes=0)  # loads libcudart now, fails here if it can't
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


def timer_for(method: str, device_type: str, sync_timer, gate_cycles_per_ms: float | None):
    """The timer of `method` on this device: `sync_timer` is the device_sync one (make_timer). Without a gate
    (no torch.cuda._sleep) "gated" falls back to device_sync; the timer's name says which ran."""
    if device_type != "cuda" or method == "device_sync":
        return sync_timer
    if method == "kernelbench":
        return KernelBenchTimer()
    if gate_cycles_per_ms and _cuda_sleep is not None:
        return GatedTimer(gate_cycles_per_ms)
    return sync_timer


def time_rotating(call: Callable[[int], None], n_sets: int, *, timer, device_type: str,
                  config: TimingConfig) -> dict:
    """Time `call(i)` (the model on input set i = k mod n_sets for the k-th call) with `timer`; returns stats +
    reps/warmup/n_sets."""

    def fn(k: int) -> None:
        call(k % n_sets)

    flush = l2_flush_bytes(device_type)
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection inside a timed rep would be noise
    try:
        estimate = 0.0
        if config.method != "kernelbench":
            estimate = statistics.median(timer.time(fn, warmup=1, reps=3, l2_flush_bytes=flush, sync_device=True))
        warmup, reps = config.plan(estimate)
        times = list(timer.time(fn, warmup=warmup, reps=reps, l2_flush_bytes=flush, sync_device=True))
    finally:
        if gc_was_enabled:
            gc.enable()
    out = stats(times)
    out.update(reps=reps, warmup=warmup, input_sets=n_sets, timer=timer_name(timer))
    if getattr(timer, "meta", None):
        out["gate"] = dict(timer.meta)
    return out
