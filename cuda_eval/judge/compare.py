"""Output comparison and memory-safety checks of the judge and the worker (imports torch: their processes only).

`compare_outputs` implements KernelBench's rule (|c - r| <= atol + rtol * |r|, exact shapes) made stricter where
KernelBench is lax: dtypes must match, NaN/Inf must appear exactly where the reference has them, integer and bool
outputs must be equal, and nested outputs (tuples/lists) must have the same structure.
"""
from __future__ import annotations

import builtins
from typing import Any

import torch

from cuda_eval.wire import Opaque, Received

# Captured before any candidate code runs (the worker imports this module first), so a candidate that replaces
# builtins or torch functions cannot change how we compare.
_type = builtins.type
_isinstance = builtins.isinstance
_Tensor = torch.Tensor
_float_dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
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


def structure(obj: Any) -> str:
    """A short description of an output's structure, for messages ("tuple(Tensor[2,3] float32, int)")."""
    if _type(obj) in (tuple, list):
        return f"{_type(obj).__name__}({', '.join(structure(o) for o in obj)})"
    if _type(obj) is Received:
        obj = obj.tensor
    if _isinstance(obj, _Tensor):
        return f"Tensor[{','.join(str(s) for s in obj.shape)}] {str(obj.dtype).replace('torch.', '')}"
    if _type(obj) is Opaque:
        return obj.type_name
    return _type(obj).__name__


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


def compare_outputs(cand: Any, ref: Any, *, atol: float, rtol: float, strict_fp32: float | None = None) -> dict:
    """{max_abs_err, max_rel_err, mismatch_frac, passed, message} for one trial. `strict_fp32` replaces atol/rtol
    for float32 outputs (the strict profile)."""
    cand_leaves, ref_leaves = flatten(cand), flatten(ref)
    result = {"max_abs_err": 0.0, "max_rel_err": 0.0, "mismatch_frac": 0.0, "passed": True, "message": None}

    def fail(message: str, frac: float = 1.0) -> dict:
        result.update(passed=False, message=message, mismatch_frac=max(result["mismatch_frac"], frac))
        return result

    if len(cand_leaves) != len(ref_leaves) or (_type(cand) in (tuple, list)) != (_type(ref) in (tuple, list)):
        return fail(f"output structure mismatch: expected {structure(ref)}, got {structure(cand)}")
    total_elems, bad_elems = 0, 0
    for i, (c, r) in enumerate(zip(cand_leaves, ref_leaves)):
        where = f"output {i}: " if len(ref_leaves) > 1 else ""
        if not _isinstance(r, _Tensor):
            if not _same_scalar(c, r):
                return fail(f"{where}expected {r!r}, got {structure(c)}")
            continue
        if _type(c) is Received:  # sent by the candidate's worker: host data, the device type it lived on
            c_device, c = c.device, c.tensor
        elif _type(c) is _Tensor:
            c_device = c.device.type
        else:
            name = c.type_name if _type(c) is Opaque else f"{_type(c).__module__}.{_type(c).__qualname__}"
            return fail(f"{where}expected a torch.Tensor, got {name}")
        if tuple(c.shape) != tuple(r.shape):
            return fail(f"{where}shape mismatch: expected {list(r.shape)}, got {list(c.shape)}")
        if c.dtype != r.dtype:
            return fail(f"{where}dtype mismatch: expected {r.dtype}, got {c.dtype}")
        if c_device != r.device.type:
            return fail(f"{where}device mismatch: expected {r.device.type}, got {c_device}")
        stats = _compare_tensor(c, r, atol=strict_fp32 if strict_fp32 and r.dtype == torch.float32 else atol,
                                rtol=strict_fp32 if strict_fp32 and r.dtype == torch.float32 else rtol)
        result["max_abs_err"] = max(result["max_abs_err"], stats["max_abs_err"])
        result["max_rel_err"] = max(result["max_rel_err"], stats["max_rel_err"])
        total_elems += r.numel()
        bad_elems += stats["bad"]
        if stats["bad"] and result["message"] is None:
            result["message"] = where + stats["message"]
    result["mismatch_frac"] = bad_elems / total_elems if total_elems else 0.0
    result["passed"] = bad_elems == 0 and result["message"] is None
    return result


def _compare_tensor(c: torch.Tensor, r: torch.Tensor, *, atol: float, rtol: float) -> dict:
    """Element-wise comparison in chunks of CHUNK_ELEMENTS (`c` may live on the host: each chunk is moved to r's
    device), so that a multi-GB output needs no multi-GB temporaries."""
    n = r.numel()
    if n == 0:
        return {"max_abs_err": 0.0, "max_rel_err": 0.0, "bad": 0, "message": ""}
    cf, rf = c.reshape(-1), r.reshape(-1)
    parts = []
    for start in range(0, n, CHUNK_ELEMENTS):
        cc = cf[start:start + CHUNK_ELEMENTS]
        if cc.device != rf.device:
            cc = cc.to(rf.device)
        parts.append(_compare_chunk(cc, rf[start:start + CHUNK_ELEMENTS], atol=atol, rtol=rtol))
    bad = sum(p["bad"] for p in parts)
    max_abs = max(p["max_abs_err"] for p in parts)
    max_rel = max(p["max_rel_err"] for p in parts)
    message = ""
    if bad:
        if r.dtype in _float_dtypes or r.is_complex():
            message = (f"{bad} of {n} elements differ (max abs err {max_abs:.3g}, max rel err {max_rel:.3g}, "
                       f"atol={atol:g}, rtol={rtol:g})")
            nonfinite = sum(p["nonfinite"] for p in parts)
            if nonfinite:
                message += f"; {nonfinite} NaN/Inf where the reference has none (or the reverse)"
        else:
            message = f"{bad} of {n} {str(r.dtype).replace('torch.', '')} elements differ"
    return {"max_abs_err": max_abs, "max_rel_err": max_rel, "bad": bad, "message": message}


def _compare_chunk(c: torch.Tensor, r: torch.Tensor, *, atol: float, rtol: float) -> dict:
    if r.dtype in _float_dtypes or r.is_complex():
        work = torch.float64 if r.dtype == torch.float64 else torch.float32
        if r.is_complex():
            c, r = torch.view_as_real(c), torch.view_as_real(r)
        cf, rf = c.to(work), r.to(work)
        finite_r, finite_c = torch.isfinite(rf), torch.isfinite(cf)
        # Non-finite values must match the reference exactly: NaN where NaN, the same infinity where infinity.
        nonfinite_bad = (finite_r != finite_c) | (~finite_r & ~(torch.isnan(rf) & torch.isnan(cf)) & (cf != rf))
        both = finite_r & finite_c
        diff = torch.where(both, (cf - rf).abs(), torch.zeros_like(rf))
        bad = (both & (diff > atol + rtol * rf.abs())) | nonfinite_bad
        rel = diff / rf.abs().clamp_min(1e-6)
        return {"max_abs_err": float(diff.max().item()), "max_rel_err": float(rel.max().item()),
                "bad": int(bad.sum().item()), "nonfinite": int(nonfinite_bad.sum().item())}
    bad = c != r
    diff = (c.to(torch.float64) - r.to(torch.float64)).abs() if r.dtype != torch.bool else bad.to(torch.float64)
    return {"max_abs_err": float(diff.max().item()),
            "max_rel_err": float((diff / r.to(torch.float64).abs().clamp_min(1)).max()),
            "bad": int(bad.sum().item()), "nonfinite": 0}


def _same_scalar(c: Any, r: Any) -> bool:
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
            if not _same_scalar(x, y):
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        bx, by = _bytes(x), _bytes(y)
        step = CHUNK_ELEMENTS * 4      # in chunks: torch.equal's temporary is the size of what it compares
        if any(not torch.equal(bx[i:i + step], by[i:i + step]) for i in range(0, bx.numel(), step)):
            return False
    return True


def _bytes(t: torch.Tensor) -> torch.Tensor:
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


def poison_fraction(t: torch.Tensor) -> float:
    """Fraction of a float tensor's elements whose bytes are all POISON_BYTE: memory the candidate never wrote."""
    if t.dtype not in _float_dtypes or t.numel() == 0:
        return 0.0
    raw = _bytes(t).view(-1, t.element_size())
    poisoned = 0
    for start in range(0, raw.shape[0], CHUNK_ELEMENTS):  # chunks: no temporaries the size of a multi-GB output
        poisoned += int((raw[start:start + CHUNK_ELEMENTS] == POISON_BYTE).all(dim=1).sum().item())
    return poisoned / raw.shape[0]


def tensors_in(obj: Any) -> list[torch.Tensor]:
    return [x for x in flatten(obj) if _isinstance(x, _Tensor)]
