"""Correctness beyond one input distribution (judge process; imports torch): after the ordinary trials pass, more
trials on inputs x * s + m, s and m drawn per trial, on the input leaves where the task allows it. A kernel that is
right only on the task's own distribution (a LayerNorm that skips its statistics, x * w + b, is within tolerance on
randn rows, where the mean is ~0 and the variance ~1) is wrong there; the reference is defined there all the same.

Which leaves change (`plan`), from one draw of the task's inputs:
- floating-point tensors with at least MIN_DISTINCT distinct values in a sample (not index, mask or sign inputs,
  which are integers, booleans or a few values: CrossEntropy's targets, HingeLoss's +-1);
- fewer than MAX_ZERO_FRACTION exact zeros (the task's structure: the triangular matrices of KernelBench L1/14 and
  L1/15, whose honest kernels skip the zero half; a shift would fill it);
- not rows of probabilities (non-negative, each last-dimension row summing to 1: KLDivLoss's inputs);
- a non-negative leaf is shifted up only (a task may need positive inputs: log, sqrt), a signed one either way;
- the task is not in EXCEPTIONS (below, with the reason for each);
and a trial whose reference output holds a non-finite value on the changed inputs is not run (the changed inputs
left the reference's domain: cumulative products that overflow, logs of shifted probabilities).
Shifts are drawn in units of the leaf's standard deviation, scales away from 1 (|s - 1| >= 0.25, |m| >= 0.25 std):
what the shortcut gets wrong is then far outside the tolerance.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any

import torch

MIN_DISTINCT = 16
MAX_ZERO_FRACTION = 0.01
SAMPLE = 65536                  # elements of a leaf looked at (its first ones)
SCALES = ((0.5, 0.8), (1.25, 2.0))
SHIFT_STD = (0.25, 1.0)

# Tasks where an affine change of the inputs is not a fair trial although the rules above allow it, by the hash of
# their source (`source_key`: lines stripped, blank lines dropped), with the reason. KernelBench level 1 and 2 at
# its main; every other task of levels 1 and 2 is covered by the rules (scripts/affine_exceptions.py lists which
# leaves each task changes and why the others do not).
EXCEPTIONS: dict[str, tuple[str, str]] = {
    "278e3f23d2e77e4b490c7b463a9bac02f684535f1b50202c215a9fba60811549": (
        "KernelBench level1/90_cumprod", "a product of 32768 terms: scaled or shifted, it overflows or underflows "
        "within a row, and where it does depends on each kernel's order of multiplication (an honest scan's inf "
        "one element before or after the reference's is a mismatch)"),
}


def source_key(source: str) -> str:
    lines = [line.strip() for line in source.splitlines()]
    return hashlib.sha256("\n".join(x for x in lines if x).encode()).hexdigest()


def exception(source: str) -> tuple[str, str] | None:
    """(task, reason) when the task is on the exception list."""
    return EXCEPTIONS.get(source_key(source))


def leaf_kind(t: Any) -> tuple[str | None, str]:
    """("signed" | "nonnegative", why) for a leaf that may change, (None, why not) otherwise."""
    if not isinstance(t, torch.Tensor):
        return None, "not a tensor"
    if not t.is_floating_point():
        return None, f"{str(t.dtype).replace('torch.', '')} (indices, masks, counts)"
    flat = t.detach().reshape(-1)[:SAMPLE].float()
    if flat.numel() < 2 or not bool(torch.isfinite(flat).all()):
        return None, "too small or not finite"
    if torch.unique(flat).numel() < MIN_DISTINCT:
        return None, f"fewer than {MIN_DISTINCT} distinct values (signs, labels, one-hot)"
    if float((flat == 0).float().mean()) >= MAX_ZERO_FRACTION:
        return None, "structured zeros (triangular, sparse or masked inputs)"
    lo = float(flat.min())
    if lo >= 0 and t.dim() >= 1 and t.shape[-1] > 1:
        rows = t.detach().reshape(-1, t.shape[-1])[:64].double().sum(dim=-1)
        if bool(torch.allclose(rows, torch.ones_like(rows), atol=1e-3)):
            return None, "rows of probabilities"
    return ("nonnegative" if lo >= 0 else "signed"), ""


def plan(inputs: list, source: str) -> tuple[list[tuple[int, str, float]], dict]:
    """([(leaf index, kind, std)], why: {leaf index or "task": reason}) for one draw of the task's inputs."""
    listed = exception(source)
    if listed is not None:
        return [], {"task": f"{listed[0]}: {listed[1]}"}
    leaves, why = [], {}
    for i, t in enumerate(inputs):
        kind, reason = leaf_kind(t)
        if kind is None:
            why[str(i)] = reason
            continue
        std = float(t.detach().reshape(-1)[:SAMPLE].float().std())
        if std > 0:
            leaves.append((i, kind, std))
        else:
            why[str(i)] = "constant"
    return leaves, why


def draw(leaves: list[tuple[int, str, float]], rng: random.Random) -> dict:
    """One trial's change: {"scale": s, "leaves": [[index, shift], ...]} (harness.affine_inputs)."""
    lo, hi = SCALES[rng.randrange(len(SCALES))]
    scale = rng.uniform(lo, hi)
    out = []
    for i, kind, std in leaves:
        shift = rng.uniform(*SHIFT_STD) * std
        if kind == "signed" and rng.random() < 0.5:
            shift = -shift
        out.append([i, shift])
    return {"scale": scale, "leaves": out}


def finite(out: Any) -> bool:
    """Whether every floating-point value of an output is finite."""
    if isinstance(out, torch.Tensor):
        return not out.is_floating_point() or bool(torch.isfinite(out).all())
    if isinstance(out, (list, tuple)):
        return all(finite(x) for x in out)
    return True
