"""The reference's side of a job: its inputs, its outputs, its time (or a cached one checked again) and its compiled
form's time. A part of the judge's Job (judge/job.py), by role: its methods run on the Job.
"""
from __future__ import annotations

import dataclasses
import json

import torch

from cuda_eval.judge.shared import WorkerLost, _monotonic
from cuda_eval.protocol import channel, timing
from cuda_eval.protocol.harness import TIMING_SEED, ReferenceError_, format_exception, make_inputs, set_seed


REF_DRIFT = 1.5               # a cached reference time is checked before each candidate: off by more = drift
REF_CHECK = timing.TimingConfig(target_s=0.02, warmup_s=0.005, min_reps=5, max_reps=50, min_warmup=2, max_warmup=10)


class ReferenceRun:
    """The Job's methods of this role (judge/job.py assembles the Job from these classes)."""

    def inputs(self, seed: int):
        """The task's get_inputs() under `seed` on our device: its failure (an exception, no memory) is the task's."""
        try:
            return make_inputs(self.task, self.device, seed)
        except Exception as e:
            raise ReferenceError_(format_exception(e, "get_inputs()"))

    def reference(self, inputs, seed: int):
        set_seed(seed)
        try:
            out = self.ref_model(*inputs)
            self.device.sync()
        except BaseException as e:
            raise ReferenceError_(format_exception(e, "reference forward"))
        return out

    def time_reference(self, use_cache: bool) -> None:
        tcfg = self.timing_config = timing.TimingConfig(**dataclasses.asdict(self.settings.timing))
        # Every call of the candidate (trials too) runs in groups timed by this method; KernelBench's own protocol
        # is only for its timing loop.
        self.group_method = tcfg.method if tcfg.method != "kernelbench" else "gated"
        timer = self.timer = self.device.timer_for(tcfg.method)
        n_sets = self.n_sets = self.timing_sets()
        self.meta["timing_input_sets"] = n_sets
        key_parts = [self.device.name, f"torch {torch.__version__}", self.input_dtypes, f"sets {n_sets}",
                     json.dumps(dataclasses.asdict(self.settings.timing), sort_keys=True), timing.timer_name(timer)]
        self.ref_timing_key = " | ".join(key_parts)
        cached = self.payload.ref_timing_cache.get(self.ref_timing_key) if use_cache else None
        if cached is not None and not isinstance(channel.finite((cached or {}).get("median_ms")), float):
            cached = None
        sets = [self.inputs(self.seed + TIMING_SEED + i) for i in range(n_sets)]
        call = lambda i: self.ref_model(*sets[i])  # noqa: E731
        waited = _monotonic()
        try:
            with self.device.exclusive(self.deadline):
                self.meta["timing_lock_wait_s"] = round(_monotonic() - waited, 4)
                if cached:
                    self.ref_timing = cached
                    if not self._cached_reference_holds(cached, call, n_sets):
                        cached = None
                if not cached:
                    try:
                        self.ref_timing = timing.time_rotating(call, n_sets, timer=timer,
                                                               device_type=self.device.type, config=tcfg)
                    except Exception as e:
                        raise ReferenceError_(format_exception(e, "timing the reference"))
                    self.ref_timing_measured = True
        except TimeoutError as e:
            raise WorkerLost("timeout", str(e))
        del sets, call

    def _cached_reference_holds(self, cached: dict, call, n_sets: int) -> bool:
        """A cached reference time is a measurement from another process, maybe under other conditions. A short
        re-timing says whether it still holds:
        - the reference now runs REF_DRIFT x faster: the cached time was taken on a slower GPU state (it would
          inflate every speedup): False, so the reference is timed in full now and the cache updated;
        - REF_DRIFT x slower: the GPU is slower now than when the reference was cached (another process on it, or
          clocks): the cached time is kept, and meta.timing_contended says the speedup is an under-estimate.
        Otherwise the cached time stands."""
        try:
            check = timing.time_rotating(call, n_sets, timer=self.timer, device_type=self.device.type,
                                         config=REF_CHECK)
        except Exception as e:
            raise ReferenceError_(format_exception(e, "re-timing the reference"))
        ratio = check["median_ms"] / max(float(cached["median_ms"]), 1e-9)
        self.meta["ref_check"] = {"cached_ms": cached["median_ms"], "check_ms": round(check["median_ms"], 6),
                                  "ratio": round(ratio, 3)}
        if ratio * REF_DRIFT < 1.0:
            return False
        if ratio > REF_DRIFT:
            self.meta["timing_contended"] = True
        return True

    def _time_compiled_reference(self) -> dict | None:
        """torch.compile(reference) on the timing inputs, with the same timing settings."""
        sets = [self.inputs(self.seed + TIMING_SEED + i) for i in range(self.n_sets)]
        try:
            compiled = torch.compile(self.ref_model)
            for s in sets:           # compiles (CPU-bound, minutes at worst) outside the GPU's timing lock
                compiled(*s)
            with self.device.exclusive():
                return timing.time_rotating(lambda i: compiled(*sets[i]), len(sets), timer=self.device.timer,
                                            device_type=self.device.type, config=self.timing_config)
        except Exception as e:  # torch.compile failing on a task is information, not a verdict
            return {"error": format_exception(e, "torch.compile(reference)")}
