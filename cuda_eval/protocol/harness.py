"""What the judge and the candidate's worker share: the device, seeding, task loading, inputs, messages.

Both processes load the task and build inputs the same way from the same seeds, so the inputs a candidate sees are
the ones the judge computes the reference on; only outputs cross between them (channel.py, wire.py). Imports torch:
judge and worker processes only.
"""
from __future__ import annotations

import argparse
import builtins
import contextlib
import fcntl
import gc
import linecache
import os
import random
import sys
import time
import traceback
import types
from typing import Any

import torch

from cuda_eval.protocol import device_kernels, timing, tracing
from cuda_eval.protocol.tensors import tensors_in

# Captured before any candidate code runs (a candidate replacing them is flagged as monkeypatch; in the judge no
# candidate code ever runs).
_type = builtins.type
_monotonic = time.monotonic
_cuda_synchronize = torch.cuda.synchronize
_manual_seed = torch.manual_seed
_cuda_sleep = getattr(torch.cuda, "_sleep", None)
_CudaEvent = torch.cuda.Event
TASK_MODULE = "kernelbench_task"
CANDIDATE_MODULE = "kernelbench_candidate"
TASK_FILENAME = "<kernelbench-task>"   # the file names the task's and the candidate's code run under (tracebacks,
CANDIDATE_FILENAME = "<candidate>"     # and the worker's profile hook, which tells whose code is running)
MAX_ERROR_CHARS = 2500
CHANNEL_FD = 3  # the socket each judge / worker process gets from the pool (sandbox pass_fds)


class CandidateError(Exception):
    """The candidate failed (raised, crashed the CUDA context, returned garbage types): a verdict, not a bug."""


class ReferenceError_(Exception):
    """The reference program itself failed: the task is broken, not the candidate."""


_STARTED = time.monotonic()


def process_arguments(description: str) -> argparse.ArgumentParser:
    """The command line the pool starts a judge or a worker with."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device-type", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--channel-fd", type=int, default=CHANNEL_FD, help="the socket to the pool (or judge)")
    parser.add_argument("--device-lock-fd", type=int, default=None, help="a descriptor of the GPU's lock file "
                        "(flocked around CUDA initialisation and timing)")
    parser.add_argument("--device-intent-fd", type=int, default=None, help="the judge's: a descriptor of the "
                        "GPU's intent file (held while waiting for the lock, so that shared holders let it in)")
    return parser


def milestone(who: str, what: str) -> None:
    """Start-up milestones on stderr: the pool shows the stderr tail of a process that failed to start."""
    sys.stderr.write(f"[cuda_eval.{who} +{time.monotonic() - _STARTED:.2f}s] {what}\n")
    sys.stderr.flush()


def exec_module(source: str, name: str, filename: str) -> types.ModuleType:
    """Execute `source` as a real module (registered in sys.modules; tracebacks show its lines)."""
    module = types.ModuleType(name)
    module.__file__ = filename
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    sys.modules[name] = module
    code = compile(source, filename, "exec", dont_inherit=True)   # not this module's __future__ imports
    exec(code, module.__dict__)
    return module


def set_seed(seed: int) -> None:
    random.seed(seed)
    _manual_seed(seed)  # every device's generator
    try:
        import numpy as np
        np.random.seed(seed % (2 ** 32))
    except ImportError:
        pass


def format_exception(exc: BaseException, context: str) -> str:
    """`context: Type: message` plus the candidate's own frames (not ours, not torch's), trimmed."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename in (CANDIDATE_FILENAME, TASK_FILENAME)]
    message = str(exc).split("\nCUDA kernel errors might be asynchronously reported")[0]
    message = message.split("\nFor debugging consider passing CUDA_LAUNCH_BLOCKING")[0].strip()
    text = f"{context}: {type(exc).__name__}: {message}"
    if frames:
        text += "\n" + "".join(traceback.format_list(frames[-4:])).rstrip()
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 15] + "\n... (trimmed)"


def map_tree(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if _type(obj) in (list, tuple):
        return _type(obj)(map_tree(o, fn) for o in obj)
    return obj


def tree_nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(obj))


def dtype_signature(obj: Any) -> str:
    return ",".join(str(t.dtype).replace("torch.", "") for t in tensors_in(obj)) or "none"


def load_task(source: str) -> types.ModuleType:
    task = exec_module(source, TASK_MODULE, TASK_FILENAME)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(task, name):
            raise AttributeError(f"the task defines no {name}")
    return task


def make_inputs(task: types.ModuleType, device: "Device", seed: int) -> list:
    """get_inputs() under `seed`, created on the device when possible (fast for big inputs), dtypes kept."""
    set_seed(seed)
    try:
        with device.torch_device:
            inputs = task.get_inputs()
    except Exception:  # tasks that build inputs on the host explicitly (numpy, .cpu()) are generated there
        set_seed(seed)
        inputs = task.get_inputs()
    return map_tree(list(inputs), lambda t: t.to(device.torch_device))


def affine_inputs(inputs: list, affine: dict | None) -> list:
    """`inputs` with the leaves the judge named (affine["leaves"]: [top-level index, shift] of floating-point
    tensors) replaced by x * affine["scale"] + shift in their own dtype; the others, and everything when `affine` is
    None, as they are. The same arithmetic in the judge and the worker: both compute the same inputs."""
    if not affine:
        return inputs
    scale = float(affine["scale"])
    out = list(inputs)
    for i, shift in affine["leaves"]:
        t = out[i] if 0 <= i < len(out) else None
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            out[i] = torch.add(torch.mul(t, scale), float(shift))
    return out


def init_inputs(task: types.ModuleType, device: "Device", seed: int) -> list:
    set_seed(seed)
    values = list(task.get_init_inputs())
    return map_tree(values, lambda t: t.to(device.torch_device))


def trial_seed(seed: int, t: int) -> int:
    """Inputs of correctness trial t (the call itself runs after seed + 7: dropout and friends)."""
    return seed + 1 + 1000 * t


TIMING_SEED = 2000         # timing input set i: seed + TIMING_SEED + i


def run_group(device: "Device", call, n: int, *, method: str, gate_ms: float) -> tuple[list, list[float], dict]:
    """One group of calls under the judge-driven timing protocol (docs/EVALUATOR.md, "Timing"), the same code in the
    judge (its replay of the group with an empty forward) and in the worker (every call of the candidate, trials
    included): outs[k] = call(k) for k in 0..n-1, each timed by `method`'s timer behind a gate of `gate_ms` (the
    judge's choice), then the device synchronised. Returns (outs, times in ms, meta: held, host_ms, gate_ms)."""
    outs: list = [None] * n

    def fn(k: int) -> None:
        outs[k] = call(k)

    cuda = device.type == "cuda"
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a timed call would be noise
    try:
        times, meta = timing.time_group(device.timer_for(method), fn, n,
                                        l2_flush_bytes=timing.l2_flush_bytes(device.type), gate_ms=gate_ms,
                                        gate=device.kernels.gate if cuda else None,
                                        marker=(lambda: device.kernels.gate(0.0)) if cuda else None)
        device.sync()
    finally:
        if gc_was_enabled:
            gc.enable()
    return outs, times, meta


def _flock(fd: int, how: int, deadline: float | None, what: str) -> None:
    """flock, blocking; with a deadline (time.monotonic()), polled until then (TimeoutError naming `what`)."""
    if deadline is None:
        fcntl.flock(fd, how)
        return
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if _monotonic() > deadline:
                raise TimeoutError(f"{what} was not free in time") from None
            time.sleep(0.002)


# --- device state ---------------------------------------------------------------------------------------------
class Device:
    """The device of a judge or worker process. `lock_fd`: a descriptor of the file all processes of the same GPU
    lock (handed over by the pool): exclusive flock while one initialises CUDA (start-up) and while the judge times,
    so that a process starting up never disturbs a measurement (the kernel releases the lock if a process dies);
    `intent_fd` (the judge's) lets it past a trainer that shares the GPU. `checks`: the candidate's worker passes
    its checks' start-up (worker/dynamic_checks.StartUp: `host()`, `cuda(info, milestone)`), made ready here before
    any candidate code exists; the judge passes None (this module never imports the worker's code)."""

    def __init__(self, device_type: str, cpu_threads: int, lock_fd: int | None = None, *, who: str,
                 checks: Any, intent_fd: int | None = None):
        self.type = device_type
        self.lock_fd = lock_fd
        self.intent_fd = intent_fd
        self.who = who
        torch.set_grad_enabled(False)  # KernelBench evaluates under no_grad
        self._warm_up_host(checks)
        milestone(who, "host warm-up done; waiting for the device lock")
        with self.exclusive():
            milestone(who, "device lock held")
            self._init_device(device_type, cpu_threads, checks)
        # Our own kernels (the output digest, the time-based gate), before any candidate code exists: compiled by
        # NVRTC outside the device lock (CPU work), loaded and checked holding it.
        self.kernels = device_kernels.Kernels(device_type, hold=self.exclusive)
        self.info["own_kernels"] = self.kernels.backend
        gated = self.timer_for("gated") if device_type == "cuda" else None
        if isinstance(gated, timing.GatedTimer) and self.kernels.backend == "nvrtc":
            gated.flush = self.kernels.flush   # the flush, by this process's name for it (kernel trace)
        if self.kernels.fallback_reason:
            self.info["own_kernels_fallback_reason"] = self.kernels.fallback_reason
        milestone(who, f"own kernels: {self.kernels.backend}")

    @contextlib.contextmanager
    def exclusive(self, deadline: float | None = None):
        """The device lock; with a deadline (time.monotonic()), TimeoutError when it cannot be had by then (a
        candidate's worker may hold it to stall the judge: it gets its own timeout, not ours)."""
        fd = self.lock_fd
        if fd is None:
            yield
            return
        # A trainer sampling on the same GPU holds the lock shared (gpu_pool.DeviceShare), one device call at a
        # time. A polling waiter would almost never find it free (docs/LOG.md, "the GPU shared with a sampler":
        # 6-188 s against a 0.2 s holder), so the judge first takes the intent file, which the sharer checks
        # before each of its holds.
        if self.intent_fd is not None:
            _flock(self.intent_fd, fcntl.LOCK_EX, deadline, "the GPU's intent lock")
        try:
            _flock(fd, fcntl.LOCK_EX, deadline, "the GPU's timing lock")
        finally:
            if self.intent_fd is not None:
                fcntl.flock(self.intent_fd, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def drop_lock(self) -> None:
        """Close the lock's descriptor: the candidate's worker does, before any candidate code runs, so that a
        candidate cannot hold the GPU's timing lock (the judge holds it while it times)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def _warm_up_host(self, checks) -> None:
        """First uses that cost seconds on the host (dispatch-mode machinery, profiler import) belong to start-up,
        which the pool hides behind earlier candidates."""
        x = torch.ones(8)
        tracing.reference_compute_ops(lambda: torch.relu(x) + 1)
        if checks is not None:
            checks.host()

    def _init_device(self, device_type: str, cpu_threads: int, checks) -> None:
        if device_type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("device_type='cuda' but torch sees no CUDA device")
            torch.cuda.init()
            torch.empty(1, device="cuda").fill_(0)
            torch.cuda.synchronize()
            milestone(self.who, "CUDA context up")
            self.torch_device = torch.device("cuda", 0)
            props = torch.cuda.get_device_properties(0)
            self.name = props.name
            self.info = {"gpu_name": props.name, "capability": f"{props.major}.{props.minor}",
                         "total_memory": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", None),
                         "cuda_version": torch.version.cuda}
        else:
            torch.set_num_threads(max(1, cpu_threads))
            self.torch_device = torch.device("cpu")
            self.name = "cpu"
            self.info = {"gpu_name": None, "cpu_threads": torch.get_num_threads()}
        self.info.update(device_type=device_type, torch_version=torch.__version__, pid=os.getpid(),
                         python=sys.version.split()[0])
        self.timer = timing.make_timer(device_type)
        self.info["timer"] = timing.timer_name(self.timer)
        if getattr(self.timer, "fallback_reason", ""):
            self.info["timer_fallback_reason"] = self.timer.fallback_reason
        with self.torch_device:
            torch.randn(4)
        if self.type == "cuda":  # timer dlopen + scratch buffer, allocator snapshot, CUPTI: first uses are slow
            self.timer.time(lambda _k: None, warmup=1, reps=2, l2_flush_bytes=timing.l2_flush_bytes("cuda"))
            milestone(self.who, f"timer {self.info['timer']} works")
            if checks is not None:
                checks.cuda(self.info, lambda what: milestone(self.who, what))
            try:
                self.info["gate_cycles_per_ms"] = self._gate_cycles_per_ms()
            except Exception as e:  # gated timing falls back to device_sync and the fork check is skipped
                self.info["gate_error"] = f"{type(e).__name__}: {e}"[:300]
            gated = self.timer_for("gated")
            if isinstance(gated, timing.GatedTimer):   # its flush buffer before any trial poisons freed memory
                gated.reserve(timing.l2_flush_bytes("cuda"))
        self.sync()

    def sync(self) -> None:
        if self.type == "cuda":
            _cuda_synchronize()

    def timer_for(self, method: str):
        """The timer of a timing method (timing.py), made once per process."""
        timers = self.__dict__.setdefault("_timers", {})
        if method not in timers:
            timers[method] = timing.timer_for(method, self.type, self.timer, self.info.get("gate_cycles_per_ms"))
        return timers[method]

    @staticmethod
    def _gate_cycles_per_ms() -> float | None:
        """GPU clock cycles per ms of torch.cuda._sleep's spin kernel, measured before any candidate code runs."""
        if _cuda_sleep is None:
            return None
        start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
        cycles = 4_000_000
        _cuda_sleep(cycles // 10)  # first launch loads the kernel
        start.record()
        _cuda_sleep(cycles)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        return cycles / ms if ms > 0 else None
