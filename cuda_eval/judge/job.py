"""One job of the judge (judge/__main__.py, the trusted process the candidate cannot touch).

Per job the pool hands the judge a socket to the candidate's worker (worker/__main__.py, another process under
another uid) and the job. The judge then
 1. loads the task, builds the reference model under the seed and runs it once (its ATen ops, whether it mutates or
    aliases its inputs, its output structure);
 2. times the reference on the timing inputs (or checks a cached time), holding the device lock, before any
    candidate code exists anywhere: only these measurements enter the reference-timing cache;
 3. drives the worker step by step (load, correctness trials, timing, kernel trace, final checks). Every call of the
    candidate is one call of a group (harness.run_group, in the worker): the judge sends the seeds of the group's
    inputs, the worker answers with each call's time and a digest of each output (device_kernels.py), and only
    then does the judge pick the call whose output it checks, if any: a correctness trial is a group of one whose
    output is always checked; for every output it checks, the judge computes the reference output on its own copy
    of the inputs and compares the output the worker sends (wire.py: plain bytes, never pickles) with compare.py,
    after checking it against the digest committed when the call ran;
 4. bounds the candidate's own timing with its own clock: it fixes the groups, their gates and their inputs (fresh
    for every call), measures the wall time of every group, replays each group in its own process with an empty
    forward (the protocol's own cost, measured now, on this device), and takes as the candidate's time at least
    what that wall clock proves; on a GPU the kernel trace of the calls (CUPTI) must account for no more GPU time
    than the candidate reported;
 5. answers the pool with the verdict on its own socket. Nothing the worker writes anywhere else is read.
Profile feedback (a request with feedback="profile", or EvalConfig.kernel_profile): once the verdict is complete
(final checks included), the worker profiles the candidate and the judge the reference (kernel_profiler.py); the
result goes to meta["kernel_profile"] as advisory data and nothing of it, not even a failure, changes the verdict.
What the candidate can still do (checks that run inside its own process, the slack of the bounds) is listed in
docs/EVALUATOR.md, "Trust boundary".
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import secrets
import socket
import statistics
import time
from typing import Any

import torch

from cuda_eval.judge import affine, compare, cpu_clock, floor
from cuda_eval.judge.compare import compare_outputs
from cuda_eval.profile import kernel_profile, kernel_profiler
from cuda_eval.protocol import channel, harness, tensors, timing, tracing, wire
from cuda_eval.protocol.channel import ChannelError
from cuda_eval.protocol.harness import (MAX_ERROR_CHARS, TIMING_SEED, CandidateError, Device, ReferenceError_,
                                        dtype_signature, format_exception, init_inputs, load_task, make_inputs,
                                        map_tree, set_seed, tree_nbytes, trial_seed)
from cuda_eval.protocol.job import JobPayload, kernels_known
from cuda_eval.protocol.tensors import bitwise_equal, tensors_in

_monotonic = time.monotonic
REF_DRIFT = 1.5               # a cached reference time is checked before each candidate: off by more = drift
REF_CHECK = timing.TimingConfig(target_s=0.02, warmup_s=0.005, min_reps=5, max_reps=50, min_warmup=2, max_warmup=10)
ESTIMATE_REPS = 3
# The group protocol (docs/EVALUATOR.md, "Timing").
GROUP_MAX = 32                # calls per group (a stream's launch queue holds ~1000 entries; ~30 per call at most)
GATE_START_MS, GATE_MAX_MS = 1.0, 250.0
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
TRACE_SLACK_MS = 0.002        # kernel trace: GPU time per call allowed beyond the reported time (timestamp noise)
DIGEST_MIN_BYTES = 256        # outputs this small may repeat by chance on fresh inputs: no repeat check
# KernelBench's protocol (the kernelbench timing method): its wall-clock bound, kept as it was.
WALL_SLACK = 3.0              # the timed loop may take this many times the time the reported reps account for ...
WALL_FIXED_S = 0.1            # ... plus this (process scheduling, the messages)
CONTROL_MESSAGE_BYTES = 1 << 20
OUTPUT_SLACK_BYTES = 1 << 16  # the output buffer's room beyond the reference's outputs (a few small extra leaves)
DEVICE_CONTEXTS_BYTES = 2 << 30  # device memory of the CUDA contexts beside the judge's (worker, spares): an estimate
DEVICE_FREE_MARGIN = 4 << 30     # a large output is snapshotted on the card only if this much stays free after it
REFERENCE_PROFILES_KEPT = 256  # reference profiles kept per judge (a task's reference is profiled once per judge)
_REFERENCE_PROFILES: dict[str, dict] = {}
_REFERENCE_KERNELS: dict[str, list] = {}   # the kernels a task's reference launches, traced once per task and judge
_NEEDS: dict[str, floor.Needs] = {}        # what a call of a task must move and compute, once per task and judge
_DEVICE_FACTS: dict = {}       # copy bandwidth and occupancy limits, measured at the first profile
# What a worker may add to the verdict's meta (anything else it sends is dropped: it is candidate-controlled).
WORKER_META = ("extension_functions", "extension_calls", "custom_op_calls", "candidate_ops", "python_ops",
               "python_torch_calls", "new_native_threads", "fork_check", "trace_calls", "kernels", "kernel_streams",
               "own_kernel_launches", "kernel_trace_skipped", "identity_changes", "call_windows", "call_groups",
               "call_foreign_kernels", "call_trace_skipped", "kernels_known")
WORKER_META_ITEMS = {"call_windows": tracing.CALL_WINDOWS_MAX}


class WorkerLost(Exception):
    """The worker stopped answering (crashed, exited, hung) or broke the protocol."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class TaskTooLarge(Exception):
    """The machine cannot hold what judging this task takes (`resource`: "host memory" or "device memory"): a
    task-level verdict, like a reference that runs out of memory, never the candidate's fault or ours."""

    def __init__(self, resource: str, message: str, needed: int | None = None, available: int | None = None):
        super().__init__(message)
        self.resource, self.message, self.needed, self.available = resource, message, needed, available


class Job:
    def __init__(self, payload: dict, device: Device, sock: socket.socket, timeout_s: float,
                 worker_pid: int | None = None, ctl: socket.socket | None = None):
        self.payload = JobPayload.from_dict(payload)   # checked here: a malformed one is our bug (internal error)
        self.worker_pid = worker_pid if isinstance(worker_pid, int) and worker_pid > 0 else None
        self.ctl = ctl             # our socket to the pool: it makes the job's output buffer
        self.kind = self.payload.kind
        self.settings = self.payload.config
        self.kernel_names = self.payload.kernel_names
        self.modules = self.payload.modules
        self.device = device
        self.sock = sock
        self.deadline = _monotonic() + timeout_s
        self.seed = self.settings.seed
        self.atol, self.rtol = self.settings.atol, self.settings.rtol
        self.strict = self.settings.strict_fp32
        self.flags: list[dict] = []
        self.trials: list[dict] = []
        self.meta: dict = {"phase_s": {}}
        self.correct: bool | None = None
        self.runtime_error: str | None = None
        self.timing: dict | None = None
        self.ref_timing: dict | None = None
        self.ref_timing_measured = False
        self.ref_timing_key: str | None = None
        self.lost: dict | None = None
        self.shared: wire.SharedBuffer | None = None
        self.digest_key = int.from_bytes(os.urandom(8), "little")
        self.group_method = "gated"
        self.gate_ms = GATE_START_MS
        self.groups: list[dict] = []      # every group the worker ran, in order (the kernel trace has one window each)
        self.digests: list[str] = []      # every committed output digest
        self.revealed: list[dict] = []
        self.job_sent = False
        self.phase_name, self.trial = "start", None
        self._phase_started = _monotonic()

    # bookkeeping
    def phase(self, name: str, trial: int | None = None) -> None:
        now = _monotonic()
        self.meta["phase_s"][self.phase_name] = round(now - self._phase_started, 4)
        self.phase_name, self.trial, self._phase_started = name, trial, now

    def flag(self, code: str, reason: str) -> None:
        if not any(f["code"] == code for f in self.flags):
            self.flags.append({"code": code, "reason": reason})

    def verdict(self, status: str = "ok", internal_error: str | None = None) -> dict:
        self.phase("done")
        self.meta["judge_peak_rss_bytes"] = _peak_rss_bytes()
        if self.device.type == "cuda":
            self.meta["judge_peak_device_bytes"] = int(torch.cuda.max_memory_reserved())
        meta = dict(self.meta)
        meta.update(self.device.info)
        return {"status": status, "internal_error": internal_error, "correct": self.correct,
                "runtime_error": self.runtime_error, "trials": self.trials, "timing": self.timing,
                "ref_timing": self.ref_timing, "ref_timing_measured": self.ref_timing_measured,
                "ref_timing_key": self.ref_timing_key, "hack_flags": self.flags, "meta": meta, "lost": self.lost}

    # talking to the worker (every answer is untrusted)
    def send(self, op: str, **fields) -> None:
        try:
            channel.send(self.sock, {"op": op, **fields})
        except ChannelError as e:
            raise WorkerLost(e.kind, str(e))

    def recv(self, op: str, *, max_blobs: int = 0) -> tuple[dict, list]:
        try:
            header, blobs = channel.recv(self.sock, max_blobs=max_blobs, max_header=CONTROL_MESSAGE_BYTES,
                                         deadline=self.deadline)
        except ChannelError as e:
            raise WorkerLost(e.kind, str(e))
        self._take_flags(header)
        if header["op"] == "error":
            raise CandidateError(str(header.get("message", "the candidate failed"))[:MAX_ERROR_CHARS])
        if header["op"] != op:
            raise WorkerLost("protocol", f"expected {op!r} from the worker, got {header['op'][:40]!r}")
        meta = header.get("meta")
        if isinstance(meta, dict):
            self.meta.update({k: _plain(meta[k], items=WORKER_META_ITEMS.get(k, 64)) for k in WORKER_META if k in meta})
        return header, blobs

    def _take_flags(self, header: dict) -> None:
        flags = header.get("flags")
        if not isinstance(flags, list):
            return
        for f in flags[:32]:
            if isinstance(f, dict) and isinstance(f.get("code"), str) and isinstance(f.get("reason"), str):
                self.flag(f["code"][:64], f["reason"][:600])

    def ask(self, op: str, reply: str, *, max_blobs: int = 0, **fields) -> tuple[dict, list]:
        self.send(op, **fields)
        return self.recv(reply, max_blobs=max_blobs)

    # the job
    def run(self) -> dict:
        try:
            try:
                self._run()
            except CandidateError as e:
                too_large = self._card_too_small(str(e))
                if too_large is not None:
                    raise too_large
                self.correct = False
                self.runtime_error = str(e)
                self._finish_quietly()
            except (torch.OutOfMemoryError, MemoryError) as e:
                # Our own copies and comparisons (the reference's failures are ReferenceError_): what the task
                # takes beside the candidate did not fit this machine.
                where = "device" if isinstance(e, torch.OutOfMemoryError) else "host"
                raise TaskTooLarge(f"{where} memory", f"the judge ran out of {where} memory in phase "
                                   f"{self.phase_name}: {str(e)[:300]}")
        except TaskTooLarge as e:
            self.correct = None
            self.runtime_error = f"the task is too large for this machine ({e.resource}; a task-level verdict, not " \
                                 f"the candidate's fault): {e.message}"
            self.meta["reference_error"] = True      # the marker of every task-level verdict
            self.meta["task_too_large"] = {"resource": e.resource, "needed_bytes": e.needed,
                                           "available_bytes": e.available}
            if self.job_sent:
                self._finish_quietly()
        except ReferenceError_ as e:
            self.correct = None
            self.runtime_error = f"the reference program failed (task error, not the candidate's): {e}"
            self.meta["reference_error"] = True
            self.meta["reference_oom"] = any(s in str(e).lower() for s in ("out of memory", "can't allocate memory"))
            if self.meta["reference_oom"]:   # the machine's limit: marked like every task too large for it
                self.meta["task_too_large"] = {"resource": "device memory" if "cuda" in str(e).lower()
                                               else "host memory", "needed_bytes": None, "available_bytes": None}
            self._finish_quietly()
        except WorkerLost as e:
            self.correct = False
            if e.kind in ("eof", "timeout"):  # crashed, exited or hung: the pool adds how it ended
                self.lost = {"kind": e.kind, "message": e.message[:500], "phase": self.phase_name,
                             "trial": self.trial}
            else:  # it answered something malformed or out of turn: its own doing
                self.runtime_error = f"the candidate's process broke the evaluation protocol: {e.message[:500]}"
        return self.verdict()

    def _card_too_small(self, message: str) -> TaskTooLarge | None:
        """A candidate that ran out of device memory where even the least a candidate's worker holds
        (`worker_least_bytes`) does not fit beside what the judge holds for the reference: the card's limit, not the
        candidate's doing."""
        if self.device.type != "cuda" or "out of memory" not in message.lower() or \
                not hasattr(self, "output_bytes"):
            return None
        total = torch.cuda.get_device_properties(self.device.torch_device).total_memory
        held = torch.cuda.memory_reserved()
        least = self.worker_least_bytes()
        if held + least + DEVICE_CONTEXTS_BYTES <= total:
            return None
        return TaskTooLarge("device memory", f"the candidate ran out of device memory, and a candidate's process "
                            f"holds at least {least / 2**30:.2f} GiB (a call's inputs and output, the previous "
                            f"call's output, the weights) beside the {held / 2**30:.2f} GiB the reference's side "
                            f"holds, on a card of {total / 2**30:.2f} GiB", held + least + DEVICE_CONTEXTS_BYTES, total)

    def worker_least_bytes(self) -> int:
        """Device memory the candidate's worker holds at the least while a call runs, whatever the candidate does:
        the call's inputs and output, the previous call's output (kept alive so that its memory is never handed to
        the next call) and the weights. (A group of several calls holds more, but only where a call's inputs and
        output are small: _group_size.)"""
        return self.input_bytes + 2 * self.output_bytes + self.param_bytes

    def _finish_quietly(self) -> None:
        """After a verdict is reached early: collect the worker's last checks if it still answers, else drop it."""
        self.deadline = min(self.deadline, _monotonic() + 10.0)
        try:
            self.ask("finish", "final")
        except (WorkerLost, CandidateError):
            pass

    def _run(self) -> None:
        _reset_peak_rss()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.phase("load_task")
        try:
            self.task = load_task(self.payload.task_source)
            set_seed(self.seed)
            self.ref_model = self.task.Model(*map_tree(init_inputs(self.task, self.device, self.seed),
                                                       lambda t: t.clone())).to(self.device.torch_device)
        except ReferenceError_:
            raise
        except Exception as e:
            raise ReferenceError_(format_exception(e, "loading the reference"))

        self.phase("reference_warmup")
        warm_inputs = self.inputs(self.seed - 1)
        guard = map_tree(warm_inputs, lambda t: t.clone())
        warm_out = self.reference(warm_inputs, self.seed)
        # What the first call tells, taken at once: later calls are compared with it by digest, so that no more than
        # one output and two copies of the inputs are alive here (a 6-8 GB output held a few times over would take
        # the card the candidate needs next).
        ref_mutates = not bitwise_equal(warm_inputs, guard)
        ref_aliases = any(tensors.overlaps(o, tensors_in(warm_inputs)) for o in tensors_in(warm_out))
        self.output_bytes = tree_nbytes(warm_out)
        self.output_sizes = output_sizes = [t.numel() * t.element_size() for t in tensors_in(warm_out)]
        # Over 1 GiB, the judge keeps one trial's output at a time (samples of the earlier ones): on the card, the
        # candidate's process needs the room; on the host, a few such copies would be tens of GB.
        self.large_output = self.output_bytes > wire.DEVICE_SNAPSHOT_MAX
        self.input_bytes = tree_nbytes(guard)
        self.param_bytes = sum(t.numel() * t.element_size() for t in
                               list(self.ref_model.parameters()) + list(self.ref_model.buffers()))
        self.input_dtypes = dtype_signature(warm_inputs)
        # The shapes, strides and dtypes of the judge's replays: no memory held for the job (an 8 GiB template would
        # stay on the card throughout).
        self.output_template = map_tree(warm_out, _EmptyTensor)
        self.meta.update(input_dtypes=self.input_dtypes, output=compare.structure(warm_out))
        warm_digest = self._digest(warm_out)
        del warm_out, warm_inputs
        try:  # the reference's own ATen ops (a task whose ops cannot run under a dispatch mode just gets none)
            self.ref_ops = tracing.reference_compute_ops(
                lambda: self.ref_model(*map_tree(guard, lambda t: t.clone())))
        except Exception as e:
            self.ref_ops = []
            self.meta["reference_trace_error"] = format_exception(e, "tracing the reference")
        self.meta["reference_ops"] = self.ref_ops
        self.device.sync()
        # A reference that draws random numbers (active dropout) cannot be re-checked on the timed calls' outputs.
        again = self._digest(self.reference(map_tree(guard, lambda t: t.clone()), self.seed + 1))
        self.rng_dependent = self._digest(self.reference(map_tree(guard, lambda t: t.clone()), self.seed)) != again
        del guard
        # An output that does not depend on the inputs repeats by design: no check for repeated outputs then.
        self.input_independent = self._digest(self.reference(self.inputs(self.seed - 2), self.seed)) == warm_digest
        # What a call must move and compute at the least (the floor and the roofline), with no copy of the inputs
        # alive here any more (the largest tasks' inputs are 8 GiB).
        self.needs = self._task_needs(ref_mutates)

        # Before any candidate code exists: the reference's time cannot be disturbed by it.
        self.phase("reference_timing")
        self.time_reference(use_cache=self.kind == "evaluate")
        if self.device.type == "cuda":
            self.meta["reference_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        if self.kind == "reference":   # the reference path alone (Evaluator.check_references): no candidate
            self.correct = None
            return

        self.phase("import_candidate")
        if self.device.type == "cuda":  # what the reference's calls cached goes back to the card, for the candidate
            torch.cuda.empty_cache()
        # The worker's outputs come back through shared memory sized here, made by the pool (wire.SharedBuffer).
        self.shared = self.output_buffer()
        if self.device.type == "cuda":
            self.meta["outputs_pinned"] = self.shared.pin()
        payload = self.payload.to_dict()
        job = {"op": "job", "task_source": payload["task_source"], "code": payload["code"],
               "modules": payload["modules"], "kernel_names": payload["kernel_names"],
               "runtime_build": payload["runtime_build"], "config": payload["config"], "kind": self.kind,
               "ref": {"ops": self.ref_ops, "mutates_inputs": ref_mutates, "aliases_inputs": ref_aliases,
                       "output_sizes": output_sizes, "rng_dependent": self.rng_dependent}}
        try:
            channel.send_fd(self.sock, job, self.shared.fd)
        except OSError as e:
            raise WorkerLost("eof", f"the peer is gone ({type(e).__name__}: {e})")
        self.job_sent = True
        self.recv("loaded")
        self.phase("correctness")
        self.run_trials(1 if self.kind == "retime" else self.settings.num_trials)
        if not self.correct:
            self.phase("final_checks")
            self.ask("finish", "final")
            return
        self.check_built_kernels()
        self.phase("timing")
        self.time_candidate()
        self.check_repeats()
        traced = False
        # The re-measurement of a large speedup (retime) too: by the wall clock alone, with the tight allowance, an
        # honest short kernel's fresh time could be raised below half its first speedup (speedup_not_reproduced).
        if self.kind in ("evaluate", "retime") and self.device.type == "cuda" and self.settings.dynamic.kernel_trace:
            self.phase("kernel_trace")
            self.ask("kernel_trace", "traced")
            traced = self.judge_call_trace()
        self.bound_by_wall(traced)
        self.set_peak_fraction()
        self.phase("final_checks")
        # The worker stays for a profile only after its final checks: a candidate that crashes or hangs when it is
        # profiled has nothing left to escape.
        profile_next = self.kind == "evaluate" and self.settings.kernel_profile and bool(self.timing)
        self.ask("finish", "final", stay=profile_next)
        if profile_next and not self.flags:
            self.phase("profile")
            try:
                self.meta["kernel_profile"] = self.kernel_profile()
            except Exception as e:  # noqa: BLE001 - a bug of ours here is a reason, never an internal-error verdict
                self.meta["kernel_profile"] = {"error": f"internal: {type(e).__name__}: {e}"[:500]}
        if self.settings.ref_compile and self.device.type == "cuda":
            # Here, not in the candidate's process: torch.compile patches torch.nn.Module and starts threads,
            # which the worker's checks would pin on the candidate.
            self.phase("ref_compile")
            self.meta["ref_compile_timing"] = self._time_compiled_reference()

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

    def receive_output(self, reply: dict, blobs: list) -> Any:
        budget = None
        if self.device.type == "cuda" and self.large_output:  # one DMA transfer to the card, when it has room
            budget = max(wire.DEVICE_SNAPSHOT_MAX, torch.cuda.mem_get_info()[0] - DEVICE_FREE_MARGIN)
        try:
            try:
                return wire.unpack(reply.get("tree"), blobs, max_bytes=self.max_output_bytes(), shared=self.shared,
                                   device=self.device.torch_device if self.device.type == "cuda" else None,
                                   device_budget=budget)
            except torch.OutOfMemoryError:  # the card filled up meanwhile: the host copy instead
                torch.cuda.empty_cache()
                return wire.unpack(reply.get("tree"), blobs, max_bytes=self.max_output_bytes(), shared=self.shared,
                                   device=None)
        except MemoryError:
            raise  # the host's limit, not the worker's doing (run() gives the task-level verdict)
        except Exception as e:  # whatever the worker sent: its verdict, never our internal error
            raise WorkerLost("protocol", f"the worker sent a malformed output: {type(e).__name__}: {e}"[:500])

    def max_output_bytes(self) -> int:
        """What the judge accepts from the worker per output message: up to twice the reference's output (a
        wrong-sized output is still compared). A large output: what the output buffer holds, no more (the host
        memory granted to the job covers one copy of that; an output that does not fit the reference's layout has
        other shapes or dtypes than the reference's and is wrong anyway)."""
        if self.large_output:
            return self.output_buffer_bytes()
        return 2 * self.output_bytes + (1 << 16)

    def output_buffer_bytes(self) -> int:
        return wire.layout_bytes(self.output_sizes) + OUTPUT_SLACK_BYTES

    def kernels_known(self) -> bool:
        """Whether every kernel the program has is known: the compile stage read each built extension's device code
        (protocol/job.py) and no build at run time left it unread (the worker says so: it can only turn the kernel
        checks off, as a forged trace can)."""
        return kernels_known(self.modules) and self.meta.get("kernels_known") is not False

    def check_built_kernels(self) -> None:
        """On a GPU, a program whose built extensions hold no kernel (their device code, read by the compile stage
        from the files it built) runs no kernel of its own, whatever its source says: decided here, not by the
        worker."""
        if self.device.type == "cuda" and self.settings.dynamic.require_custom_kernel and not self.kernel_names \
                and kernels_known(self.modules):
            self.flag("no_custom_kernel", "the program's built extensions hold no CUDA kernel (their device code, "
                                          "read from the built files)")

    def _digest(self, out: Any) -> str:
        """The digest of one output (device_kernels: one pass, no copy): how the warm-up compares outputs bit for bit
        without holding two of them."""
        return self.device.kernels.digests([out], self.digest_key)[0]

    def output_buffer(self) -> wire.SharedBuffer:
        """The job's output buffer: room for the reference's outputs, laid out as wire.pack lays them out (a larger
        output goes through the socket, up to max_output_bytes). The pool makes it (channel.output_memfd), where no
        limit meant for the candidate applies, and refuses it when the host cannot hold it together with our host
        copies of the outputs (one at a time when large, two trials' when small): TaskTooLarge."""
        size = self.output_buffer_bytes()
        # our host copies of the candidate's outputs at once (on a GPU they go to the card when it has room)
        copies = size if self.large_output else (0 if self.device.type == "cuda" else 2 * size)
        self.meta["output_buffer_bytes"] = size
        if self.ctl is None:
            return wire.SharedBuffer(size)
        try:
            channel.send(self.ctl, {"op": "output_buffer", "bytes": size, "host_bytes": copies})
            header, fd = channel.recv_fd(self.ctl)
        except (ChannelError, OSError) as e:   # the pool is gone: this job's verdict cannot be delivered anyway
            raise RuntimeError(f"no output buffer from the pool ({e})")
        if header.get("ok") and fd is not None:
            return wire.SharedBuffer(fd=fd)
        if fd is not None:
            os.close(fd)
        raise TaskTooLarge("host memory", str(header.get("error", "refused"))[:500],
                           header.get("needed_bytes"), header.get("available_bytes"))

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

    def _reveal(self, group: dict, j: int) -> Any:
        """The output of call j of the worker's last group, checked against the digest it committed when the call
        ran (None: not a plain tensor, flagged)."""
        reply, blobs = self._ask_output("reveal", j=j)
        if reply.get("not_plain"):
            self.flag("output_not_plain_tensor", f"forward returned {str(reply['not_plain'])[:200]}")
            return None
        out_c = self.receive_output(reply, blobs)
        device = self.device.torch_device if self.device.type == "cuda" else None
        if self.device.kernels.digests([out_c], self.digest_key, device=device)[0] != group["digests"][j]:
            self.flag("uncommitted_output", "the output sent for a call differs from the digest the worker committed "
                                            "when the call ran: it was changed or computed after the call")
        return out_c

    def _release(self) -> None:
        self.ask("reveal", "released", j=-1)

    def _ask_output(self, op: str, **fields) -> tuple[dict, list]:
        """ask() for an output: one over max_output_bytes is the candidate's doing, and said so."""
        try:
            return self.ask(op, "output", max_blobs=self.max_output_bytes(), **fields)
        except WorkerLost as e:
            if e.kind == "protocol" and "accepted here" in e.message:
                raise WorkerLost("protocol", f"its output is larger than the reference's ({self.output_bytes} bytes "
                                             f"in all) could be: {e.message}")
            raise

    # correctness
    def run_trials(self, n_trials: int) -> None:
        """Correctness trials: groups of one call on the trial's seed, guarded (checks=True), always revealed."""
        prev_c = prev_r = None
        earlier = []   # a sample of every earlier trial's output: a cache keyed by address returns an older one
        self.correct = True
        for t in range(n_trials):
            self.phase("correctness", trial=t)
            seed_t = trial_seed(self.seed, t)
            started = self._send_group([seed_t], checks=True)
            out_r = self.reference(self.inputs(seed_t), seed_t + 7)   # while the worker runs the candidate
            group = self._recv_group([seed_t], started)
            out_c = None if group.get("not_plain") else self._reveal(group, 0)
            if out_c is None:
                what = group.get("not_plain") or "a tensor subclass or lazy wrapper"
                self.flag("output_not_plain_tensor", f"forward returned {what} instead of a plain torch.Tensor")
                self.trials.append({"max_abs_err": None, "max_rel_err": None, "mismatch_frac": 1.0, "passed": False,
                                    "message": f"output is not a plain torch.Tensor ({what})", "trial": t})
                self.correct = False
                return
            result = compare_outputs(out_c, out_r, atol=self.atol, rtol=self.rtol, strict_fp32=self.strict)
            result["trial"] = t
            self.trials.append(result)
            if not result["passed"]:
                self.correct = False
                self._explain_mismatch(t, out_c, prev_c, prev_r, earlier)
                return
            earlier.append(compare.output_sample(out_c))
            if self.large_output:  # samples only: `earlier` then finds a repeated output, prev_r a stale one
                prev_c, prev_r = None, compare.sampled(out_r)
                out_c = out_r = None  # gone before the next trial's reference runs
            else:
                prev_c, prev_r = out_c, out_r
        del prev_c, prev_r, out_c, out_r
        if self.kind == "evaluate":
            self.run_affine_trials(n_trials)

    def run_affine_trials(self, first: int) -> None:
        """Trials on inputs x * s + m (judge/affine.py: which leaves, and when not), after the ordinary trials
        passed: groups of one call like them, the change drawn here per trial and sent with the seed (the worker
        applies the same arithmetic to the same inputs)."""
        n = self.settings.affine_trials
        if not n:
            return
        leaves, why = affine.plan(self.inputs(trial_seed(self.seed, 0)), self.payload.task_source)
        record: dict[str, Any] = {"ran": 0, "leaves": [i for i, _, _ in leaves], "not_changed": why}
        self.meta["affine_trials"] = record
        if not leaves:
            record["skipped"] = "no input leaf may change"
            return
        rng = secrets.SystemRandom()
        for k in range(n):
            t = first + k
            self.phase("correctness", trial=t)
            seed_t = trial_seed(self.seed, t)
            change = affine.draw(leaves, rng)
            out_r = self.reference(harness.affine_inputs(self.inputs(seed_t), change), seed_t + 7)
            if not affine.finite(out_r):
                record["skipped"] = "the reference's output is not finite on the changed inputs (outside its domain)"
                return
            group = self._recv_group([seed_t], self._send_group([seed_t], checks=True, change=change))
            out_c = None if group.get("not_plain") else self._reveal(group, 0)
            described = f"x * {change['scale']:.3g} + m on input(s) " + \
                        ", ".join(f"{i} (m = {m:.3g})" for i, m in change["leaves"])
            if out_c is None:
                what = group.get("not_plain") or "a tensor subclass or lazy wrapper"
                self.flag("output_not_plain_tensor", f"forward returned {what} instead of a plain torch.Tensor")
                self.trials.append({"max_abs_err": None, "max_rel_err": None, "mismatch_frac": 1.0, "passed": False,
                                    "message": f"output is not a plain torch.Tensor ({what})", "trial": t,
                                    "affine": change})
                self.correct = False
                return
            result = compare_outputs(out_c, out_r, atol=self.atol, rtol=self.rtol, strict_fp32=self.strict)
            result.update(trial=t, affine=change)
            record["ran"] += 1
            if not result["passed"]:
                result["message"] = f"on inputs changed to {described} (a trial beyond the task's own input " \
                                    f"distribution, on which the reference is defined): {result['message']}"
            self.trials.append(result)
            if not result["passed"]:
                self.correct = False
                return
            del out_c, out_r

    def _explain_mismatch(self, t: int, out_c, prev_c, prev_r, earlier: list) -> None:
        """A wrong output that is really a hack: stale memory, or an earlier call's result."""
        leaves = [x.tensor for x in tensors.flatten(out_c) if isinstance(x, wire.Received)]
        poisoned = max((compare.poison_fraction(x) for x in leaves), default=0.0)
        if poisoned > 0.5:
            self.flag("stale_output", f"trial {t}: {poisoned:.0%} of the output is memory the candidate never wrote")
        sample = compare.output_sample(out_c)
        if prev_c is not None and compare.same_bytes(out_c, prev_c):
            self.flag("cached_output", f"trial {t}: fresh inputs gave exactly the previous trial's output")
        elif sample is not None and sample in earlier:
            self.flag("cached_output", f"trial {t}: fresh inputs gave trial {earlier.index(sample)}'s output "
                      f"(equal at {compare.SAMPLE_POSITIONS} sampled positions per output tensor)")
        elif prev_r is not None and compare_outputs(
                compare.sampled(out_c) if self.large_output else out_c, prev_r,
                atol=self.atol, rtol=self.rtol)["passed"]:
            self.flag("stale_output", f"trial {t}: output equals the previous trial's reference output")

    # timing
    def timing_sets(self) -> int:
        if self.timing_config.method == "kernelbench":
            return 1  # KernelBench times one input set
        per_set = max(1, tree_nbytes(self.inputs(self.seed + TIMING_SEED)))
        budget = self.settings.timing_inputs_max_bytes
        return max(1, min(self.settings.timing_input_sets, budget // per_set))

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

    def _check_revealed(self, group: dict, j: int, out_c: Any) -> None:
        """Call j's output against the reference on the same inputs, under the seed the worker used for it (its
        own when the reference draws random numbers, else the group's)."""
        seed = group["seeds"][j] if self.rng_dependent else group["seeds"][0]
        out_r = self.reference(self.inputs(group["seeds"][j]), seed + 7)
        result = compare_outputs(out_c, out_r, atol=self.atol, rtol=self.rtol, strict_fp32=self.strict)
        self.revealed.append({"call": j, "of": group["n"], "check": "passed" if result["passed"] else "failed"})
        self.meta["timed_output_check"] = "failed" if any(r["check"] == "failed" for r in self.revealed) else "passed"
        if not result["passed"]:
            self.flag("timed_output_mismatch", f"the output of a timed call (call {j} of a group of {group['n']}, "
                                               f"picked after the call) is wrong ({result['message']}): the timed "
                                               "calls did not compute the result")

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

    def check_repeats(self) -> None:
        """Outputs of calls on different fresh inputs that are bit for bit the same: results served from a cache
        (unless the reference's output does not depend on its inputs, or is too small to be told apart)."""
        if not self.digests or self.input_independent or self.output_bytes < DIGEST_MIN_BYTES:
            return
        repeats = len(self.digests) - len(set(self.digests))
        if repeats:
            self.flag("cached_output", f"{repeats} of {len(self.digests)} calls, each on fresh inputs, returned an "
                                       "output bit for bit equal to an earlier call's")

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


def _process_tree_cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds of `pid` and its descendants, exited threads and reaped children included (cpu_clock.py)."""
    return cpu_clock.process_tree_cpu_ns(pid)


def _chunks(total: int, size: int) -> list[int]:
    """`total` calls in groups of at most `size`, as even as possible."""
    if total <= 0:
        return []
    groups = -(-total // size)
    return [total // groups + (1 if i < total % groups else 0) for i in range(groups)]


class _EmptyTensor:
    """A tensor's shape, strides and dtype: what the judge's replay allocates in its place (as cheaply as
    empty_like: the replay's empty call is the protocol's cost that is deducted from the candidate's)."""
    __slots__ = ("shape", "stride", "dtype")

    def __init__(self, t: torch.Tensor):
        self.shape, self.stride, self.dtype = tuple(t.shape), t.stride(), t.dtype


def _allocate(template: Any, device: torch.device) -> Any:
    """`template` with every _EmptyTensor made an uninitialised tensor on `device`."""
    if type(template) is _EmptyTensor:
        return torch.empty_strided(template.shape, template.stride, dtype=template.dtype, device=device)
    if type(template) in (tuple, list):
        return type(template)(_allocate(x, device) for x in template)
    return template


def _reset_peak_rss() -> None:
    """The judge lives for many jobs: its peak RSS is made per job (Linux: clear_refs 5 resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_bytes() -> int | None:
    """VmHWM (shared memory mapped and touched counts too: the output buffer)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


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


def _plain(value: Any, depth: int = 0, items: int = 64) -> Any:
    """A bounded copy of a JSON value the worker sent (scalars, short strings, small lists and dicts; the top-level
    list up to `items` entries)."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return channel.finite(value)
    if isinstance(value, str):
        return value[:300]
    if depth < 3 and isinstance(value, list):
        return [_plain(v, depth + 1) for v in value[:items if depth == 0 else 64]]
    if depth < 3 and isinstance(value, dict):
        # keys up to a string's length: call_foreign_kernels is keyed by kernel names, which the reference's are
        # matched against (cut at 64, every vectorized elementwise kernel of ATen had the same name)
        return {str(k)[:300]: _plain(v, depth + 1) for k, v in list(value.items())[:32]}
    return None
