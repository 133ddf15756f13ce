"""Output comparison: is the candidate's output the reference's (the judge only; imports torch).

`compare_outputs` implements KernelBench's rule (|c - r| <= atol + rtol * |r|, exact shapes) made stricter where
KernelBench is lax: dtypes must match, NaN/Inf must appear exactly where the reference has them, integer and bool
outputs must be equal, and nested outputs (tuples/lists) must have the same structure.
"""
from __future__ import annotations

import builtins
from typing import Any

import torch

from cuda_eval.protocol import wire
from cuda_eval.protocol.tensors import CHUNK_ELEMENTS, POISON_BYTE, bitwise_equal, flatten, same_scalar, tensor_bytes
from cuda_eval.protocol.wire import Opaque, Received

_type = builtins.type
_isinstance = builtins.isinstance
_Tensor = torch.Tensor
_float_dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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
            if not same_scalar(c, r):
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


def poison_fraction(t: torch.Tensor) -> float:
    """Fraction of a float tensor's elements whose bytes are all POISON_BYTE: memory the candidate never wrote."""
    if t.dtype not in _float_dtypes or t.numel() == 0:
        return 0.0
    raw = tensor_bytes(t).view(-1, t.element_size())
    poisoned = 0
    for start in range(0, raw.shape[0], CHUNK_ELEMENTS):  # chunks: no temporaries the size of a multi-GB output
        poisoned += int((raw[start:start + CHUNK_ELEMENTS] == POISON_BYTE).all(dim=1).sum().item())
    return poisoned / raw.shape[0]


# --- samples: an earlier output recognised without keeping it -------------------------------------------------
SAMPLE_POSITIONS = 4096


def output_sample(out: Any) -> tuple | None:
    """Shape, dtype and the bytes at SAMPLE_POSITIONS evenly spaced elements of every output tensor: enough to
    recognise an earlier trial's output among fresh random inputs without keeping every output in memory."""
    parts = []
    for x in flatten(out):
        if not isinstance(x, wire.Received):
            parts.append(("value", repr(x)))
            continue
        flat = x.tensor.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLE_POSITIONS)
        picked = flat[::step][:SAMPLE_POSITIONS].contiguous().cpu()
        parts.append((tuple(x.tensor.shape), str(x.tensor.dtype), picked.view(torch.uint8).numpy().tobytes()
                      if picked.numel() else b""))
    return tuple(parts) if parts else None


def sampled(out: Any) -> Any:
    """`out` with every tensor replaced by its elements at SAMPLE_POSITIONS evenly spaced flat positions (gathered
    by index: no copy of a whole non-contiguous tensor), on the tensor's device; other leaves kept."""
    def sample(t: torch.Tensor) -> torch.Tensor:
        n = t.numel()
        if n == 0 or t.dim() == 0:
            return t.detach().reshape(-1).clone()
        flat = torch.arange(0, n, max(1, n // SAMPLE_POSITIONS), device=t.device)[:SAMPLE_POSITIONS]
        return t.detach()[torch.unravel_index(flat, t.shape)]

    def walk(x: Any) -> Any:
        if type(x) in (tuple, list):
            return type(x)(walk(i) for i in x)
        if isinstance(x, wire.Received):
            return wire.Received(sample(x.tensor), x.device)
        if isinstance(x, torch.Tensor):
            return sample(x)
        return x
    return walk(out)


def same_bytes(a: Any, b: Any) -> bool:
    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, wire.Received) and isinstance(y, wire.Received):
            # one may be a device snapshot and the other a host copy (the worker chooses how it sends)
            if x.tensor.shape != y.tensor.shape or x.tensor.dtype != y.tensor.dtype or \
                    not bitwise_equal(x.tensor, y.tensor.to(x.tensor.device)):
                return False
        elif isinstance(x, wire.Received) or isinstance(y, wire.Received) or x != y:
            return False
    return True
