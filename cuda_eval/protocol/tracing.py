"""Tracing a call: the ATen ops it runs (a TorchDispatchMode) and the CUDA kernels it launches (torch.profiler /
CUPTI). The judge traces the reference with these (its ops, its kernels); the candidate's worker builds its own
checks on them (worker/dynamic_checks.py). Imports torch: judge and worker processes.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cuda_eval.static.checks import LIBRARY_HEAVY_OPS

_cuda_synchronize = torch.cuda.synchronize  # captured before candidate code can replace it

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
HEAVY_OPS = LIBRARY_HEAVY_OPS


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


class OpRecorder(TorchDispatchMode):
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


def reference_compute_ops(call: Callable[[], Any]) -> list[str]:
    """Compute ops the reference runs (traced once, no attribution needed)."""
    recorder = OpRecorder(lambda: False)
    with recorder:
        call()
    return unique(r.name for r in recorder.records if is_compute(r.name))


def unique(names: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for n in names:
        seen.setdefault(n, None)
    return list(seen)


# --- CUDA kernel trace ----------------------------------------------------------------------------------------
# Trace windows of the timed calls the worker reports and the judge keeps: one per group and retry (~260 groups of one
# call, 3 retries each).
CALL_WINDOWS_MAX = 2048
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
        """The launches of these kernels: names as the build's symbols give them (mangled or demangled), compared
        whole (a kernel of ATen or a library is not the candidate's because a name of its own is part of it)."""
        names = frozenset(n for n in kernel_names if n)
        return [k for k in self.kernels if k.name in names]

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


# Kernels that are never held against a candidate (flushes, fills, copies), and library GEMM/convolution/attention
# kernels (the heavy work of most tasks).
ALLOC_KERNEL = re.compile(r"(?i)fill|copy|memset|memcpy|catarray|arange|zero")
HEAVY_KERNEL = re.compile(r"(?i)gemm|cutlass|cublas|xmma|cudnn|conv(?!ert)|fft|flash|fmha|attention")


# GPU records of a trace that are not kernels: the profiler's copy and set activities ("Memcpy HtoD (Pageable ->
# Device)", "Memset (Device)") and, should one be typed CUDA, a runtime call (a bare camel-case name such as
# cudaLaunchKernel). Kernels show as identifiers or demangled signatures, so `cuda_relu_kernel(float*)`, a
# candidate's `cudaRelu(float const*, float*)` and our own `cuda_eval_gate` are kernels.
_NOT_A_KERNEL = re.compile(r"^(Memcpy [A-Za-z]+to[A-Za-z]+\b|Memset \(|cuda[A-Z]\w*$)")


def is_kernel_name(name: str) -> bool:
    """Whether a GPU record of the trace, by its name, is a kernel (see _NOT_A_KERNEL)."""
    return not _NOT_A_KERNEL.match(name)


def _is_kernel_event(ev) -> bool:
    device_type = getattr(ev, "device_type", None)
    return device_type is not None and "CUDA" in str(device_type) and is_kernel_name(ev.name)

