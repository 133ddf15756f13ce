"""Verdicts from the candidate's kernels: those its built binary holds and the kernel trace of its timed calls. A part
of the judge's Job (judge/job.py), by role: its methods run on the Job.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any

from cuda_eval.judge.group_timing import WALL_TOLERANCE
from cuda_eval.judge.shared import REFERENCE_PROFILES_KEPT
from cuda_eval.protocol import tracing
from cuda_eval.protocol.harness import TIMING_SEED
from cuda_eval.protocol.job import kernels_known


TRACE_SLACK_MS = 0.002        # kernel trace: GPU time per call allowed beyond the reported time (timestamp noise)
_REFERENCE_KERNELS: dict[str, list] = {}   # the kernels a task's reference launches, traced once per task and judge


def _busy_ms(window: Any) -> float | None:
    """A trace window's GPU milliseconds (worker meta: [busy_ms, own kernels, kernels]), None unless a finite number
    >= 0 (the worker is in the candidate's process: anything else is a broken or forged trace, not our error)."""
    if not isinstance(window, list) or not window or isinstance(window[0], bool) or \
            not isinstance(window[0], (int, float)):
        return None
    try:
        busy = float(window[0])
    except (TypeError, ValueError, OverflowError):
        return None
    return busy if math.isfinite(busy) and busy >= 0 else None


class TraceVerdicts:
    """The Job's methods of this role (judge/job.py assembles the Job from these classes)."""

    def kernels_known(self) -> bool:
        """Whether every kernel the program has is known: the compile stage read each built extension's device code
        (protocol/job.py) and no build at run time left it unread (the worker says so: it can only turn the kernel
        checks off, as a forged trace can)."""
        return kernels_known(self.modules) and self.meta.get("kernels_known") is not False

    def check_built_kernels(self) -> None:
        """On a GPU, a program whose built extensions hold no kernel (their device code, read by the compile stage
        from the files it built) runs no kernel of its own, whatever its source says: decided here, not by the
        worker. A program that built an extension at run time (the worker says so: it can only turn this check off,
        as a forged trace can) is left to the trace's and the worker's checks, which know that build's kernels."""
        if self.device.type == "cuda" and self.settings.dynamic.require_custom_kernel and not self.kernel_names \
                and kernels_known(self.modules) and not self.meta.get("runtime_builds"):
            self.flag("no_custom_kernel", "the program's built extensions hold no CUDA kernel (their device code, "
                                          "read from the built files)")

    def judge_call_trace(self) -> bool:
        """The kernel trace of every call (worker meta call_windows: one window per group, in order): the GPU time of
        the candidate's kernels must not exceed what it reported, each group must launch the program's own kernels,
        and the reference's kernels or library GEMM/convolution kernels may not run in a call. Returns whether the
        trace judged every group (then it bounds the reward's time; otherwise the judge's clock does, tightly)."""
        windows = self.meta.get("call_windows")
        if self.meta.get("call_trace_skipped") or not isinstance(windows, list):
            return False
        if len(windows) != len(self.groups) or not all(_busy_ms(w) is not None for w in windows):
            self.flag("timing_inconsistent", f"the kernel trace of the calls shows {len(windows)} groups where "
                                             f"{len(self.groups)} ran (a kernel named like ours, or a broken trace)")
            return False
        busy = sum(_busy_ms(w) for w in windows)
        reported = sum(sum(g["times"]) for g in self.groups)
        calls = sum(g["n"] for g in self.groups)
        self.meta["call_trace"] = {"busy_ms": round(busy, 4), "reported_ms": round(reported, 4), "calls": calls}
        self._cap_by_trace(busy, calls)
        if busy > WALL_TOLERANCE * reported + TRACE_SLACK_MS * calls:
            self.flag("timing_inconsistent", f"the GPU ran the candidate's kernels for {busy:.4g} ms during calls "
                                             f"reported as {reported:.4g} ms in all (kernel trace)")
        if self.kernels_known() and self.settings.dynamic.require_custom_kernel:
            missing = sum(1 for w in windows if isinstance(w, list) and len(w) > 1 and not w[1])
            if missing:
                self.flag("no_custom_kernel", f"in {missing} of {len(windows)} groups of calls none of the program's "
                                              "kernels ran on the GPU (kernel trace)")
        foreign = self.meta.get("call_foreign_kernels") or {}
        ref_kernels = set(self._reference_kernels())
        shared = [n for n in foreign if n in ref_kernels]
        if shared and self.settings.dynamic.forbid_reference_ops:
            self.flag("reference_op", f"forward ran the reference's own GPU kernels: {shared[0][:120]}")
        unsynced = sum(w[3] for w in windows if len(w) > 3 and type(w[3]) is int and w[3] > 0)
        if unsynced:
            self.flag("unsynced_stream", f"{unsynced} kernel(s) of the calls ran on another stream without being "
                                         "ordered within their call (started before the current stream's earlier "
                                         "work ended, or still ran after the call had ended: kernel trace)")
        heavy = [n for n in foreign if tracing.HEAVY_KERNEL.search(n)]
        if heavy and self.settings.dynamic.forbid_library_heavy_ops:
            self.flag("library_heavy_op", f"forward ran library GEMM/convolution kernels: {heavy[0][:120]}")
        return True

    def _cap_by_trace(self, busy_ms: float, calls: int) -> None:
        """The GPU time of the candidate's kernels in the trace bounds the reward's time as the wall clock does: the
        mean GPU time per call (every call traced, none told apart from the timed ones), less WALL_TOLERANCE, is the
        least time that enters the reward, however the reported times are spread."""
        t = getattr(self, "timing", None)
        if not t or calls <= 0:
            return
        traced_ms = busy_ms / calls / WALL_TOLERANCE
        t["trace_proven_ms"] = round(traced_ms, 6)
        if traced_ms > t["median_ms"]:
            t["median_ms"], t["capped"] = traced_ms, True
            self.meta.setdefault("wall_bound", {})["capped_by_trace"] = True

    def _reference_kernels(self) -> list[str]:
        """Names of the compute kernels the reference launches (one traced forward, once per task and judge)."""
        if self.device.type != "cuda":
            return []
        key = hashlib.sha256(self.payload.task_source.encode()).hexdigest() + f"|{self.seed}"
        if key not in _REFERENCE_KERNELS:
            try:
                inputs = self.inputs(self.seed + TIMING_SEED)
                with tracing.KernelTrace() as trace:
                    self.reference(inputs, self.seed)
                names = sorted({k.name[:200] for k in trace.kernels if not tracing.ALLOC_KERNEL.search(k.name)})
            except Exception as e:  # noqa: BLE001 - no CUPTI in the judge: the kernel-name check is skipped
                self.meta["reference_kernels_error"] = f"{type(e).__name__}: {e}"[:300]
                return []
            if len(_REFERENCE_KERNELS) >= REFERENCE_PROFILES_KEPT:
                _REFERENCE_KERNELS.pop(next(iter(_REFERENCE_KERNELS)))
            _REFERENCE_KERNELS[key] = names
        return _REFERENCE_KERNELS[key]
