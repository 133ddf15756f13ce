"""Outputs and inputs as both sides handle them: leaves of nested outputs, exact (bitwise) equality, storage overlap
(the judge on the reference's outputs, the worker on the candidate's). Imports torch: judge and worker processes.
"""
from __future__ import annotations

import builtins
from typing import Any

import torch

from cuda_eval.protocol.wire import Opaque, Received

# Captured before any candidate code runs (the worker imports this module first), so a candidate that replaces
# builtins or torch functions cannot change how we compare.
_type = builtins.type
_isinstance = builtins.isinstance
_Tensor = torch.Tensor
POISON_BYTE = 0xFF  # freed memory is filled with it: a float made of it is a NaN, so stale buffers cannot pass
CHUNK_ELEMENTS = 1 << 24  # compared at a time: the float copies of a chunk stay ~0.5 GB whatever the output size


def flatten(obj: Any) -> list:
    """Leaves of a (possibly nested) tuple/list output, in order."""
    if _type(obj) in (tuple, list):
        out = []
        for item in obj:
            out.extend(flatten(item))
        return out
    return [obj]


def tensors_in(obj: Any) -> list[torch.Tensor]:
    return [x for x in flatten(obj) if _isinstance(x, _Tensor)]


def same_scalar(c: Any, r: Any) -> bool:
    if _isinstance(c, _Tensor) or _type(c) in (Received, Opaque):
        return False
    try:
        return bool(c == r) or (c != c and r != r)
    except Exception:  # candidate-made objects may refuse comparison: that is a mismatch, not a crash
        return False


def bitwise_equal(a: Any, b: Any) -> bool:
    """Exact equality of two outputs/input lists, bit for bit (NaNs included)."""
    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if _isinstance(x, _Tensor) != _isinstance(y, _Tensor):
            return False
        if not _isinstance(x, _Tensor):
            if not same_scalar(x, y):
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        bx, by = tensor_bytes(x), tensor_bytes(y)
        step = CHUNK_ELEMENTS * 4      # in chunks: torch.equal's temporary is the size of what it compares
        if any(not torch.equal(bx[i:i + step], by[i:i + step]) for i in range(0, bx.numel(), step)):
            return False
    return True


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) byte range of the memory a tensor's storage owns."""
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def overlaps(t: torch.Tensor, others: list[torch.Tensor]) -> bool:
    a0, a1 = storage_span(t)
    if a1 == a0:
        return False
    for o in others:
        b0, b1 = storage_span(o)
        if b1 > b0 and a0 < b1 and b0 < a1 and o.device == t.device:
            return True
    return False
