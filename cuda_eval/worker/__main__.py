"""The candidate's worker: the process that runs the candidate, one per candidate, pre-started by gpu_pool.py.

    python -m cuda_eval.worker --device-type cuda|cpu        (its socket is fd 3)

It runs under a sandbox uid of its own and holds nothing the verdict depends on: it runs what the judge
(judge.py, another process under another uid) asks for, one step at a time, and answers on its socket; the judge
computes the reference, compares outputs and bounds the timing. Start-up (hidden behind the previous candidate):
import torch, initialise CUDA and the timer, then say "ready" on the socket (to the pool, which hands the socket to
the judge with the job). Steps, each answered on the socket:
  job            install the prebuilt extensions, import the candidate, build ModelNew under the seed ("loaded");
  run            one group of calls (harness.run_group), the only way the candidate is ever called for the verdict:
                 inputs from the judge's seeds, every call traced (ATen ops, extension calls, torch calls from
                 Python; on CUDA the kernel trace too) and timed, every output committed by its digest before the
                 answer; a correctness trial is a group of one with its inputs guarded and freed memory poisoned;
  reveal         the output of one call of the last group (the judge picks it after the digests), or none; the
                 group's outputs are dropped;
  timing_sets, time, timed_output
                 KernelBench's timing protocol (the kernelbench method only): the timing inputs, one timed loop of
                 the judge's length, its last output;
  kernel_trace   (CUDA) the kernel trace of every call so far, then the fork check and the pile-up check of side
                 streams;
Flags raised here are reported with every answer. They come from checks inside the candidate's own process, which a
candidate that attacks the harness itself can evade: docs/EVALUATOR.md, "Trust boundary".
"""
from __future__ import annotations

import faulthandler
import gc
import os
import socket
import sys
import time
import traceback
import types
from typing import Any

import torch

from cuda_eval.protocol import kernel_symbols
from cuda_eval.profile import kernel_profiler
from cuda_eval.protocol import channel, device_kernels, harness, timing, tracing, wire
from cuda_eval.protocol.channel import ChannelError
from cuda_eval.protocol.harness import (CANDIDATE_MODULE, CandidateError, Device, exec_module, format_exception,
                                        init_inputs, load_task, make_inputs, map_tree, milestone, process_arguments,
                                        set_seed)
from cuda_eval.protocol.job import JobConfig, RuntimeBuild, kernels_known
from cuda_eval.protocol.tensors import bitwise_equal, overlaps, tensors_in
from cuda_eval.worker import dynamic_checks, extension_loader
from cuda_eval.worker.dynamic_checks import non_plain_tensors

# Captured before any candidate code runs: a candidate replacing these (flagged as monkeypatch) cannot change how
# we synchronise, seed or time.
_type = type
_monotonic = time.monotonic
_cuda_synchronize = torch.cuda.synchronize
_cuda_sleep = getattr(torch.cuda, "_sleep", None)  # the gate of the fork check (Worker._gated_trace)
_CudaEvent = torch.cuda.Event
_host_sleep = time.sleep
_channel_send = channel.send
_channel_recv = channel.recv
_channel_recv_fd = channel.recv_fd
_pack = wire.pack
TRACE_CALLS = 8               # forward calls in the unsynced-stream check (see Worker.trace_kernels)
TRACE_REPEAT_MAX_MS = 25.0    # slower candidates are called once there (their side-stream work is long anyway)
GATE_MIN_MS = 2.0             # the fork check's gate: at least this long, and 4x the measured forward time
GATE_MAX_MS = 250.0           # ...at most (a forward that synchronises the device waits for the whole gate)
GATE_SETTLE_S = 0.001         # after forward returns, the gate must still hold this long (launched work starts)
TIMING_PROFILE_SEED = 999     # inputs of the profile step when no timing set exists
MAX_GROUP = 64                # calls in one group (the judge sends at most timing.GROUP_MAX)


def harness_snapshot(task: types.ModuleType, device: Device | None = None) -> dynamic_checks.IdentitySnapshot:
    """What the candidate must not replace in its process: torch's public names, every name of our modules
    (private aliases of the clocks, events and channel included) and what our functions hold (code, defaults,
    closures), and the classes of the harness, the timers and the kernel trace's session among them (the time that
    enters the reward, and under a trace that judged every group the wall clock's allowance, rest on what they
    report), and the device's timers and own kernels as objects: what each was given at start-up (the gated
    timer's flush and gate rate, the kernels' handles and names)."""
    instances, namespaces = {}, {"task": vars(task)}
    if device is not None:
        timers = device.__dict__.setdefault("_timers", {})
        namespaces["device._timers"] = timers
        instances.update({f"device.timer_for({m!r})": t for m, t in timers.items()})
        kernels = device.__dict__.get("kernels")
        if kernels is not None:
            instances["device.kernels"] = kernels
            namespaces["device.kernels.names"] = kernels.names
    # This module is __main__ here (python -m): its functions and classes are watched like torch's.
    return dynamic_checks.IdentitySnapshot(
        dynamic_checks.default_watch_modules() + [sys.modules[__name__]],
        dynamic_checks.default_watch_classes() + [
            task.Model, Worker, Device, dynamic_checks.ForwardTrace, tracing.KernelTrace,
            dynamic_checks.IdentitySnapshot, dynamic_checks.ThreadWatch, dynamic_checks.KernelSession,
            dynamic_checks.GroupWindow, timing.HostTimer, timing.TorchEventTimer, timing.NativeTimer,
            timing.GatedTimer, timing.KernelBenchTimer, device_kernels.Kernels],
        namespaces, instances)


class Worker:
    def __init__(self, device: Device, sock: socket.socket):
        self.device = device
        self.sock = sock
        self.flags: list[dict] = []
        self._reported = 0
        self.meta: dict = {}
        self.forward_ms = 0.0
        self.timing_sets: list = []
        self.last_output = None
        self.workdir = os.getcwd()
        self.shared: wire.SharedBuffer | None = None
        self.retained: list | None = None    # the outputs of the last group, until the judge reveals one
        self.prev_output = None              # the last call's output, alive until the next group has run
        self.session: dynamic_checks.KernelSession | None = None
        self.session_state = "not started"
        self.groups = 0
        self.first_trace: dict | None = None

    # answers
    def flag(self, code: str, reason: str) -> None:
        if not any(f["code"] == code for f in self.flags):
            self.flags.append({"code": code, "reason": reason})

    def reply(self, op: str, blobs=(), **fields) -> None:
        new, self._reported = self.flags[self._reported:], len(self.flags)
        _channel_send(self.sock, {"op": op, "flags": new, "meta": self.meta, **fields}, blobs)

    def reply_output(self, out: Any) -> None:
        bad = non_plain_tensors(out)
        if bad:
            self.flag("output_not_plain_tensor", f"forward returned {', '.join(bad)} instead of a plain torch.Tensor")
            self.reply("output", not_plain=", ".join(bad)[:200])
            return
        tree, blobs = _pack(out, self.shared)
        self.reply("output", blobs, tree=tree)

    def serve(self) -> None:
        """Answer the judge's steps until "finish" (or the judge goes away)."""
        handlers = {"job": self.load, "run": self.run, "reveal": self.reveal,
                    "timing_sets": self.make_timing_sets, "time": self.time, "timed_output": self.timed_output,
                    "kernel_trace": self.trace_kernels, "finish": self.finish, "profile": self.profile}
        while True:
            try:
                if self.shared is None:  # the job comes with the shared buffer for the outputs
                    header, fd = _channel_recv_fd(self.sock, max_header=64 << 20)
                    if fd is not None:
                        self.shared = wire.SharedBuffer(fd=fd)
                        if self.device.type == "cuda":
                            self.shared.pin()   # before any candidate code: our DMA target, as the judge's
                else:
                    header, _ = _channel_recv(self.sock, max_header=64 << 20)
            except (ChannelError, OSError, ValueError):
                return
            op = header["op"]
            handler = handlers.get(op)
            if handler is None:
                return
            try:
                handler(header)
            except CandidateError as e:
                self.reply("error", message=str(e))
            except ChannelError:
                return
            if op == "finish" and not header.get("stay"):
                return

    def make_inputs(self, seed: int) -> list:
        return make_inputs(self.task, self.device, seed)

    # steps
    def load(self, job: dict) -> None:
        self.job = job
        # The judge's job: the evaluator's settings checked field by field (protocol/job.py), no defaults of ours.
        self.settings = JobConfig.from_dict(job["config"])
        self.dyn = self.settings.dynamic
        self.modules, self.kernel_names = list(job["modules"]), list(job["kernel_names"])
        # Whether the compile stage read the kernels of every built extension (protocol/job.py: kernels_known)
        self.kernels_known = kernels_known(self.modules)
        self.seed = self.settings.seed
        ref = job.get("ref") or {}
        self.ref_ops = list(ref.get("ops") or [])
        self.ref_mutates_inputs = bool(ref.get("mutates_inputs"))
        self.ref_aliases_inputs = bool(ref.get("aliases_inputs"))
        # A reference that draws random numbers is compared call by call under the call's own seed.
        self.seed_each = bool(ref.get("rng_dependent"))
        try:
            self.task = load_task(job["task_source"])
        except Exception as e:  # the judge loaded the same source: this cannot be the task's fault
            raise CandidateError(format_exception(e, "loading the task next to the candidate"))
        modules_before = set(sys.modules)
        self.snapshot = harness_snapshot(self.task, self.device)
        self.threads = dynamic_checks.ThreadWatch()
        self._install_prebuilt()
        try:
            self.cand_module = exec_module(job["code"], CANDIDATE_MODULE, harness.CANDIDATE_FILENAME)
        except BaseException as e:
            raise CandidateError(format_exception(e, "importing the candidate"))
        if not hasattr(self.cand_module, "ModelNew"):
            raise CandidateError("the program defines no ModelNew")
        self.check_identities("after import")
        try:
            init = init_inputs(self.task, self.device, self.seed)
            set_seed(self.seed)
            self.cand_model = self.cand_module.ModelNew(*init)
            self.cand_model = self.cand_model.to(self.device.torch_device)
            self.device.sync()
        except BaseException as e:
            raise CandidateError(format_exception(e, "ModelNew(*get_init_inputs())"))
        self.ext_functions = self._extension_functions(modules_before)
        self.meta["extension_functions"] = len(self.ext_functions)
        self.model_tensors = [t for t in list(self.cand_model.parameters()) + list(self.cand_model.buffers())]
        self.prev_output = None
        # Sizes of the reference's output tensors (from the judge): a block of each, poisoned and freed before the
        # first trial, is what an output that is never written would be handed (the reference runs in the judge, so
        # the worker's allocator holds no freed output of its own yet).
        self.recent_sizes: list[int] = [int(x) for x in (job.get("ref") or {}).get("output_sizes", [])
                                        if isinstance(x, int) and 0 < x <= (1 << 36)][:64]
        self.trial_ops: set[str] = set()
        self.reply("loaded")

    def run(self, msg: dict) -> None:
        """One group of calls: the judge's seeds give the inputs (fresh contents for every call), harness.run_group
        times them (the same code, stack and tracing for a correctness trial, a warm-up or a timed call), and the
        answer commits to every output by its digest; the outputs stay here until the judge reveals one of them
        (or none). checks=True (a correctness trial): freed memory poisoned before, inputs guarded, mutation and
        aliasing checked after."""
        seeds = msg.get("seeds")
        method = str(msg.get("method", "gated"))
        if not isinstance(seeds, list) or not 1 <= len(seeds) <= MAX_GROUP or method not in timing.METHODS:
            raise CandidateError("internal: bad group request")
        seeds = [int(x) for x in seeds]
        gate_ms, key, checks = float(msg.get("gate_ms", 1.0)), int(msg.get("key", 0)), bool(msg.get("checks"))
        self.retained = None
        try:   # out of device memory here is reported (the judge tells a card too small from the candidate's doing)
            inputs = [harness.affine_inputs(self.make_inputs(x), _affine(msg.get("affine"))) for x in seeds]
            # The inputs' digests, not copies: a copy would hold the largest tasks' inputs twice (up to 16 GiB).
            guards = self.device.kernels.digests(inputs, key) if checks else None
        except Exception as e:
            raise CandidateError(format_exception(e, "making the call's inputs"))
        if checks:
            dynamic_checks.poison_free_memory(self.device.type, self.recent_sizes)
        trace = dynamic_checks.ForwardTrace(self.ext_functions)
        model, seed_each = self.cand_model, self.seed_each

        def call(k: int):
            if seed_each:
                set_seed(seeds[k] + 7)
            with trace:
                return model(*inputs[k])

        if not seed_each:
            set_seed(seeds[0] + 7)
        self._start_kernel_session()
        self.groups += 1
        try:
            outs, times, meta = harness.run_group(self.device, call, len(seeds), method=method, gate_ms=gate_ms)
        except BaseException as e:  # SystemExit/KeyboardInterrupt from candidate code are verdicts too
            raise CandidateError(format_exception(e, "ModelNew.forward"))
        finally:
            self._judge_ops(trace)
        if checks:
            self._check_trial(inputs, guards, outs, key)
        bad = sorted({b for out in outs for b in non_plain_tensors(out)})
        if bad:
            self.flag("output_not_plain_tensor", f"forward returned {', '.join(bad)} instead of a plain torch.Tensor")
            self.reply("ran", not_plain=", ".join(bad)[:200])
            return
        try:
            digests = self.device.kernels.digests(outs, key)
        except BaseException as e:  # an output whose bytes cannot be read (a crashed context shows here too)
            raise CandidateError(format_exception(e, "reading ModelNew.forward's outputs"))
        self.retained = outs
        # Kept alive until the next group has run: the memory of the last output cannot be handed to the candidate.
        self.prev_output = outs[-1]
        self.recent_sizes = [x.numel() * x.element_size() for x in tensors_in(outs[-1])]
        self.forward_ms = sorted(times)[len(times) // 2]
        self.reply("ran", times=times, digests=digests, held=bool(meta.get("held")),
                   host_ms=float(meta.get("host_ms", 0.0)))

    def _check_trial(self, inputs: list, guards: list[str], outs: list, key: int) -> None:
        try:
            after = self.device.kernels.digests(inputs, key)
        except BaseException as e:  # the candidate's kernels broke the context: its verdict
            raise CandidateError(format_exception(e, "reading the inputs after ModelNew.forward"))
        for inp, guard, now, out in zip(inputs, guards, after, outs):
            if not self.ref_mutates_inputs and now != guard:
                self.flag("input_mutated", "forward modified its input tensors")
            out_tensors = tensors_in(out)
            if not self.ref_aliases_inputs and any(overlaps(o, tensors_in(inp)) for o in out_tensors):
                self.flag("output_aliases_input", "an output shares memory with an input")
            if any(overlaps(o, self.model_tensors) for o in out_tensors):
                self.flag("output_aliases_parameter", "an output shares memory with a parameter/buffer")

    def reveal(self, msg: dict) -> None:
        """The output of call j of the last group (j < 0: none); the others are dropped either way."""
        outs, self.retained = self.retained, None
        j = int(msg.get("j", -1))
        if outs is None or not 0 <= j < len(outs):
            self.reply("released")
            return
        self.reply_output(outs[j])

    def _judge_ops(self, trace) -> None:
        """Flags from the ATen ops, host transfers and task code one traced call ran."""
        d = self.dyn
        py_ops, heavy = trace.python_compute_ops(), trace.heavy_ops()
        ref_shared = [op for op in trace.compute_ops() if op in set(self.ref_ops)]
        if d.forbid_python_torch_compute and py_ops:
            self.flag("torch_compute_in_forward", f"forward ran PyTorch ops from Python: {', '.join(py_ops[:6])}")
        if d.forbid_reference_ops and ref_shared:
            self.flag("reference_op", f"forward ran the reference's PyTorch ops: {', '.join(ref_shared[:6])}")
        if d.forbid_library_heavy_ops and heavy:
            self.flag("library_heavy_op", f"forward ran PyTorch library ops: {', '.join(heavy[:6])}")
        if self.device.type == "cuda" and d.forbid_host_transfer and trace.host_transfers():
            self.flag("host_transfer", f"forward copied tensors between GPU and host {trace.host_transfers()} time(s)")
        if trace.task_code_calls:
            self.flag("calls_reference_model",
                      f"forward executed the reference task's code ({', '.join(sorted(trace.task_code_calls))})")
        py_calls = trace.python_compute_calls()
        if d.forbid_python_torch_compute and py_calls:
            self.flag("torch_compute_in_forward",
                      f"forward called torch compute from Python: {', '.join(py_calls[:6])}")
        if trace.tracer_off:
            self.flag("harness_access", f"forward switched the op tracer off: {sorted(trace.tracer_off)[0]}")
        if d.require_custom_kernel and trace.calls_without_extension:
            self.flag("no_custom_kernel", f"{trace.calls_without_extension} of {trace.calls} calls of forward never "
                                          "called a function of the compiled extension")
        if self.first_trace is None and trace.calls:
            self.first_trace = {"extension_calls": trace.extension_calls // trace.calls,
                                "custom_op_calls": trace.custom_op_calls() // trace.calls,
                                "candidate_ops": trace.compute_ops(), "python_ops": trace.python_compute_ops(),
                                "python_torch_calls": sorted(trace.python_torch_calls)[:24]}
            self.meta.update(self.first_trace)

    def make_timing_sets(self, msg: dict) -> None:
        n, seed = max(1, min(64, int(msg["n_sets"]))), int(msg["seed"])
        self.prev_output = None   # no group runs after KernelBench's loop: an output's memory less beside it
        try:
            self.timing_sets = [self.make_inputs(seed + i) for i in range(n)]
        except Exception as e:   # out of device memory: reported, like a group's inputs
            raise CandidateError(format_exception(e, "making the timing inputs"))
        gc.collect()  # here, not in the timed loop's command: the judge's clock is running there
        self.reply("ok")

    def time(self, msg: dict) -> None:
        """One timed loop of exactly the judge's length on the rotated timing sets (rotation restarts at set 0)."""
        warmup, reps, method = int(msg["warmup"]), int(msg["reps"]), str(msg.get("method", "device_sync"))
        if not self.timing_sets or not (0 <= warmup <= 1000 and 1 <= reps <= 10000) or method not in timing.METHODS:
            raise CandidateError("internal: bad timing request")
        timer = self.device.timer_for(method)
        sets, model = self.timing_sets, self.cand_model
        last = [None]

        def fn(k: int) -> None:  # the k-th logical call (a retried gate group repeats its k's: timing.py)
            last[0] = model(*sets[k % len(sets)])

        flush = timing.l2_flush_bytes(self.device.type)
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection inside a timed rep would be noise
        try:
            times = list(timer.time(fn, warmup=warmup, reps=reps, l2_flush_bytes=flush, sync_device=True))
        except BaseException as e:
            raise CandidateError(format_exception(e, "timing ModelNew.forward"))
        finally:
            if gc_was_enabled:
                gc.enable()
        self.last_output = last[0]
        if len(times) == reps:
            self.forward_ms = sorted(times)[len(times) // 2]
        self.reply("timed", times=times, timer=timing.timer_name(timer), gate=getattr(timer, "meta", None))

    def timed_output(self, msg: dict) -> None:
        self.reply_output(self.last_output)
        self.last_output = None

    def trace_kernels(self, msg: dict) -> None:
        # No group runs after this: the last one's outputs are not needed (an 8 GiB output less beside the trace's).
        self.retained = self.prev_output = None
        if self.device.info.get("kernel_trace"):
            self._stop_kernel_session(report=True)
            self._trace_kernels()
        else:
            self.meta["kernel_trace_skipped"] = self.device.info.get("kernel_trace_error")
        self.reply("traced")

    def finish(self, msg: dict) -> None:
        self._stop_kernel_session(report=False)
        self.check_identities("at the end")
        self.check_threads()
        self.reply("final")

    # the kernel trace of every call (CUDA)
    def _start_kernel_session(self) -> None:
        """Before the first call: every kernel of every call from here to the kernel-trace step is recorded (no call
        of the candidate runs untraced, so no call can behave differently for not being traced)."""
        if self.session_state != "not started":
            return
        reason = None
        if self.device.type != "cuda" or not self.device.info.get("kernel_trace"):
            reason = self.device.info.get("kernel_trace_error") or "no kernel trace on this device"
        elif not self.dyn.kernel_trace or not self.dyn.kernel_trace_calls:
            reason = "turned off (EvalConfig.dynamic)"
        elif self.settings.timing.method == "kernelbench":
            reason = "KernelBench's timing protocol times its calls untraced"
        elif self.device.kernels.backend != "nvrtc":
            reason = f"no digest kernels to delimit the groups ({self.device.kernels.fallback_reason})"
        if reason:
            self.session_state = "skipped"
            if self.device.type == "cuda":
                self.meta["call_trace_skipped"] = str(reason)[:300]
            return
        try:
            self.session = dynamic_checks.KernelSession().start()
            self.session_state = "running"
            self.session_groups = self.groups
        except Exception as e:  # our tooling: judged without it, and said so
            self.session_state = "skipped"
            self.meta["call_trace_skipped"] = f"profiler: {type(e).__name__}: {e}"[:300]

    def _stop_kernel_session(self, report: bool) -> None:
        if self.session_state != "running":
            return
        self.session_state = "stopped"
        session, self.session = self.session, None
        try:
            windows, foreign = session.stop(self.kernel_names, self.device.kernels.names)
        except BaseException as e:
            if report:
                self.flag("harness_access", f"the kernel trace of the calls was stopped or broken during the job "
                                            f"({type(e).__name__}: {str(e)[:200]})")
            return
        if not report:
            return
        self.meta["call_windows"] = [[round(w.busy_ms, 6), w.own, w.kernels, w.unsynced]
                                     for w in windows[:tracing.CALL_WINDOWS_MAX]]
        self.meta["call_groups"] = self.groups - self.session_groups
        self.meta["call_foreign_kernels"] = dict(sorted(foreign.items(), key=lambda kv: -kv[1])[:24])

    def profile(self, msg: dict) -> None:
        """Profile feedback, after the verdict is complete: never a verdict or a flag, whatever happens here."""
        started = _monotonic()
        try:
            raw = self._profile(msg)
        except BaseException as e:  # the candidate's exceptions and ours alike: a reason for the judge
            raw = {"error": format_exception(e, "profiling ModelNew.forward")[:500]}
        raw["cost_s"] = round(_monotonic() - started, 4)
        self.reply("profiled", profile=raw)

    def _profile(self, msg: dict) -> dict:
        forwards = max(1, min(10, int(msg.get("forwards", 1))))
        cuda = self.device.type == "cuda"
        so_paths = [m["so_path"] for m in self.modules if m.get("so_path")]
        tools = msg.get("tools") if isinstance(msg.get("tools"), dict) else {}
        dump = kernel_profiler.start_cuobjdump(tools.get("cuobjdump"), so_paths) if cuda else "not on a GPU"
        try:
            sets = self.timing_sets or [self.make_inputs(self.seed + TIMING_PROFILE_SEED)]
            model = self.cand_model

            def call(i: int) -> None:
                set_seed(self.seed)
                model(*sets[i % len(sets)])

            raw = kernel_profiler.profile_forwards(
                call, forwards, device_type=self.device.type, flush_bytes=timing.l2_flush_bytes(self.device.type),
                gate_cycles_per_ms=self.device.info.get("gate_cycles_per_ms"), forward_ms=self._forward_ms(),
                workdir=self.workdir)
        except BaseException:
            if not isinstance(dump, str):
                dump.kill()
                dump.communicate()
            raise
        if cuda:
            major, minor = (int(x) for x in str(self.device.info.get("capability", "9.0")).split(".")[:2])
            raw["resources"], raw["resources_error"] = kernel_profiler.finish_cuobjdump(dump, (major, minor))
        return raw

    def _install_prebuilt(self) -> None:
        """load_inline/load now return the modules the compile stage built; a build reached only at run time goes
        through worker/runtime_build.py (cache hit, or our build in this worker's directory, in a child process)."""
        builder = None
        runtime = RuntimeBuild(**self.job["runtime_build"]) if self.job["runtime_build"] is not None else None
        if runtime:
            from cuda_eval.worker.runtime_build import RuntimeBuilder
            builder = RuntimeBuilder(runtime.cache_dir, os.path.join(self.workdir, "runtime_builds"),
                                     toolchain=runtime.toolchain, timeout_s=runtime.timeout_s,
                                     path_map=runtime.path_map)
        if builder is not None:
            builder = self._reading_kernels(builder)
        extension_loader.install_prebuilt(self.modules, builder=builder)

    def _reading_kernels(self, build):
        """A build reached at run time adds the kernels of the extension it built (as the compile stage reads
        them: the binary's symbols), or makes them unknown."""
        def build_and_read(spec):
            so_path = build(spec)
            # the judge's own no_custom_kernel decision reads only the compile stage's builds: it must know of this one
            self.meta["runtime_builds"] = int(self.meta.get("runtime_builds") or 0) + 1
            symbols = kernel_symbols.binary_kernels(so_path)
            if symbols is None:
                self.kernels_known = self.meta["kernels_known"] = False
            else:
                self.kernel_names = sorted(set(self.kernel_names) | set(kernel_symbols.kernel_names(symbols)))
            return so_path
        return build_and_read

    def _extension_functions(self, modules_before: set[str]) -> list:
        """Functions of the candidate's compiled extensions: the prebuilt .so files of the job, plus any extension
        module that appeared since the candidate started (a build reached at run time)."""
        so_paths = [m["so_path"] for m in self.modules if m.get("so_path")]
        found = dynamic_checks.extension_functions(so_paths)
        site_dirs = {os.path.dirname(os.path.dirname(torch.__file__))}
        seen = {id(f) for f in found}
        candidates = [sys.modules[n] for n in set(sys.modules) - modules_before]
        candidates += [v for v in vars(self.cand_module).values() if isinstance(v, types.ModuleType)]
        candidates += [v for v in vars(self.cand_model).values() if isinstance(v, types.ModuleType)]
        for module in candidates:
            path = getattr(module, "__file__", None) or ""
            if path.endswith(".so") and not any(path.startswith(d) for d in site_dirs):
                for v in vars(module).values():
                    if callable(v) and not isinstance(v, type) and id(v) not in seen:
                        found.append(v)
                        seen.add(id(v))
        return found


    def check_threads(self) -> None:
        py_threads = self.threads.new_python_threads()
        if py_threads:
            self.flag("background_thread", f"the candidate started threads: {', '.join(py_threads[:3])}")
        native = self.threads.new_native_threads()
        self.meta["new_native_threads"] = len(native)
        if native and self.dyn.flag_native_threads:
            self.flag("background_thread", f"{len(native)} native thread(s) started by the candidate still exist")

    def check_identities(self, when: str) -> None:
        changed = self.snapshot.changed()
        if changed:
            self.flag("monkeypatch", f"{when}: replaced {', '.join(changed[:5])}"
                                     + (f" and {len(changed) - 5} more" if len(changed) > 5 else ""))


    def _forward_ms(self) -> float:
        """The candidate's forward time (ms) in its own timed loop, or 0 before/without timing."""
        return float(self.forward_ms or 0.0)

    def _trace_kernels(self) -> None:
        """Work left on another stream (the KernelBench side-stream hack: forward launches its kernel on a private
        stream and returns at once, so a timer on the current stream sees nothing). Two passes:
        1. Fork check (deterministic): the current stream is held by a spin kernel while forward is called once;
           any kernel that starts on another stream before the spin ends waited for nothing on the current stream,
           so its result is not ordered before the caller's next operation either (`_gated_trace`).
        2. Pile-up check (kept as a second net): forward is called TRACE_CALLS times back to back, the current
           stream is synchronised, and any kernel still running then, or an output that still changes, is flagged.
        Honest multi-stream code forks from the current stream (waits on an event recorded there) and joins back
        before returning; it passes both."""
        inputs = self.make_inputs(self.seed + 777)
        kernel_names = self.kernel_names
        unforked, gate_meta = self._gated_trace(inputs)
        self.meta["fork_check"] = gate_meta
        if unforked:
            k = unforked[0]
            self.flag("unsynced_stream", f"kernel {k.name[:60]} ran on another stream without waiting for the current "
                                         "stream (it started while the current stream was still busy with work queued "
                                         "before forward); a side stream must wait for the current stream and be "
                                         "joined back before forward returns")
        # Pass 2: forward is called TRACE_CALLS times back to back before the current stream is synchronised: work
        # a candidate leaves on a private stream then piles up there when the host launches faster than the GPU
        # runs it (not guaranteed on a loaded host, hence pass 1).
        calls = TRACE_CALLS if self._forward_ms() < TRACE_REPEAT_MAX_MS else 1
        self.meta["trace_calls"] = calls
        try:
            with tracing.KernelTrace() as trace:
                for _ in range(calls):
                    set_seed(self.seed)
                    out = None   # one output alive at a time (8 GiB ones: the card holds the trace's copy too)
                    out = self.cand_model(*inputs)
                torch.cuda.current_stream().synchronize()
                trace.mark_returned()
                early = map_tree(out, lambda x: x.clone())  # what a caller on the current stream would see
            _cuda_synchronize()
        except BaseException as e:
            raise CandidateError(format_exception(e, "profiled ModelNew.forward"))
        own = trace.matching(kernel_names)
        streams = sorted({k.stream for k in trace.kernels})
        self.meta.update(kernels=sorted({k.name[:80] for k in trace.kernels})[:12], kernel_streams=streams,
                         own_kernel_launches=len(own))
        if self.kernels_known and not own and self.dyn.require_custom_kernel:
            what = f"none of the program's kernels ({', '.join(kernel_names[:4])})" if kernel_names else \
                "the program's extensions hold no CUDA kernel (their built device code has none), so none"
            self.flag("no_custom_kernel", f"{what} ran on the GPU during forward")
        if unforked:
            return
        late = trace.late_kernels(self.dyn.unsynced_slack_us)
        if late or not bitwise_equal(early, out):
            what = f"kernel {late[0].name[:60]} was still running" if late else "the output changed"
            self.flag("unsynced_stream", f"{what} after forward returned and the current stream was synchronised "
                                         "(work left on another stream)")

    def _gated_trace(self, inputs) -> tuple[list, dict]:
        """Pass 1 of trace_kernels: (kernels that did not wait for the current stream, what happened).

        The gate (torch.cuda._sleep on the current stream) must outlast forward's host side and GATE_SETTLE_S
        more, so that every kernel forward launched elsewhere has had time to start while it holds. Its length
        starts at max(GATE_MIN_MS, 4x the measured forward time) and, while the gate ends too early, grows to 4x
        the host time of the call, up to GATE_MAX_MS. A forward that waits for the device (a synchronise, an
        .item()) waits for the whole gate whatever its length: then only the kernels launched before that wait
        are judged ('held': false, 'forward_waited_for_gate': true)."""
        cycles_per_ms = self.device.info.get("gate_cycles_per_ms")
        if not cycles_per_ms or _cuda_sleep is None:
            return [], {"skipped": self.device.info.get("gate_error") or "no torch.cuda._sleep on this build"}
        gate_ms = max(GATE_MIN_MS, 4.0 * self._forward_ms())  # device time: a first guess at the host's
        meta: dict = {"tries": 0}
        while True:
            gate_ms = min(gate_ms, GATE_MAX_MS)
            meta["tries"] += 1
            try:
                trace = tracing.KernelTrace()
                trace.__enter__()
            except Exception as e:  # our tooling, not the candidate: judge without this pass
                return [], dict(meta, error=f"profiler: {type(e).__name__}: {e}"[:300])
            try:
                try:
                    gate_done = _CudaEvent()
                    _cuda_sleep(int(gate_ms * cycles_per_ms))
                    gate_done.record()
                except Exception as e:  # our tooling again
                    return [], dict(meta, error=f"gate: {type(e).__name__}: {e}"[:300])
                set_seed(self.seed)
                t0 = _monotonic()
                try:
                    self.cand_model(*inputs)
                    host_ms = (_monotonic() - t0) * 1e3
                    _host_sleep(GATE_SETTLE_S)
                    held = not gate_done.query()  # raises if forward's kernels broke the context
                except BaseException as e:
                    raise CandidateError(format_exception(e, "ModelNew.forward behind the fork-check gate"))
            finally:
                try:
                    trace.__exit__(None, None, None)  # synchronises: a crashed context shows here
                except BaseException as e:
                    raise CandidateError(format_exception(e, "synchronising after ModelNew.forward behind the "
                                                             "fork-check gate"))
            unforked = trace.unforked_kernels()
            gate = trace.gate()
            meta.update(gate_ms=round(gate_ms, 3), held=held, forward_host_ms=round(host_ms, 3),
                        gate_kernel_found=gate is not None, unforked=len(unforked))
            if unforked or held or gate is None or gate_ms >= GATE_MAX_MS:
                return unforked, meta
            if host_ms >= 0.9 * gate_ms:
                meta["forward_waited_for_gate"] = True
                return unforked, meta
            gate_ms = 4.0 * max(gate_ms, host_ms)


# --- process entry --------------------------------------------------------------------------------------------
def _affine(spec) -> dict | None:
    """The judge's affine change of a trial's inputs ({"scale", "shift", "leaves"}), checked; None when absent."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("leaves"), list):
        raise CandidateError("internal: bad affine request")
    return {"scale": float(spec["scale"]), "leaves": [[int(i), float(m)] for i, m in spec["leaves"][:64]]}


def main(argv: list[str] | None = None) -> None:
    parser = process_arguments(__doc__.split("\n")[0])
    parser.add_argument("--start-timeout", type=float, default=0.0,
                        help="dump every thread's Python stack to stderr if start-up takes longer than this (the "
                        "pool kills a worker that is not ready in time; the dump says where it hung)")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.channel_fd)
    if args.start_timeout > 0:
        faulthandler.dump_traceback_later(args.start_timeout, exit=False)
    milestone("worker", f"torch {torch.__version__} imported")
    try:
        device = Device(args.device_type, args.cpu_threads, args.device_lock_fd, who="worker",
                        checks=dynamic_checks.StartUp())
    except BaseException as e:
        channel.send(sock, {"op": "ready", "ok": False, "error": format_exception(e, "start")})
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(3)
    faulthandler.cancel_dump_traceback_later()
    device.drop_lock()  # candidate code never holds the GPU's timing lock: the judge takes it to time
    milestone("worker", "ready")
    try:
        channel.send(sock, {"op": "ready", "ok": True, "info": device.info})
        Worker(device, sock).serve()
    except ChannelError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: threads a candidate left behind must not keep this process alive.
    os._exit(0)


if __name__ == "__main__":
    main()
