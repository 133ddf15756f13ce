"""Profile feedback: the candidate's and the reference's kernel profiles and the device's facts (advisory, after the
verdict). A part of the judge's Job (judge/job.py), by role: its methods run on the Job.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

from cuda_eval.judge.shared import CONTROL_MESSAGE_BYTES, REFERENCE_PROFILES_KEPT, WorkerLost, _monotonic
from cuda_eval.profile import kernel_profile, kernel_profiler
from cuda_eval.protocol import channel, timing
from cuda_eval.protocol.channel import ChannelError
from cuda_eval.protocol.harness import TIMING_SEED, CandidateError, format_exception, set_seed, tree_nbytes


_REFERENCE_PROFILES: dict[str, dict] = {}
_DEVICE_FACTS: dict = {}       # copy bandwidth and occupancy limits, measured at the first profile


class Profiles:
    """The Job's methods of this role (judge/job.py assembles the Job from these classes)."""

    # profile feedback (advisory: nothing here changes the verdict)
    def kernel_profile(self) -> dict:
        """meta["kernel_profile"]: the candidate's kernels (profiled in its worker), the reference's (here, once per
        task and judge), the whole forward's bytes and FLOPs over the measured times. Never raises: a failed part is
        a reason in the dict ("error" when the candidate's own profile is missing)."""
        started = _monotonic()
        deadline = min(self.deadline, started + self.settings.kernel_profile_timeout_s)
        notes: dict[str, str] = {}
        cost: dict[str, float] = {}
        try:
            facts = self._device_facts(deadline)
        except Exception as e:  # noqa: BLE001
            facts, notes["device"] = {}, f"{type(e).__name__}: {e}"[:300]
        limits = kernel_profile.DeviceLimits.from_dict(facts["limits"]) if facts.get("limits") else None
        t0 = _monotonic()
        resources: dict = {}
        try:
            raw = self._ask_profile(kernel_profiler.forwards_for(float(self.timing["median_ms"])), deadline)
            cand = kernel_profile.sanitize_side(raw)
            if isinstance(raw, dict):
                resources = kernel_profile.sanitize_resources(raw.get("resources"))
                if raw.get("resources_error"):
                    notes["resources"] = str(raw["resources_error"])[:300]
                if isinstance(channel.finite(raw.get("cost_s")), float):
                    cost["worker"] = round(float(raw["cost_s"]), 4)
        except (WorkerLost, CandidateError, ChannelError) as e:
            cand = {"error": f"the worker did not profile the candidate: {getattr(e, 'message', None) or e}"[:500]}
        except Exception as e:  # noqa: BLE001 - a malformed answer, or a bug of ours: a reason, not a verdict
            cand = {"error": f"{type(e).__name__}: {e}"[:500]}
        cost["candidate"] = round(_monotonic() - t0, 4)
        t0 = _monotonic()
        ref = self._reference_profile()
        cost["reference"] = round(_monotonic() - t0, 4)
        if not cand.get("error"):
            kernel_profile.annotate(cand, limits, resources, self.kernel_names)
        side = ref.get("side") or {"error": ref.get("error", "no reference profile")}
        if not side.get("error"):
            side = kernel_profile.annotate(dict(side, kernels=[dict(k) for k in side.get("kernels", [])]), limits)
        out = {"version": kernel_profile.VERSION,
               "device": {"type": self.device.type, "name": self.device.name,
                          "capability": self.device.info.get("capability"), "copy_gbps": facts.get("copy_gbps"),
                          "sm_count": (facts.get("limits") or {}).get("sm_count")},
               "candidate": cand, "reference": dict(side, cached=bool(ref.get("cached"))),
               "forward": kernel_profile.forward_summary(   # no input sizes (the reference failed): no rates
                   time_ms=(self.timing or {}).get("median_ms") if "input_bytes" in ref else None,
                   input_bytes=ref.get("input_bytes", 0),
                   param_bytes=ref.get("param_bytes", 0), output_bytes=self.output_bytes,
                   copy_gbps=facts.get("copy_gbps"), flops=ref.get("flops"),
                   ref_time_ms=(self.ref_timing or {}).get("median_ms")),
               "notes": notes, "cost_s": dict(cost, total=round(_monotonic() - started, 4))}
        if cand.get("error"):
            out["error"] = f"candidate: {cand['error']}"
        return out

    def _ask_profile(self, forwards: int, deadline: float) -> Any:
        """The worker's profile: its answer's flags and meta are not read (nothing after the final checks counts)."""
        self.send("profile", forwards=forwards, tools=self.settings.profile_tools)
        header, _ = channel.recv(self.sock, max_header=CONTROL_MESSAGE_BYTES, deadline=deadline)
        if header.get("op") != "profiled":
            raise WorkerLost("protocol", f"expected 'profiled' from the worker, got {str(header.get('op'))[:40]!r}")
        return header.get("profile")

    def _device_facts(self, deadline: float) -> dict:
        """Copy bandwidth (measured once per judge, at its start on a GPU, else here holding the device lock: no
        timing runs meanwhile) and the occupancy limits of the device."""
        if not _DEVICE_FACTS:
            gbps = (self.device.info.get("copy_bytes_per_s") or 0) / 1e9
            if not gbps:
                with self.device.exclusive(deadline):
                    gbps = kernel_profiler.copy_bandwidth(self.device.type)
            _DEVICE_FACTS.update(copy_gbps=round(gbps, 1) if gbps else None,
                                 limits=kernel_profiler.device_limits(self.device.type))
        return _DEVICE_FACTS

    def _reference_profile(self) -> dict:
        """The reference's profile, FLOPs and bytes: {side, flops, input_bytes, param_bytes, cached} or {error}."""
        key = hashlib.sha256(self.payload.task_source.encode()).hexdigest() + f"|{self.seed}"
        if key in _REFERENCE_PROFILES:
            return dict(_REFERENCE_PROFILES[key], cached=True)
        try:
            inputs = self.inputs(self.seed + TIMING_SEED)

            def call(i: int) -> None:
                set_seed(self.seed)
                self.ref_model(*inputs)

            found: dict[str, Any] = {"input_bytes": tree_nbytes(inputs),
                                     "param_bytes": kernel_profiler.model_bytes(self.ref_model)}
            try:
                found["flops"] = kernel_profiler.count_flops(lambda: self.ref_model(*inputs))
            except Exception as e:  # noqa: BLE001 - no FLOP count for this task
                found["flops_error"] = f"{type(e).__name__}: {e}"[:200]
            raw = kernel_profiler.profile_forwards(
                call, kernel_profiler.forwards_for(float((self.ref_timing or {}).get("median_ms") or 1.0)),
                device_type=self.device.type, flush_bytes=timing.l2_flush_bytes(self.device.type),
                gate_cycles_per_ms=self.device.info.get("gate_cycles_per_ms"),
                forward_ms=float((self.ref_timing or {}).get("median_ms") or 0.0), workdir=os.getcwd())
            found["side"] = kernel_profile.sanitize_side(raw)
        except BaseException as e:  # noqa: BLE001 - the reference's or our failure: a reason
            return {"error": format_exception(e, "profiling the reference")[:500]}
        if len(_REFERENCE_PROFILES) >= REFERENCE_PROFILES_KEPT:
            _REFERENCE_PROFILES.pop(next(iter(_REFERENCE_PROFILES)))
        _REFERENCE_PROFILES[key] = found
        return dict(found, cached=False)
