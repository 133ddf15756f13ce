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

import os
import socket
from typing import Any

import torch

from cuda_eval.judge import compare
from cuda_eval.judge.comparison import Comparison
from cuda_eval.judge.group_timing import GroupTiming
# re-exported: callers and tests import these from here
from cuda_eval.judge.group_timing import GROUP_JITTER_S, WALL_TOLERANCE, _chunks, _process_tree_cpu_ns  # noqa: F401
from cuda_eval.judge.output_bounds import OutputBounds
from cuda_eval.judge.output_bounds import OUTPUT_SLACK_BYTES  # noqa: F401 - re-exported
from cuda_eval.judge.profiles import Profiles
from cuda_eval.judge.reference_run import ReferenceRun
from cuda_eval.judge.shared import (CONTROL_MESSAGE_BYTES, GATE_START_MS, TaskTooLarge, WorkerLost, _EmptyTensor,
                                    _monotonic)
from cuda_eval.judge.trace_verdicts import TraceVerdicts
from cuda_eval.protocol import channel, tensors, tracing, wire
from cuda_eval.protocol.channel import ChannelError
from cuda_eval.protocol.harness import (MAX_ERROR_CHARS, CandidateError, Device, ReferenceError_, dtype_signature,
                                        format_exception, init_inputs, load_task, map_tree, set_seed, tree_nbytes)
from cuda_eval.protocol.job import JobPayload
from cuda_eval.protocol.tensors import bitwise_equal, tensors_in


# What a worker may add to the verdict's meta (anything else it sends is dropped: it is candidate-controlled).
WORKER_META = ("extension_functions", "extension_calls", "custom_op_calls", "candidate_ops", "python_ops",
               "python_torch_calls", "new_native_threads", "fork_check", "trace_calls", "kernels", "kernel_streams",
               "own_kernel_launches", "kernel_trace_skipped", "identity_changes", "call_windows", "call_groups",
               "call_foreign_kernels", "call_trace_skipped", "kernels_known", "runtime_builds")
WORKER_META_ITEMS = {"call_windows": tracing.CALL_WINDOWS_MAX}


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


class Job(OutputBounds, ReferenceRun, Comparison, TraceVerdicts, GroupTiming, Profiles):
    """One job (module doc). Its methods by role live in the classes it is assembled from: the reference's run,
    the comparisons, the group timing protocol, the trace verdicts, the output bounds and the profiles."""

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
