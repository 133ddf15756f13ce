"""The group timing protocol: groups of calls behind a gate, their replays, the judge's wall clock and the physics
floor that bound the reported time, and KernelBench's own protocol. A part of the judge's Job (judge/job.py), by
role: its methods run on the Job.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import statistics
import time
from typing import Any

import torch

from cuda_eval.judge import cpu_clock, floor
from cuda_eval.judge.compare import compare_outputs
from cuda_eval.judge.shared import GATE_MAX_MS, REFERENCE_PROFILES_KEPT, WorkerLost, _EmptyTensor, _monotonic
from cuda_eval.protocol import channel, harness, timing
from cuda_eval.protocol.harness import TIMING_SEED, format_exception, map_tree, tree_nbytes


ESTIMATE_REPS = 3
# The group protocol (docs/EVALUATOR.md, "Timing").
GROUP_MAX = 32                # calls per group (a stream's launch queue holds ~1000 entries; ~30 per call at most)
GATE_RETRIES = 3              # a group whose gate opened too early is measured again (new inputs), this many times
REVEALS = 3                   # groups of the timing phase in which one call's output is checked (picked afterwards)
WALL_TOLERANCE = 1.15         # the time that enters the reward is at least (time the wall clock proves) / this ...
GROUP_JITTER_S = {"cuda": 0.0005, "cpu": 0.002}   # ... allowing this much per group for what the replay lacks (the
#   messages, the worker's bookkeeping) and scheduling noise, whatever the kernel trace says. On an H100 honest groups
#   differed from their replays by a few ms either way (-37 to +9 ms; docs/LOG.md, 2026-11-27, "4 x H100, second
#   run"): summed over a job, that raised honest short kernels' times. What the clock proves is therefore the least
#   time per call over the timed groups (bound_by_wall), not their sum: a forged clock slows no group's wall time,
#   and noise raises an honest time only if every group of the job ran slower than its replay by the allowance.
FLAG_FACTOR = 3.0             # timing_inconsistent: the wall clock proves this many times the reported time ...
FLAG_MIN_EXCESS_S = 0.05      # ... and at least this much unreported time in all
FLOOR_FRACTION = 0.5          # ... or the reported time is below this share of an empty call's in the same protocol
# KernelBench's protocol (the kernelbench timing method): its wall-clock bound, kept as it was.
WALL_SLACK = 3.0              # the timed loop may take this many times the time the reported reps account for ...
WALL_FIXED_S = 0.1            # ... plus this (process scheduling, the messages)
_NEEDS: dict[str, floor.Needs] = {}        # what a call of a task must move and compute, once per task and judge


def _process_tree_cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds of `pid` and its descendants, exited threads and reaped children included (cpu_clock.py)."""
    return cpu_clock.process_tree_cpu_ns(pid)


def _chunks(total: int, size: int) -> list[int]:
    """`total` calls in groups of at most `size`, as even as possible."""
    if total <= 0:
        return []
    groups = -(-total // size)
    return [total // groups + (1 if i < total % groups else 0) for i in range(groups)]


def _allocate(template: Any, device: torch.device) -> Any:
    """`template` with every _EmptyTensor made an uninitialised tensor on `device`."""
    if type(template) is _EmptyTensor:
        return torch.empty_strided(template.shape, template.stride, dtype=template.dtype, device=device)
    if type(template) in (tuple, list):
        return type(template)(_allocate(x, device) for x in template)
    return template


class GroupTiming:
    """The Job's methods of this role (judge/job.py assembles the Job from these classes)."""

    # groups of calls: the only way the candidate is called for the verdict
    def _seeds(self, n: int) -> list[int]:
        """Fresh input seeds, unknown to the worker until the group is sent."""
        return [int.from_bytes(os.urandom(4), "little") & 0x3FFFFFFF for _ in range(n)]

    def _send_group(self, seeds: list[int], checks: bool = False, change: dict | None = None) -> tuple[float, int | None]:
        started = (_monotonic(), self._worker_cpu_ns())
        extra = {"affine": change} if change else {}
        self.send("run", seeds=seeds, method=self.group_method, gate_ms=round(self.gate_ms, 4), key=self.digest_key,
                  checks=checks, **extra)
        return started

    def _worker_cpu_ns(self) -> int | None:
        """CPU time of the worker's processes (kernel accounting: the candidate cannot change it), on the CPU device
        only, where the candidate's work is CPU time: unlike the wall clock, it does not grow while a loaded machine
        keeps the worker waiting. None where it cannot be read (then the wall clock is used)."""
        if self.device.type != "cpu" or self.worker_pid is None:
            return None
        return _process_tree_cpu_ns(self.worker_pid)

    def _recv_group(self, seeds: list[int], started: tuple[float, int | None]) -> dict:
        """The worker's answer for one group: a time and a committed digest per call (validated: untrusted)."""
        reply, _ = self.recv("ran")
        cpu_now = self._worker_cpu_ns() if started[1] is not None else None
        group = {"seeds": seeds, "n": len(seeds), "wall_s": _monotonic() - started[0], "gate_ms": self.gate_ms}
        if cpu_now is not None:
            group["cpu_s"] = (cpu_now - started[1]) / 1e9
        if reply.get("not_plain"):
            group["not_plain"] = str(reply["not_plain"])[:200]
            return group
        times, digests, n = reply.get("times"), reply.get("digests"), len(seeds)
        if not isinstance(times, list) or len(times) != n or \
                not all(isinstance(channel.finite(x), float) and x > 0 for x in times):
            raise WorkerLost("protocol", f"the worker reported {str(times)[:80]} instead of {n} positive times")
        if not isinstance(digests, list) or len(digests) != n or \
                not all(isinstance(d, str) and len(d) == 32 for d in digests):
            raise WorkerLost("protocol", f"the worker committed {str(digests)[:80]} instead of {n} digests")
        host_ms = channel.finite(reply.get("host_ms"))
        group.update(times=[float(x) for x in times], digests=digests, held=reply.get("held") is True,
                     host_ms=float(host_ms) if isinstance(host_ms, float) else 0.0)
        self.groups.append(group)
        self.digests.extend(digests)
        return group

    # timing
    def timing_sets(self) -> int:
        if self.timing_config.method == "kernelbench":
            return 1  # KernelBench times one input set
        per_set = max(1, tree_nbytes(self.inputs(self.seed + TIMING_SEED)))
        budget = self.settings.timing_inputs_max_bytes
        return max(1, min(self.settings.timing_input_sets, budget // per_set))

    def time_candidate(self) -> None:
        """The candidate's time under the group protocol (docs/EVALUATOR.md, "Timing"); KernelBench's own protocol for
        the kernelbench method. The judge holds the device lock throughout: nothing else times meanwhile."""
        if self.timing_config.method == "kernelbench":
            self._time_candidate_kernelbench()
            return
        tcfg, size = self.timing_config, self._group_size()
        self.retries = 0
        waited = _monotonic()
        try:
            with self.device.exclusive(self.deadline):
                self.meta["timing_lock_wait_s"] = round(self.meta.get("timing_lock_wait_s", 0.0)
                                                        + _monotonic() - waited, 4)
                # The estimate (1 warm-up + ESTIMATE_REPS calls) only plans the repetitions. In groups of `size`
                # too: a group's inputs and outputs are all alive at once (4 calls of an 8 GiB task: 64 GiB).
                estimate = []
                for n in _chunks(1 + ESTIMATE_REPS, size):
                    group = self._timing_group(n, reveal=False, replay=False)
                    if group is None:
                        return
                    estimate += group["times"]
                warmup, reps = tcfg.plan(timing.stats(estimate[1:])["median_ms"])
                plan = [("warmup", n) for n in _chunks(warmup, size)] + [("timed", n) for n in _chunks(reps, size)]
                # Which groups show one of their outputs is decided here and told to nobody: the worker learns it
                # only after it has committed to every output of the group.
                shown = set(secrets.SystemRandom().sample(range(len(plan)), min(REVEALS, len(plan))))
                groups = []
                for i, (kind, n) in enumerate(plan):
                    group = self._timing_group(n, reveal=i in shown, replay=kind == "timed")
                    if group is None:
                        return
                    groups.append(dict(group, kind=kind))
        except TimeoutError as e:
            raise WorkerLost("timeout", str(e))
        self._conclude_timing(groups, warmup, reps)

    def _group_size(self) -> int:
        """Calls per group: the inputs and outputs of a whole group live at once (in the worker, then in the judge's
        replay), within timing_inputs_max_bytes."""
        budget = self.settings.timing_inputs_max_bytes
        return max(1, min(GROUP_MAX, budget // max(1, self.input_bytes + self.output_bytes)))

    def _timing_group(self, n: int, *, reveal: bool, replay: bool) -> dict | None:
        """One group of the timing phase on fresh inputs; measured again behind a longer gate (and on new inputs: an
        answer prepared during the failed attempt is of no use) while the worker says its gate opened before it had
        queued the group. Then one call's output checked (reveal), and the group replayed here with an empty forward
        (replay: its protocol's own wall time). None when the outputs were not plain tensors (flagged)."""
        for attempt in range(GATE_RETRIES + 1):
            seeds = self._seeds(n)
            group = self._recv_group(seeds, self._send_group(seeds))
            if group.get("not_plain"):
                self.flag("output_not_plain_tensor", f"forward returned {group['not_plain']} during timing")
                self.timing = None
                return None
            if group["held"] or self.group_method != "gated" or attempt == GATE_RETRIES:
                break
            self._release()
            self.retries += 1
            self.gate_ms = min(GATE_MAX_MS, max(2.0 * self.gate_ms, 2.0 * group["host_ms"]))
        if reveal:
            j = secrets.randbelow(n)
            out_c = self._reveal(group, j)
            if out_c is not None:
                self._check_revealed(group, j, out_c)
        else:
            self._release()
        if replay:
            group["replay"] = self._replay(n, group["gate_ms"])
        return group

    def _replay(self, n: int, gate_ms: float) -> dict:
        """The judge's own run of one group, the same code with an empty forward (outputs allocated, never written):
        its wall and CPU seconds (what the protocol itself costs now, inputs and digests included) and an empty
        call's median time."""
        template, started, cpu = self.output_template, _monotonic(), time.process_time()
        # A gate of the GPU's global timer lasts its length to the microsecond: it is added, not spun (the judge's
        # own host queues a group of empty calls well within it). A cycle-counted one is spun: its length varies.
        exact_gate = self.device.type == "cuda" and self.device.kernels.backend == "nvrtc"
        seeds = self._seeds(n)
        inputs = [self.inputs(x) for x in seeds]
        device = self.device.torch_device
        outs, times, _ = harness.run_group(self.device, lambda k: _allocate(template, device), n,
                                           method=self.group_method, gate_ms=0.0 if exact_gate else gate_ms)
        self.device.kernels.digests(outs, self.digest_key)
        del inputs, outs
        gate_s = gate_ms / 1e3 if exact_gate and self.group_method == "gated" else 0.0
        # An ungated replay's empty calls time the host's launch gaps, not an empty call behind a gate: no floor.
        return {"wall_s": _monotonic() - started + gate_s, "cpu_s": time.process_time() - cpu,
                "empty_ms": timing.stats(times)["median_ms"], "gated": not exact_gate}

    def _conclude_timing(self, groups: list[dict], warmup: int, reps: int) -> None:
        """The reported times, and what the judge's clock measured of them (bound_by_wall decides what it proves,
        once it is known whether the kernel trace judged the calls)."""
        timed = [g for g in groups if g["kind"] == "timed"]
        times = [t for g in timed for t in g["times"]]
        reported = timing.stats(times)
        # The clock: the worker's CPU time on the CPU device (where its work is CPU time), else the wall clock.
        clock = "cpu_s" if all("cpu_s" in g for g in timed) else "wall_s"
        for g in timed:
            g["overhead_s"], g["empty_ms"] = g["replay"][clock], g["replay"]["empty_ms"]
        median = reported["median_ms"]
        self._wall = {"clock": clock, "wall_s": sum(g[clock] for g in timed),
                      "overhead_s": sum(g["replay"][clock] for g in timed), "groups": len(timed),
                      "calls": len(times), "reported_s": sum(times) / 1e3,
                      # per timed group: (its clock's seconds less its replay's, calls)
                      "per_group": [(g[clock] - g["replay"][clock], g["n"]) for g in timed if g["n"]],
                      "floor_ms": statistics.median(g["empty_ms"] for g in timed),
                      # an ungated replay's empty calls time the host's launch gaps, not an empty call behind a gate
                      "floor_known": all(g["replay"].get("gated", True) for g in timed)}
        self.timing = dict(reported, reps=reps, warmup=warmup, input_sets=len(times) + warmup,
                           timer=timing.timer_name(self.device.timer_for(self.group_method)),
                           reported_median_ms=median, median_ms=median, capped=False)
        if self.group_method == "gated" and self.device.type == "cuda":
            self.timing["gate"] = {"gate_ms": round(self.gate_ms, 3), "retries": self.retries,
                                   "held": sum(g.get("held", False) for g in groups), "groups": len(groups)}
        self.meta["timing_check"] = [{"kind": g["kind"], "calls": g["n"], "wall_s": round(g["wall_s"], 5),
                                      "cpu_s": round(g["cpu_s"], 5) if "cpu_s" in g else None,
                                      "overhead_s": round(g.get("overhead_s", 0.0), 5),
                                      "reported_s": round(sum(g["times"]) / 1e3, 5), "gate_ms": g["gate_ms"],
                                      "held": g.get("held")} for g in groups]

    def bound_by_wall(self, traced: bool) -> None:
        """What the judge's clock proves: in each timed group, its wall time less its replay's (the protocol's own
        cost) and an allowance per group is time the candidate's calls took; the least of these per call, over the
        timed groups, is the proven time. The time that enters the reward is at least that proven time over
        WALL_TOLERANCE, so a forged clock gains at most that tolerance; a gross or impossible report is flagged.
        traced: whether the kernel trace judged every group (recorded only: the allowance is the same either way,
        since a trace comes from the candidate's process)."""
        w, t = getattr(self, "_wall", None), self.timing
        if not w or not t or not w["calls"]:
            return
        self._bound_by_physics()
        per_group = GROUP_JITTER_S.get(self.device.type, 0.001)
        allowance = per_group * w["groups"]
        proven_ms = min(max(0.0, g - per_group) / n for g, n in w["per_group"]) * 1e3 if w["per_group"] else 0.0
        proven_s = proven_ms * w["calls"] / 1e3
        median = t["reported_median_ms"]
        if proven_ms / WALL_TOLERANCE > t["median_ms"]:
            t["median_ms"], t["capped"] = proven_ms / WALL_TOLERANCE, True
        t["wall_proven_ms"] = round(proven_ms, 6)
        self.meta["wall_bound"] = dict(self.meta.get("wall_bound") or {},
                                       clock="worker CPU time" if w["clock"] == "cpu_s" else "wall",
                                       wall_s=round(w["wall_s"], 5), overhead_s=round(w["overhead_s"], 5),
                                       allowance_s=round(allowance, 5), proven_ms=round(proven_ms, 6),
                                       reported_median_ms=median, tolerance=WALL_TOLERANCE,
                                       trace="judged every group" if traced else "absent",
                                       empty_call_ms=round(w["floor_ms"], 6) if w["floor_known"] else None,
                                       capped=t["capped"])
        if proven_ms > FLAG_FACTOR * median and proven_s - w["reported_s"] > FLAG_MIN_EXCESS_S:
            self.flag("timing_inconsistent", f"the timed calls took {proven_ms:.4g} ms each on the judge's clock "
                                             "(its own cost of the protocol deducted), but were reported as "
                                             f"{median:.4g} ms")
        elif w["floor_known"] and median < FLOOR_FRACTION * w["floor_ms"]:
            self.flag("timing_inconsistent", f"a call was reported as {median:.4g} ms, less than an empty call takes "
                                             f"in the same protocol ({w['floor_ms']:.4g} ms)")

    def _task_needs(self, clone_inputs: bool) -> floor.Needs | None:
        """What a call of the task must move and compute at the least (floor.needs), once per task and judge; None
        where the reference cannot be traced for it (meta says why: no floor, no roofline then)."""
        key = hashlib.sha256(self.payload.task_source.encode()).hexdigest() + f"|{self.seed}"
        if key not in _NEEDS:
            copy = (lambda x: map_tree(x, lambda t: t.clone())) if clone_inputs else (lambda x: x)
            try:
                found = floor.needs(lambda inputs: self.reference(copy(inputs), self.seed),
                                    self.inputs(self.seed - 1), lambda: self.inputs(self.seed - 3),
                                    list(self.ref_model.parameters()) + list(self.ref_model.buffers()), self._digest)
            except Exception as e:  # noqa: BLE001 - a reference our dispatch modes cannot follow (its own runs passed
                #                               already): no floor and no roofline, said so; never the task's verdict
                self.meta["needs_error"] = format_exception(e, "tracing what the reference reads")[:300]
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                return None
            if len(_NEEDS) >= REFERENCE_PROFILES_KEPT:
                _NEEDS.pop(next(iter(_NEEDS)))
            _NEEDS[key] = found
        return _NEEDS[key]

    def _bound_by_physics(self) -> None:
        """A bound the judge owns, whatever the worker reports (its clock, its kernel trace): a call writes its outputs
        and reads the inputs and weights they depend on (floor.needs), and the card moves bytes no faster than
        floor.MARGIN x the copy bandwidth the judge measured at start-up. A report below that time is
        faster_than_hardware, and the reward's time is at least that (on a GPU; a CPU's cores share no such
        measured bound)."""
        needs = getattr(self, "needs", None)
        bandwidth = self.device.info.get("copy_bytes_per_s") if self.device.type == "cuda" else None
        if needs is None or not bandwidth:
            return
        floor_ms = floor.floor_ms(needs.bytes, bandwidth, self.device.info.get("l2_bytes"))
        t = self.timing
        t["floor_ms"] = round(floor_ms, 6)
        if floor_ms > t["median_ms"]:
            t["median_ms"], t["capped"] = floor_ms, True
        if floor_ms > 0 and t["reported_median_ms"] < floor_ms:
            self.flag("faster_than_hardware", f"a call was reported as {t['reported_median_ms']:.4g} ms, less than "
                      f"moving what it must takes on this card: {needs.bytes / 1e6:.1f} MB (outputs written, inputs "
                      f"and weights they depend on read) at {floor.MARGIN}x its copy bandwidth of "
                      f"{bandwidth / 1e12:.2f} TB/s, beyond {floor.L2_COPIES} L2's worth: {floor_ms:.4g} ms")

    def set_peak_fraction(self) -> None:
        """timing.peak_fraction: the share of the roofline (bytes at the copy bandwidth, FLOPs at the tensor-core
        peak) the candidate's time reached; the reference's in meta.roofline."""
        needs, t = getattr(self, "needs", None), self.timing
        if needs is None or not t or not isinstance(t.get("median_ms"), (int, float)):
            return
        info = self.device.info
        roof = floor.roofline_ms(needs.bytes, needs.flops, info.get("copy_bytes_per_s"),
                                 info.get("tensor_flops_per_s"))
        fraction = floor.peak_fraction(roof, t["median_ms"])
        if fraction is None:
            return
        t["peak_fraction"] = round(fraction, 4)
        ref = floor.peak_fraction(roof, (self.ref_timing or {}).get("median_ms"))
        self.meta["roofline"] = dict(needs.to_dict(), roofline_ms=round(roof, 6),
                                     copy_bytes_per_s=info.get("copy_bytes_per_s"),
                                     tensor_flops_per_s=info.get("tensor_flops_per_s"),
                                     reference_peak_fraction=round(ref, 4) if ref is not None else None)

    def _time_candidate_kernelbench(self) -> None:
        """KernelBench's protocol (its numbers stay comparable with papers): the worker times its own loop on one
        input set from a seed it learns only now; the judge bounds the loop with its clock and checks the output of
        the last call. What this finds is advisory under the kernelbench profile."""
        tcfg, n_sets = self.timing_config, self.n_sets
        self.timing_seed = int.from_bytes(os.urandom(4), "little") & 0x3FFFFFFF
        self.ask("timing_sets", "ok", n_sets=n_sets, seed=self.timing_seed)
        waited = _monotonic()
        try:
            with self.device.exclusive(self.deadline):
                self.meta["timing_lock_wait_s"] = round(self.meta.get("timing_lock_wait_s", 0.0)
                                                        + _monotonic() - waited, 4)
                warmup, reps = tcfg.plan(0.0)
                loop = self._timed_loop(tcfg.method, warmup, reps)
        except TimeoutError as e:
            raise WorkerLost("timeout", str(e))
        self.timing = timing.stats(loop["times"])
        self.timing.update(reps=reps, warmup=warmup, input_sets=n_sets, timer=loop["timer"])
        if self.rng_dependent:
            self.meta["timed_output_check"] = "skipped: the reference's output depends on the random state"
            return
        reply, blobs = self._ask_output("timed_output")
        if reply.get("not_plain"):
            self.flag("output_not_plain_tensor", f"forward returned {str(reply['not_plain'])[:200]}")
            return
        out_c = self.receive_output(reply, blobs)
        last_set = (warmup + reps - 1) % n_sets
        out_r = self.reference(self.inputs(self.timing_seed + last_set), self.seed)
        result = compare_outputs(out_c, out_r, atol=self.atol, rtol=self.rtol, strict_fp32=self.strict)
        self.meta["timed_output_check"] = "passed" if result["passed"] else "failed"
        if not result["passed"]:
            self.flag("timed_output_mismatch", f"the output of the last timed call (input set {last_set}) is wrong "
                                               f"({result['message']}): the timed calls did not compute the result")

    def _timed_loop(self, method: str, warmup: int, reps: int) -> dict:
        """KernelBench's timed loop in the worker under the judge's clock: the reported times, plus the loop's own
        cost per call (the judge's empty loop, measured at start-up), must account for the wall time."""
        t0 = _monotonic()
        reply, _ = self.ask("time", "timed", method=method, warmup=warmup, reps=reps)
        wall = _monotonic() - t0
        times = reply.get("times")
        if not isinstance(times, list) or len(times) != reps or \
                not all(isinstance(channel.finite(x), float) and x > 0 for x in times):
            raise WorkerLost("protocol", f"the worker reported {str(times)[:80]} instead of {reps} positive times")
        times = [float(x) for x in times]
        median = timing.stats(times)["median_ms"]
        calls = warmup + reps
        overhead_s = calls * self.device.info.get("loop_overhead_ms", 0.05) / 1e3
        accounted = (sum(times) + warmup * median) / 1e3 + overhead_s
        bound = WALL_SLACK * accounted + WALL_FIXED_S
        check = {"method": method, "wall_s": round(wall, 4), "accounted_s": round(accounted, 4),
                 "bound_s": round(bound, 4), "calls": calls}
        self.meta.setdefault("timing_check", []).append(check)
        if wall > bound:
            self.flag("timing_inconsistent", f"a timed loop took {wall:.3f} s on the judge's clock, but its "
                                             f"{calls} calls were reported to take {accounted:.3f} s")
        return {"times": times, "median_ms": median, "wall_s": wall, "timer": str(reply.get("timer", ""))[:40]}
