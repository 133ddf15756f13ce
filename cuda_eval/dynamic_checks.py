"""Dynamic reward-hack checks (worker processes only; imports torch).

- `ForwardTrace`: runs one forward call under a TorchDispatchMode (every ATen op, and whether it came from Python or
  from inside the candidate's compiled extension, told apart with a profile hook on the extension's functions) and a
  Python profile hook that notices the reference task's own code running.
- `KernelTrace`: the CUDA kernels a call launched (torch.profiler / CUPTI): names, streams, end times.
- `IdentitySnapshot`: identities of torch/time/builtins functions, global numeric flags and the task's namespace,
  taken before the candidate is imported; `changed()` lists what the candidate replaced.
- `ThreadWatch`: Python threads and native threads (/proc/self/task) that appeared after a baseline.
- `poison_free_memory`: fills the CUDA caching allocator's free blocks with 0xFF (NaN for floats) so that a
  candidate returning memory it never wrote (e.g. the reference's freed output) cannot pass.
"""
from __future__ import annotations

import builtins
import dataclasses
import os
import re
import sys
import threading
import time
import types
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cuda_eval import device_kernels
from cuda_eval.compare import POISON_BYTE

_cuda_synchronize = torch.cuda.synchronize  # captured before candidate code can replace them
_dispatch_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_PYTHON_KEY = torch._C.DispatchKey.Python
# Python files of torch's compute wrappers (F.relu calls torch.relu from there): torch builtins called from these or
# from the candidate's own code are the candidate's calls; torch's other internals are not watched.
_TORCH_CALLERS = frozenset(os.path.join(os.path.dirname(torch.__file__), *parts) for parts in (
    ("nn", "functional.py"), ("functional.py",), ("_tensor.py",)))
TASK_FILENAME = "<kernelbench-task>"
CANDIDATE_FILENAME = "<candidate>"

# ATen ops that allocate, view, move or describe memory: never "compute". Names are overload packets without a
# trailing "_" (in-place) suffix.
ALLOC_VIEW_OPS = frozenset("""
    empty empty_like empty_strided empty_permuted new_empty new_empty_strided zeros zeros_like ones ones_like full
    full_like new_zeros new_ones new_full scalar_tensor arange fill zero resize set copy clone contiguous _to_copy
    to lift_fresh lift_fresh_copy detach alias view _unsafe_view reshape _reshape_alias as_strided expand permute
    transpose t squeeze unsqueeze select slice narrow flatten unflatten split split_with_sizes chunk unbind
    view_as_real view_as_complex sym_size sym_stride sym_numel sym_storage_offset is_contiguous _local_scalar_dense
    item dim size stride numel is_same_size record_stream _has_compatible_shallow_copy_type expand_as view_as
    reshape_as unsafe_split unsafe_chunk _unsafe_index as_strided_scatter is_nonzero is_pinned pin_memory
    _pin_memory set_data detach_copy alias_copy resolve_conj resolve_neg conj _conj _neg_view
""".split())
# Library GEMM / convolution / attention / recurrent ops: the heavy work of most tasks.
HEAVY_OPS = frozenset("""
    mm addmm bmm baddbmm addbmm matmul linear _addmm_activation addmv mv dot vdot einsum _int_mm _scaled_mm
    convolution _convolution cudnn_convolution cudnn_convolution_transpose convolution_overrideable conv1d conv2d
    conv3d conv_transpose1d conv_transpose2d conv_transpose3d mkldnn_convolution miopen_convolution
    slow_conv2d_forward slow_conv3d_forward slow_conv_transpose2d slow_conv_transpose3d slow_conv_dilated2d
    slow_conv_dilated3d _slow_conv2d_forward thnn_conv2d _nnpack_spatial_convolution
    _scaled_dot_product_attention_math scaled_dot_product_attention _scaled_dot_product_flash_attention
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention _flash_attention_forward
    _efficient_attention_forward _cudnn_rnn lstm gru rnn_tanh rnn_relu _thnn_fused_lstm_cell cudnn_batch_norm
    native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training native_layer_norm
    native_group_norm _fused_rms_norm
""".split())


def op_name(func) -> str:
    """'aten::relu_.default' -> 'relu' (overload packet, in-place suffix dropped)."""
    name = getattr(getattr(func, "overloadpacket", None), "__name__", None) or str(func).split(".")[-2]
    name = name.split("::")[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def is_compute(name: str) -> bool:
    return name not in ALLOC_VIEW_OPS


# Operator namespaces that belong to PyTorch; an op from any other namespace was registered by the candidate's
# extension (TORCH_LIBRARY) and counts as the candidate's own code.
TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quantized", "_c10d_functional", "c10d",
                              "profiler", "cuda", "mkldnn", "inductor", "higher_order"})


@dataclasses.dataclass
class OpRecord:
    name: str
    from_extension: bool   # called from inside the candidate's compiled extension (C++ wrapper), not from Python
    host_transfer: bool    # moved data between a CUDA device and the host
    custom: bool = False   # an op the candidate registered itself (torch.ops.<its namespace>.<op>)


class _OpRecorder(TorchDispatchMode):
    def __init__(self, inside_extension: Callable[[], bool]):
        super().__init__()
        self.records: list[OpRecord] = []
        self._inside_extension = inside_extension
        self.handling = 0

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        self.handling += 1  # the profile hook ignores our own calls in here (the mode is off the stack meanwhile)
        try:
            kwargs = kwargs or {}
            name = op_name(func)
            if getattr(func, "namespace", "aten") not in TORCH_NAMESPACES:
                self.records.append(OpRecord(name, True, False, custom=True))
                return func(*args, **kwargs)
            transfer = False
            if name in ("_to_copy", "copy", "to"):
                devices = {a.device.type for a in _tensors(args) + _tensors(list(kwargs.values()))}
                target = kwargs.get("device")
                if target is not None:
                    devices.add(torch.device(target).type)
                transfer = "cpu" in devices and len(devices) > 1
            self.records.append(OpRecord(name, self._inside_extension(), transfer))
            return func(*args, **kwargs)
        finally:
            self.handling -= 1


def _tensors(items: Iterable) -> list[torch.Tensor]:
    out = []
    for x in items:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(_tensors(x))
    return out


class ForwardTrace:
    """Context manager tracing forward calls (entered once per call; the records add up): ATen ops (Python side vs.
    extension side), calls into the candidate's extension functions, the reference task's code running, torch
    functions and tensor methods called from Python (seen by the profile hook, whatever the dispatch mode sees: a
    `torch._C._DisableTorchDispatch` blinds the mode, not this), and the op tracer found switched off inside the
    call (Python dispatch excluded, or our mode popped off the stack)."""

    def __init__(self, extension_functions: Iterable[Any]):
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
        self.recorder = _OpRecorder(lambda: self._depth > 0)
        self._previous_profiler = None

    def _profile(self, frame, event, arg):
        if event == "c_call":
            if id(arg) in self._ext_ids:
                self._depth += 1
                self.extension_calls += 1
            elif self._depth == 0 and not self.recorder.handling and (
                    frame.f_code.co_filename == CANDIDATE_FILENAME or frame.f_code.co_filename in _TORCH_CALLERS):
                self._torch_call(arg)
        elif event in ("c_return", "c_exception") and id(arg) in self._ext_ids:
            self._depth = max(0, self._depth - 1)
        elif event == "call" and frame.f_code.co_filename == TASK_FILENAME:
            self.task_code_calls.add(frame.f_code.co_name)

    def _torch_call(self, fn) -> None:
        """A builtin called from Python outside the extension: torch's own functions and tensor methods are noted,
        with the state of the op tracer at that moment."""
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.Tensor):
            name = f"Tensor.{getattr(fn, '__name__', '?')}"
        else:
            module = getattr(fn, "__module__", None) or getattr(owner, "__name__", None) or ""
            if not isinstance(module, str) or not (module == "torch" or module.startswith("torch.")):
                return
            name = f"{module}.{getattr(fn, '__name__', '?')}"
        self.python_torch_calls.add(name)
        if _dispatch_excluded(_PYTHON_KEY):
            self.tracer_off.add(f"Python dispatch excluded when {name} was called")
        elif _dispatch_stack_len() == 0:
            self.tracer_off.add(f"no dispatch mode on the stack when {name} was called")

    def __enter__(self):
        self._previous_profiler = sys.getprofile()
        self._calls_at_enter = self.extension_calls
        self._custom_at_enter = self.custom_op_calls()
        self.recorder.__enter__()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous_profiler)
        self.recorder.__exit__(*exc)
        self.calls += 1
        if self.extension_calls == self._calls_at_enter and self.custom_op_calls() == self._custom_at_enter:
            self.calls_without_extension += 1
        return False

    def python_compute_calls(self) -> list[str]:
        """Torch compute functions and tensor methods called from Python (not allocation, views, moves or device
        queries): the same lists as the static rule (checks.py)."""
        from cuda_eval import checks
        return sorted(n for n in self.python_torch_calls if checks.is_torch_compute_call(n))

    # --- summaries ---
    def python_compute_ops(self) -> list[str]:
        return _unique(r.name for r in self.recorder.records
                       if not r.from_extension and not r.custom and is_compute(r.name))

    def compute_ops(self) -> list[str]:
        return _unique(r.name for r in self.recorder.records if not r.custom and is_compute(r.name))

    def custom_op_calls(self) -> int:
        return sum(r.custom for r in self.recorder.records)

    def heavy_ops(self) -> list[str]:
        return _unique(r.name for r in self.recorder.records if r.name in HEAVY_OPS)

    def host_transfers(self) -> int:
        return sum(r.host_transfer for r in self.recorder.records)


def reference_compute_ops(call: Callable[[], Any]) -> list[str]:
    """Compute ops the reference runs (traced once, no attribution needed)."""
    recorder = _OpRecorder(lambda: False)
    with recorder:
        call()
    return _unique(r.name for r in recorder.records if is_compute(r.name))


def _unique(names: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for n in names:
        seen.setdefault(n, None)
    return list(seen)


def extension_functions(so_paths: Iterable[str]) -> list[Any]:
    """Callables of every loaded extension module whose file is one of `so_paths` (the candidate's builds)."""
    wanted = {os.path.realpath(p) for p in so_paths}
    found = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(module, types.ModuleType) and path and os.path.realpath(path) in wanted:
            found.extend(v for v in vars(module).values() if callable(v) and not isinstance(v, type))
    return found


# --- CUDA kernel trace ----------------------------------------------------------------------------------------
GATE_KERNEL = "spin_kernel"   # the kernel torch.cuda._sleep launches (aten/src/ATen/cuda/Sleep.cu)


@dataclasses.dataclass
class KernelRecord:
    name: str
    stream: int
    end_us: float
    start_us: float = 0.0


class KernelTrace:
    """The CUDA kernels launched while the block runs, with the end time of a marker range so that kernels still
    running after `mark_returned()` (work left on another stream) can be found."""

    def __init__(self):
        self.kernels: list[KernelRecord] = []
        self.returned_us: float | None = None
        self._prof = None

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False)
        self._prof.__enter__()
        return self

    def mark_returned(self):
        """Call right after forward returned and the *current* stream was synchronised."""
        from torch.profiler import record_function
        with record_function("cuda_eval::returned"):
            pass

    def __exit__(self, *exc):
        _cuda_synchronize()
        self._prof.__exit__(*exc)
        for ev in self._prof.events():
            if ev.name == "cuda_eval::returned" and self.returned_us is None:
                self.returned_us = float(ev.time_range.start)
            elif _is_kernel_event(ev):
                self.kernels.append(KernelRecord(ev.name, int(getattr(ev, "device_resource_id", 0) or 0),
                                                 float(ev.time_range.end), float(ev.time_range.start)))
        return False

    def matching(self, kernel_names: Iterable[str]) -> list[KernelRecord]:
        names = [n for n in kernel_names if n]
        return [k for k in self.kernels if any(_mentions(k.name, n) for n in names)]

    def late_kernels(self, slack_us: float) -> list[KernelRecord]:
        if self.returned_us is None:
            return []
        return [k for k in self.kernels if k.end_us > self.returned_us + slack_us]

    def gate(self) -> KernelRecord | None:
        """The gate kernel of a gated trace (see `unforked_kernels`): the first of torch.cuda._sleep's spin kernels to
        start (launched before forward, so before any of the candidate's); None if there is none."""
        return min((k for k in self.kernels if GATE_KERNEL in k.name), key=lambda k: k.start_us, default=None)

    def unforked_kernels(self, slack_us: float = 1.0) -> list[KernelRecord]:
        """Kernels that started on another stream while the gate still held the current stream.

        The gate is a spin kernel put on the current stream just before forward. Work ordered after the current
        stream (the current stream itself, or a side stream that waited on an event recorded on it: the only way
        its result is ordered before the caller's next operation) cannot start before the gate ends; a kernel on
        another stream that started earlier waited for nothing. Deterministic, unlike `late_kernels`, which needs
        the private work to still be running when the current stream is synchronised."""
        gate = self.gate()
        if gate is None:
            return []
        return [k for k in self.kernels
                if k is not gate and k.stream != gate.stream and k.start_us < gate.end_us - slack_us]


# Kernels of our own in a trace (not the candidate's): the gates and markers that open each group of calls (the
# time-based gate; the trace of the calls needs it), the digests that close it. Allocation and copy kernels (ours
# and anybody's: flushes, fills, copies) are never held against a candidate.
OWN_GATES = (device_kernels.GATE_KERNEL,)
OWN_DIGESTS = device_kernels.DIGEST_KERNELS
ALLOC_KERNEL = re.compile(r"(?i)fill|copy|memset|memcpy|catarray|arange|zero")
HEAVY_KERNEL = re.compile(r"(?i)gemm|cutlass|cublas|xmma|cudnn|conv(?!ert)|fft|flash|fmha|attention")


_NOT_A_KERNEL = re.compile(r"^(Memcpy|Memset|cuda[A-Z])")   # copies, fills, runtime calls (cudaLaunchKernel ...)


def is_kernel_record(name: str) -> bool:
    """Whether a CUDA record of the trace is a kernel. Runtime calls are camel case (`cudaStreamSynchronize`), so
    our own `cuda_eval_gate`, which opens every group's window, is kept."""
    return not _NOT_A_KERNEL.match(name)


@dataclasses.dataclass
class GroupWindow:
    """The kernels between a group's gate (or marker) and its digests: the candidate's calls of one group."""
    busy_ms: float = 0.0          # GPU time covered by at least one of its kernels (overlaps counted once)
    own: int = 0                  # launches of the program's own kernels
    kernels: int = 0              # launches of any kernel of the candidate's (own or not)


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

    def stop(self, kernel_names: Iterable[str]) -> tuple[list[GroupWindow], dict[str, int]]:
        _cuda_synchronize()
        self._prof.__exit__(None, None, None)
        results = getattr(self._prof.profiler, "kineto_results", None)
        if results is None:
            raise RuntimeError("the profiler was stopped before the kernel trace step")
        records = []
        for ev in results.events():
            if "CUDA" not in str(ev.device_type()):
                continue
            name = ev.name()
            if not is_kernel_record(name):
                continue
            start = ev.start_ns()
            records.append((start, start + ev.duration_ns(), name))
        records.sort()
        return split_windows(records, kernel_names)


def split_windows(records: list[tuple[int, int, str]], kernel_names: Iterable[str]) -> tuple[list[GroupWindow],
                                                                                             dict[str, int]]:
    """(one window per group: a gate or marker opens it, the first digest kernel after it closes it; the other
    kernels' names and launch counts). Kernels that start outside every window (input generation, the reveals'
    copies) are not the candidate's calls; allocation and copy kernels are never held against it."""
    names = [n for n in kernel_names if n]
    windows: list[GroupWindow] = []
    foreign: dict[str, int] = {}
    spans: list[tuple[int, int]] = []
    is_open = False

    def close() -> None:
        busy, end = 0, None
        for a, b in sorted(spans):
            if end is None or a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        windows[-1].busy_ms = busy / 1e6
        spans.clear()

    for start, end, name in records:
        if any(g in name for g in OWN_GATES):
            if is_open:
                close()
            windows.append(GroupWindow())
            is_open = True
        elif any(d in name for d in OWN_DIGESTS):
            if is_open:
                close()
                is_open = False
        elif is_open:
            win = windows[-1]
            own = any(_mentions(name, n) for n in names)   # first: a program's own `copy_rows` kernel is its own
            if not own and ALLOC_KERNEL.search(name):
                continue
            win.kernels += 1
            spans.append((start, end))
            if own:
                win.own += 1
            else:
                foreign[name[:200]] = foreign.get(name[:200], 0) + 1
    if is_open:
        close()
    return windows, foreign


def _is_kernel_event(ev) -> bool:
    device_type = getattr(ev, "device_type", None)
    return device_type is not None and "CUDA" in str(device_type) and not ev.name.startswith(("Memcpy", "Memset",
                                                                                                "cuda"))


def _mentions(kernel_name: str, ident: str) -> bool:
    """True if `ident` appears in a (demangled) kernel name as a whole identifier."""
    start = 0
    while True:
        i = kernel_name.find(ident, start)
        if i < 0:
            return False
        before = kernel_name[i - 1] if i > 0 else " "
        after = kernel_name[i + len(ident)] if i + len(ident) < len(kernel_name) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
        start = i + 1


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


class IdentitySnapshot:
    """Which object every watched name refers to. Public module attributes, whole class dictionaries (dunder
    methods included) and global numerical flags are watched."""

    def __init__(self, modules: Iterable[types.ModuleType], classes: Iterable[type],
                 namespaces: dict[str, dict] | None = None):
        self._modules = list(modules)
        self._classes = list(classes)
        self._namespaces = dict(namespaces or {})
        self._entries = self._collect()
        self._flags = _global_flags()

    def _collect(self) -> dict[str, Any]:
        entries: dict[str, Any] = {}
        for m in self._modules:
            for k, v in list(vars(m).items()):
                if not k.startswith("_") or k in ("__import__", "__build_class__"):
                    entries[f"{m.__name__}.{k}"] = v
        for c in self._classes:
            for k, v in list(vars(c).items()):
                if k not in ("__doc__", "__weakref__", "__dict__", "__annotations__", "_abc_impl"):
                    entries[f"{c.__module__}.{c.__qualname__}.{k}"] = v
        for label, ns in self._namespaces.items():
            for k, v in list(ns.items()):
                if not k.startswith("__"):
                    entries[f"{label}.{k}"] = v
        return entries

    def changed(self) -> list[str]:
        now = self._collect()
        out = [k for k, v in self._entries.items() if k not in now or now[k] is not v]
        flags_now = _global_flags()
        out += [f"{k} ({self._flags[k]!r} -> {flags_now.get(k)!r})" for k in self._flags
                if flags_now.get(k) != self._flags[k]]
        return out


def default_watch_modules() -> list[types.ModuleType]:
    import gc
    import torch.nn.functional as F
    import torch.testing
    mods = [torch, torch.cuda, F, torch.testing, torch.autograd, torch.random, time, builtins, gc, threading,
            torch.nn.init, torch.linalg, torch.fft, torch.special]
    for name in ("cuda_eval._native", "cuda_eval.compare", "cuda_eval.dynamic_checks", "cuda_eval.timing",
                 "cuda_eval.worker", "cuda_eval.harness", "cuda_eval.channel", "cuda_eval.wire"):
        if name in sys.modules:
            mods.append(sys.modules[name])
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
        sys.setprofile(None)  # once per thread: no overhead afterwards
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
