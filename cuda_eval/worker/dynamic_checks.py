"""Dynamic reward-hack checks, inside the candidate's worker (an untrusted process: a candidate that attacks the
harness there can evade them; docs/EVALUATOR.md, "Trust boundary"). Imports torch.

- `ForwardTrace`: runs one forward call under the op tracer (protocol/tracing.py: every ATen op, and whether it came
  from Python or from inside the candidate's compiled extension, told apart with a profile hook on the extension's
  functions) and a Python profile hook that notices the reference task's own code running.
- `KernelSession`: every CUDA kernel of every call of the job (CUPTI), split into one window per group of calls.
- `IdentitySnapshot`: identities of torch/time/builtins functions, global numeric flags and the task's namespace,
  taken before the candidate is imported; `changed()` lists what the candidate replaced.
- `ThreadWatch`: Python threads and native threads (/proc/self/task) that appeared after a baseline.
- `poison_free_memory`: fills the CUDA caching allocator's free blocks with 0xFF (NaN for floats) so that a
  candidate returning memory it never wrote (e.g. the reference's freed output) cannot pass.
- `StartUp`: what of these is made ready when the worker starts, before any candidate code exists.
"""
from __future__ import annotations

import builtins
import dataclasses
import importlib
import os
import sys
import threading
import time
import types
from typing import Any, Iterable

import torch

from cuda_eval.protocol.harness import CANDIDATE_FILENAME, TASK_FILENAME
from cuda_eval.protocol.tensors import POISON_BYTE, flatten
from cuda_eval.protocol.tracing import (ALLOC_KERNEL, HEAVY_OPS, KernelTrace, OpRecorder, is_compute,
                                        is_kernel_name, unique)

# Captured before candidate code can replace them.
_cuda_synchronize = torch.cuda.synchronize
_type = builtins.type
_isinstance = builtins.isinstance
_Tensor = torch.Tensor
_dispatch_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_PYTHON_KEY = torch._C.DispatchKey.Python
_getprofile = sys.getprofile
_setprofile = sys.setprofile
_gettrace = sys.gettrace
_get_ident = threading.get_ident
# The interpreter's functions that read, replace or remove a profile or trace hook (3.12 adds the all-threads ones).
_HOOK_NAMES = ("setprofile", "settrace", "getprofile", "gettrace", "_setprofileallthreads", "_settraceallthreads")
_HOOK_FUNCTIONS = {n: getattr(sys, n) for n in _HOOK_NAMES if hasattr(sys, n)}
# A call of one of these builtins while the hook is set is seen by the hook itself (its c_call event names the
# function object, whatever name reached it); calls made from C (functools.partial, map) raise no event: for those,
# the sys module's names are guarded (install_hook_guards).
_HOOK_SWITCH_IDS = frozenset(id(f) for f in _HOOK_FUNCTIONS.values())
_active = None      # the ForwardTrace whose hook is set now (one at a time, on one thread)
_guarded_now = False  # whether sys's hook functions are the guards (install_hook_guards)


def _guarded(name: str, original):
    def guarded(*args, **kwargs):
        trace = _active
        if trace is not None and _get_ident() == trace.thread:
            trace.tracer_off.add(f"sys.{name} was called inside the forward")
            if name.startswith(("set", "_set")):
                return None   # the hook stays
        return original(*args, **kwargs)
    guarded.__name__ = guarded.__qualname__ = name
    return guarded


_GUARDS = {name: _guarded(name, original) for name, original in _HOOK_FUNCTIONS.items()}


def install_hook_guards() -> None:
    """Replace sys's hook functions with guards, before any candidate code runs in this process: inside a traced
    call, reading or switching the profile or trace hook through them is `tracer_off` and leaves our hook in place,
    however they are called (directly, from C through functools.partial or map, or by a module that wraps them:
    profile, threading.setprofile_all_threads). The originals stay reachable only through objects a candidate has
    to dig for."""
    global _guarded_now
    for name, guard in _GUARDS.items():
        setattr(sys, name, guard)
    _guarded_now = True


def remove_hook_guards() -> None:
    """sys's own functions back (for tests that run in a process of their own choosing)."""
    global _guarded_now
    for name, original in _HOOK_FUNCTIONS.items():
        setattr(sys, name, original)
    _guarded_now = False


def _guards_moved() -> list[str]:
    return [n for n, g in _GUARDS.items() if getattr(sys, n, None) is not g] if _guarded_now else []
# Python files of torch's compute wrappers (F.relu calls torch.relu from there): torch builtins called from these or
# from the candidate's own code are the candidate's calls; torch's other internals are not watched.
_TORCH_CALLERS = frozenset(os.path.join(os.path.dirname(torch.__file__), *parts) for parts in (
    ("nn", "functional.py"), ("functional.py",), ("_tensor.py",)))


class ForwardTrace:
    """Context manager tracing forward calls (entered once per call; the records add up): ATen ops (Python side vs.
    extension side), calls into the candidate's extension functions, the reference task's code running, torch
    functions and tensor methods called from Python (seen by the profile hook, whatever the dispatch mode sees: a
    `torch._C._DisableTorchDispatch` blinds the mode, not this), and the op tracer found switched off inside the
    call (Python dispatch excluded, our mode popped off the stack, or the profile hook itself replaced)."""

    def __init__(self, extension_functions: Iterable[Any]):
        self.thread = _get_ident()
        self._ext_ids = {id(f) for f in extension_functions}
        self._keep = list(extension_functions)  # keep the ids valid
        self._depth = 0
        self.extension_calls = 0
        self.calls = 0
        self.calls_without_extension = 0
        self._calls_at_enter = 0
        self._custom_at_enter = 0
        self.task_code_calls: set[str] = set()
        self.python_torch_calls: set[str] = set()
        self.tracer_off: set[str] = set()
        self.recorder = OpRecorder(lambda: self._depth > 0)
        self._previous_profiler = None
        self._hook = self._profile  # one bound method: the one set, and the one looked for after the call

    def _profile(self, frame, event, arg):
        # Nothing here may run the candidate's code or raise: an exception in a profile hook removes it (CPython),
        # and code run inside the hook raises no events.
        try:
            if event == "c_call":
                if id(arg) in _HOOK_SWITCH_IDS and frame.f_code is not _EXIT_CODE:  # our own __exit__ resets it
                    self.tracer_off.add(f"sys.{getattr(arg, '__name__', '?')} was called inside the forward")
                elif id(arg) in self._ext_ids:
                    self._depth += 1
                    self.extension_calls += 1
                elif self._depth == 0 and not self.recorder.handling and (
                        frame.f_code.co_filename == CANDIDATE_FILENAME or frame.f_code.co_filename in _TORCH_CALLERS):
                    self._torch_call(arg)
            elif event in ("c_return", "c_exception") and id(arg) in self._ext_ids:
                self._depth = max(0, self._depth - 1)
            elif event == "call" and frame.f_code.co_filename == TASK_FILENAME:
                self.task_code_calls.add(frame.f_code.co_name)
        except BaseException as e:
            self.tracer_off.add(f"the profile hook failed ({_type(e).__name__})")

    def _torch_call(self, fn) -> None:
        """A builtin called from Python outside the extension: torch's own functions and tensor methods are noted,
        with the state of the op tracer at that moment."""
        # fn is a builtin (the c_call event's): its attributes are the interpreter's, never the candidate's code;
        # its __self__ may be any object, so only its real type is asked (no __class__ or __name__ of its own).
        owner = getattr(fn, "__self__", None)
        if issubclass(_type(owner), _Tensor):
            name = f"Tensor.{getattr(fn, '__name__', '?')}"
        else:
            module = getattr(fn, "__module__", None)
            if not module and _type(owner) is types.ModuleType:
                module = owner.__dict__.get("__name__")   # the module's own dict: no module __getattr__
            if not isinstance(module, str) or not (module == "torch" or module.startswith("torch.")):
                return
            name = f"{module}.{getattr(fn, '__name__', '?')}"
        self.python_torch_calls.add(name)
        if _dispatch_excluded(_PYTHON_KEY):
            self.tracer_off.add(f"Python dispatch excluded when {name} was called")
        elif _dispatch_stack_len() == 0:
            self.tracer_off.add(f"no dispatch mode on the stack when {name} was called")

    def __enter__(self):
        self._previous_profiler = _getprofile()
        self._calls_at_enter = self.extension_calls
        self._custom_at_enter = self.custom_op_calls()
        self.recorder.__enter__()
        if _gettrace() is not None:  # a trace function runs code the profile hook cannot see (no events inside it)
            self.tracer_off.add("a trace function (sys.settrace) was set when the call began")
        global _active
        _setprofile(self._hook)
        _active = self
        return self

    def __exit__(self, *exc):
        global _active
        _active = None
        if _getprofile() is not self._hook:  # removed or replaced from native code (a Python call is seen above)
            self.tracer_off.add("the profile hook was replaced or removed during the call")
        moved = _guards_moved()   # put back to the originals, or replaced by the candidate's, at any time
        if moved:
            self.tracer_off.add(f"sys.{moved[0]} was replaced during the call")
        _setprofile(self._previous_profiler)
        self.recorder.__exit__(*exc)
        self.calls += 1
        if self.extension_calls == self._calls_at_enter and self.custom_op_calls() == self._custom_at_enter:
            self.calls_without_extension += 1
        return False

    def python_compute_calls(self) -> list[str]:
        """Torch compute functions and tensor methods called from Python (not allocation, views, moves or device
        queries): the same lists as the static rule (checks.py)."""
        from cuda_eval.static import checks
        return sorted(n for n in self.python_torch_calls if checks.is_torch_compute_call(n))

    # --- summaries ---
    def python_compute_ops(self) -> list[str]:
        return unique(r.name for r in self.recorder.records
                       if not r.from_extension and not r.custom and is_compute(r.name))

    def compute_ops(self) -> list[str]:
        return unique(r.name for r in self.recorder.records if not r.custom and is_compute(r.name))

    def custom_op_calls(self) -> int:
        return sum(r.custom for r in self.recorder.records)

    def heavy_ops(self) -> list[str]:
        return unique(r.name for r in self.recorder.records if r.name in HEAVY_OPS)

    def host_transfers(self) -> int:
        return sum(r.host_transfer for r in self.recorder.records)


_EXIT_CODE = ForwardTrace.__exit__.__code__


def extension_functions(so_paths: Iterable[str]) -> list[Any]:
    """Callables of every loaded extension module whose file is one of `so_paths` (the candidate's builds)."""
    wanted = {os.path.realpath(p) for p in so_paths}
    found = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(module, types.ModuleType) and path and os.path.realpath(path) in wanted:
            found.extend(v for v in vars(module).values() if callable(v) and not isinstance(v, type))
    return found


def non_plain_tensors(obj: Any) -> list[str]:
    """Names of the output leaves that are tensor subclasses or tensor-like wrappers (`__torch_function__`)."""
    bad = []
    for leaf in flatten(obj):
        t = _type(leaf)
        if t is _Tensor:
            continue
        if _isinstance(leaf, _Tensor) or hasattr(t, "__torch_function__") or hasattr(t, "__torch_dispatch__"):
            bad.append(f"{t.__module__}.{t.__qualname__}")
    return bad


# --- the kernels of every call (CUDA) ---------------------------------------------------------------------------
# Kernels of our own in a trace are known by this process's names for them (device_kernels.Kernels.names: a random
# token drawn before any candidate code exists, which no program can know when it is built): the gate or marker that
# opens each group's window, the flush before each call (and after the last: what closes a call), the digests that
# close the window. Every other kernel in a window is the candidate's call's, whatever its name; only the list of
# "foreign" kernels (checked against the reference's and library kernels by name) leaves out fills and copies.
UNSYNCED_SLACK_NS = 1000      # GPU timestamps of two streams: a kernel ordered after another starts after it ended


@dataclasses.dataclass
class GroupWindow:
    """The kernels between a group's gate (or marker) and its digests: the candidate's calls of one group."""
    busy_ms: float = 0.0          # GPU time covered by at least one of its kernels (overlaps counted once)
    own: int = 0                  # launches of the program's own kernels (the symbols of its built binary)
    kernels: int = 0              # launches of any kernel in the calls (ours excepted)
    unsynced: int = 0             # kernels on another stream not ordered within their call (see split_windows)


@dataclasses.dataclass
class GpuRecord:
    """One GPU activity of the trace."""
    start: int                    # ns, the GPU's clock
    end: int
    name: str
    stream: int = 0
    kernel: bool = True           # a kernel (CUPTI's activity kind), not a copy or a memset


class KernelSession:
    """Every CUDA kernel of a job's calls (torch.profiler, CUDA activity only), from the first call of the candidate
    to the kernel-trace step: correctness trials, estimate, warm-up and timed groups alike, so that no call runs
    untraced. `stop()` parses the records into one GroupWindow per group, the names of the kernels that were
    neither ours nor the program's, and raises if the trace was stopped in between (by the candidate)."""

    def __init__(self):
        self._prof = None

    def start(self) -> "KernelSession":
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CUDA], record_shapes=False)
        self._prof.__enter__()
        return self

    def stop(self, kernel_names: Iterable[str], ours: dict) -> tuple[list[GroupWindow], dict[str, int]]:
        _cuda_synchronize()
        self._prof.__exit__(None, None, None)
        results = getattr(self._prof.profiler, "kineto_results", None)
        if results is None:
            raise RuntimeError("the profiler was stopped before the kernel trace step")
        records = []
        for ev in results.events():
            if "CUDA" not in str(ev.device_type()):
                continue
            name, start = ev.name(), ev.start_ns()
            kind = str(ev.activity_type() or "") if hasattr(ev, "activity_type") else ""
            # CUPTI's kind when the profiler gives it ("kernel", "gpu_memcpy", "gpu_memset"); else the name's shape
            records.append(GpuRecord(start, start + ev.duration_ns(), name, int(ev.device_resource_id() or 0),
                                     kind == "kernel" if kind else is_kernel_name(name)))
        records.sort(key=lambda r: (r.start, r.end))
        return split_windows(records, kernel_names, ours)


def split_windows(records: list[GpuRecord], kernel_names: Iterable[str], ours: dict) -> tuple[list[GroupWindow],
                                                                                           dict[str, int]]:
    """(one window per group: our gate or marker opens it, our first digest kernel after it closes it; the other
    kernels' names and launch counts). `ours`: this process's names of its kernels (Kernels.names). Kernels that
    start outside every window (input generation, the reveals' copies) are not the candidate's calls.

    Per window, a kernel on another stream than the gate's is `unsynced` when it started before the gate ended (it
    waited for nothing on the current stream), or was still running when a flush of ours that started after it began
    on the current stream (the flush follows its call's end event: the call had ended without waiting for it)."""
    names = frozenset(n for n in kernel_names if n)
    gate, flush, digests = ours["gate"], ours["flush"], set(ours["digests"])
    windows: list[GroupWindow] = []
    foreign: dict[str, int] = {}
    spans: list[tuple[int, int]] = []
    calls: list[GpuRecord] = []
    flushes: list[GpuRecord] = []
    opened: GpuRecord | None = None

    def close() -> None:
        busy, end = 0, None
        for a, b in sorted(spans):
            if end is None or a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        win = windows[-1]
        win.busy_ms = busy / 1e6
        for k in calls:
            if k.stream == opened.stream:
                continue
            early = k.start < opened.end - UNSYNCED_SLACK_NS
            late = any(f.stream == opened.stream and f.start >= k.start and k.end > f.start + UNSYNCED_SLACK_NS
                       for f in flushes)
            win.unsynced += early or late
        spans.clear()
        calls.clear()
        flushes.clear()

    for rec in records:
        if rec.name == gate:
            if opened is not None:
                close()
            windows.append(GroupWindow())
            opened = rec
        elif rec.name in digests:
            if opened is not None:
                close()
                opened = None
        elif opened is None:
            continue
        elif rec.name == flush:
            flushes.append(rec)
        elif rec.kernel:
            win = windows[-1]
            own = rec.name in names
            win.kernels += 1
            spans.append((rec.start, rec.end))
            calls.append(rec)
            if own:
                win.own += 1
            elif not ALLOC_KERNEL.search(rec.name):
                foreign[rec.name[:200]] = foreign.get(rec.name[:200], 0) + 1
    if opened is not None:
        close()
    return windows, foreign


# --- identity snapshot (monkeypatching) ---------------------------------------------------------------------
def _global_flags() -> dict[str, Any]:
    flags = {
        "torch.backends.cudnn.benchmark": torch.backends.cudnn.benchmark,
        "torch.backends.cudnn.deterministic": torch.backends.cudnn.deterministic,
        "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "torch.backends.cudnn.enabled": torch.backends.cudnn.enabled,
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
    }
    try:
        flags["torch.backends.cuda.matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        flags["torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"] = \
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    except (AttributeError, RuntimeError):  # older/newer torch without these knobs
        pass
    return flags


# ATen ops the harness runs in the worker outside the candidate's calls: the output digest (its torch-op form), the
# inputs' generation, the outputs' packing, the poisoning of freed memory. A kernel a candidate registers for one
# of them (TORCH_LIBRARY_IMPL(aten, CPU, m)) would run its deferred work inside our code, after its call returned.
HARNESS_ATEN_OPS = frozenset("""
    detach contiguous clone reshape view _unsafe_view _reshape_alias alias as_strided slice select unsqueeze
    expand new_zeros zeros zeros_like empty empty_like empty_strided new_empty new_empty_strided fill_ zero_ copy_
    _copy_from _copy_from_and_resize _to_copy to cat bitwise_and bitwise_xor bitwise_or __rshift__ __lshift__
    bitwise_right_shift bitwise_left_shift __and__ __xor__ __or__ mul add sub arange lift_fresh lift_fresh_copy
    _local_scalar_dense item eq equal resize_ set_ _pin_memory pin_memory randn rand randint randn_like rand_like
    randint_like normal normal_ uniform_ random_ bernoulli bernoulli_ exponential_ randperm multinomial ones
    ones_like full full_like linspace scalar_tensor
""".split())
_dispatch_dump = torch._C._dispatch_dump
# Their overloads, listed once at import (before any candidate code: the list of every op takes ~0.1 s).
_HARNESS_OP_NAMES = tuple(sorted(n for n in torch._C._dispatch_get_all_op_names()
                                 if n.startswith("aten::") and n[6:].split(".", 1)[0] in HARNESS_ATEN_OPS))


def harness_aten_registrations() -> dict[str, str]:
    """The dispatcher's registrations of every overload of HARNESS_ATEN_OPS (~200, ~10 ms): each kernel and where
    it was registered (a kernel registered over one of them changes its entry)."""
    out = {}
    for name in _HARNESS_OP_NAMES:
        try:
            out[name] = _dispatch_dump(name)
        except RuntimeError:   # no longer a known op: changed too
            out[name] = ""
    return out


def is_own_module(module: types.ModuleType) -> bool:
    """One of the evaluator's modules (the worker's own __main__ too: its spec names it)."""
    spec = getattr(module, "__spec__", None)
    names = (getattr(module, "__name__", ""), getattr(spec, "name", "") or "")
    return any(isinstance(n, str) and (n == "cuda_eval" or n.startswith("cuda_eval.")) for n in names)


# Module globals of ours that change legitimately during a job (the active trace, whether the guards are in place).
_MUTABLE_OWN_GLOBALS = frozenset({"_active", "_guarded_now"})
# Attributes of the harness's timers that change legitimately (their flush buffer, the last call's description).
_MUTABLE_INSTANCE_STATE = frozenset({"_scratch", "meta", "_thrash"})


def _function_parts(key: str, value: Any) -> Iterable[tuple[str, Any]]:
    """What a function of ours holds that a call reads: its code, its defaults (the timers hold the clocks and
    events they call as keyword-only defaults) and its closure's cells, each by identity."""
    fn = value.__func__ if _isinstance(value, (staticmethod, classmethod)) else value
    if _type(fn) is not types.FunctionType:
        return
    yield f"{key}.__code__", fn.__code__
    yield f"{key}.__defaults__", fn.__defaults__
    for name, default in (fn.__kwdefaults__ or {}).items():
        yield f"{key}.__kwdefaults__[{name}]", default
    for i, cell in enumerate(fn.__closure__ or ()):
        try:
            yield f"{key}.__closure__[{i}]", cell.cell_contents
        except ValueError:  # an empty cell
            yield f"{key}.__closure__[{i}]", None


class IdentitySnapshot:
    """Which object every watched name refers to. Public module attributes of torch's and Python's modules, every
    name of our own modules (private aliases included: the worker's captured clocks, events and channel functions),
    whole class dictionaries (dunder methods included), the code, defaults and closure cells of our own functions,
    and global numerical flags are watched."""

    def __init__(self, modules: Iterable[types.ModuleType], classes: Iterable[type],
                 namespaces: dict[str, dict] | None = None, instances: dict[str, Any] | None = None):
        self._modules = list(modules)
        self._classes = list(classes)
        self._namespaces = dict(namespaces or {})
        # objects of the harness whose attributes are set once per process (a timer's flush, its gate's clock rate,
        # our kernels' handles): every attribute but their working state (_MUTABLE_INSTANCE_STATE)
        self._instances = dict(instances or {})
        self._entries = self._collect()
        self._flags = _global_flags()
        self._aten = harness_aten_registrations()

    def _collect(self) -> dict[str, Any]:
        entries: dict[str, Any] = {}
        for m in self._modules:
            own = is_own_module(m)
            for k, v in list(vars(m).items()):
                if own and k not in _MUTABLE_OWN_GLOBALS or not k.startswith("_") or \
                        k in ("__import__", "__build_class__"):
                    entries[f"{m.__name__}.{k}"] = v
                    if own and getattr(v, "__module__", None) == m.__name__:
                        entries.update(_function_parts(f"{m.__name__}.{k}", v))
        for c in self._classes:
            own = (c.__module__ or "").startswith("cuda_eval") or c.__module__ == "__main__"
            for k, v in list(vars(c).items()):
                if k not in ("__doc__", "__weakref__", "__dict__", "__annotations__", "_abc_impl"):
                    entries[f"{c.__module__}.{c.__qualname__}.{k}"] = v
                    if own:
                        entries.update(_function_parts(f"{c.__module__}.{c.__qualname__}.{k}", v))
        for label, ns in self._namespaces.items():
            for k, v in list(ns.items()):
                if not k.startswith("__"):
                    entries[f"{label}.{k}"] = v
        for label, obj in self._instances.items():
            for k, v in list(vars(obj).items()):
                if k not in _MUTABLE_INSTANCE_STATE:
                    entries[f"{label}.{k}"] = v
        return entries

    def changed(self) -> list[str]:
        now = self._collect()
        out = [k for k, v in self._entries.items() if k not in now or now[k] is not v]
        flags_now = _global_flags()
        out += [f"{k} ({self._flags[k]!r} -> {flags_now.get(k)!r})" for k in self._flags
                if flags_now.get(k) != self._flags[k]]
        aten_now = harness_aten_registrations()
        out += [f"the kernels registered for {k}" for k in sorted(set(self._aten) | set(aten_now))
                if self._aten.get(k) != aten_now.get(k)]
        return out


def default_watch_modules() -> list[types.ModuleType]:
    import gc
    import torch.nn.functional as F
    import torch.testing
    mods = [torch, torch.cuda, F, torch.testing, torch.autograd, torch.random, time, builtins, gc, threading,
            torch.nn.init, torch.linalg, torch.fft, torch.special]
    # every module of ours loaded in this process (the worker's, the protocol's, the static rules its trace reads)
    mods += [m for name, m in sorted(sys.modules.items())
             if _isinstance(m, types.ModuleType) and (name == "cuda_eval" or name.startswith("cuda_eval."))]
    return mods


def default_watch_classes() -> list[type]:
    return [torch.Tensor, torch.nn.Module, torch.cuda.Event, torch.cuda.Stream, torch.nn.Parameter,
            torch.autograd.Function, threading.Thread]


# --- threads ----------------------------------------------------------------------------------------------------
def native_thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


class ThreadWatch:
    """Threads that appeared after the baseline. Python threads are also caught when they already ended: every
    thread started through `threading` reports itself on its first Python event (threading.setprofile), so a
    candidate cannot hide work in a short-lived thread."""

    def __init__(self):
        self.started: list[str] = []
        self.reset()
        threading.setprofile(self._on_thread_start)

    def _on_thread_start(self, frame, event, arg):
        _setprofile(None)  # once per thread: no overhead afterwards (the original: seen if a forward calls this)
        self.started.append(threading.current_thread().name)

    def stop_recording(self) -> None:
        threading.setprofile(None)

    def reset(self):
        self._python = {t.ident for t in threading.enumerate()}
        self._native = native_thread_ids()

    def new_python_threads(self) -> list[str]:
        alive = [f"{t.name} ({type(t).__name__})" for t in threading.enumerate()
                 if t.ident not in self._python and t.is_alive()]
        return alive or [f"{name} (finished)" for name in dict.fromkeys(self.started)]

    def new_native_threads(self) -> list[int]:
        return sorted(native_thread_ids() - self._native)


# --- freed-memory poisoning -------------------------------------------------------------------------------------
POISON_COVERED_MIN_BYTES = 1 << 30   # a recent size this large is not allocated anew where a free block holds it


def poison_sizes(inactive: Iterable[int], recent_sizes: Iterable[int]) -> list[int]:
    """The blocks poison_free_memory allocates and fills: every inactive block, and a block of each recent size,
    except a large recent size that an inactive block at least as large already covers (the allocator hands out
    that poisoned block; allocating the size anew would grow the process's device memory by a multi-GB output for
    as long as it lives, on a card the largest tasks fill)."""
    inactive = sorted((int(s) for s in inactive), reverse=True)
    spare = sorted(s for s in inactive if s >= POISON_COVERED_MIN_BYTES)
    extra = []
    for size in sorted((int(s) for s in recent_sizes), reverse=True):
        fit = next((i for i, s in enumerate(spare) if s >= size), None) if size >= POISON_COVERED_MIN_BYTES else None
        if fit is None:
            extra.append(size)
        else:
            spare.pop(fit)   # best fit: the smallest free block that holds it
    return sorted(inactive + extra, reverse=True)


def poison_free_memory(device_type: str, recent_sizes: Iterable[int] = ()) -> int:
    """Fill memory the allocator will hand out next with POISON_BYTE. CUDA: every inactive block of the caching
    allocator (from its snapshot), and a block of each of `recent_sizes` (allocated if need be, so that an output
    of that size that is never written is poison even when the allocator had nothing cached; see poison_sizes).
    CPU: blocks of the sizes just freed (glibc reuses them first). Returns bytes."""
    held, total = [], 0
    if device_type == "cuda":
        sizes = []
        for segment in torch.cuda.memory_snapshot():
            for block in segment.get("blocks", []):
                if block.get("state") == "inactive":
                    sizes.append(int(block["size"]))
        for size in poison_sizes(sizes, recent_sizes):
            try:
                t = torch.empty(size, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                break
            t.fill_(POISON_BYTE)
            held.append(t)
            total += size
        _cuda_synchronize()
    else:
        for size in recent_sizes:
            t = torch.empty(int(size), dtype=torch.uint8)
            t.fill_(POISON_BYTE)
            held.append(t)
            total += int(size)
    del held
    return total


# --- start-up -----------------------------------------------------------------------------------------------------
class StartUp:
    """The worker's checks made ready at start-up, before any candidate code exists: first uses that cost seconds
    (the dispatch mode's machinery, the profiler's import, CUPTI) belong to start-up, which the pool hides behind
    earlier candidates. harness.Device calls these where it warms up the host and the device."""

    def host(self) -> None:
        install_hook_guards()   # once per worker, before any candidate code (one worker per candidate)
        with ForwardTrace([]):
            torch.relu(torch.ones(8))
        importlib.import_module("torch.profiler")  # imported now, activated only for the kernel trace

    def cuda(self, info: dict, milestone: Any) -> None:
        """Free memory poisoned, and whether CUPTI traces kernels here (info["kernel_trace"]; without it the job
        skips the kernel trace and says so)."""
        poison_free_memory("cuda")
        milestone("free memory poisoned; starting the kernel trace (CUPTI)")
        try:
            with KernelTrace():
                torch.ones(8, device="cuda").add_(1)
            info["kernel_trace"] = True
        except Exception as e:  # no CUPTI here: the job then skips the kernel trace and says so
            info["kernel_trace"] = False
            info["kernel_trace_error"] = f"{type(e).__name__}: {e}"[:300]
