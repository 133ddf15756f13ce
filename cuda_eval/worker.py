"""The GPU (or CPU) worker: one process per candidate, pre-started by gpu_pool.py.

    python -m cuda_eval.worker --device-type cuda|cpu

Start-up (hidden behind the previous candidate): import torch, initialise CUDA and the timer, write `ready.json`
(device facts) into the working directory, then block reading one line from stdin: the path of a job JSON. The job
runs; the result is written as `result.json` next to the job (never printed: the candidate owns stdout), and the
process ends with os._exit so that threads a candidate left behind cannot keep it alive. `progress.json` records
the phase being run, so that a crash (segfault, os._exit, kill at timeout) still gets a precise verdict.

Phases of an "evaluate" job (a "retime" job does 1-3 and 6 only, without the cache):
 1. load the task as a module (its module-level constants are visible to get_inputs/forward), build Model from
    get_init_inputs() under the seed, run it once (its ATen ops, whether it mutates/aliases its inputs);
 2. snapshot torch/time/builtins identities and threads, install the prebuilt extensions, import the candidate,
    build ModelNew under the same seed (parameters match);
 3. correctness trials (default 5), each with fresh inputs from get_inputs() (created on the device, dtypes kept):
    freed memory poisoned, the candidate runs FIRST, then the reference on a clone of the inputs, both right after
    the same torch/CUDA RNG seed (dropout and other RNG draws then follow the same stream; BatchNorm in training mode
    uses batch statistics, which are deterministic): exact shapes/dtypes, atol/rtol, NaN/Inf where the reference
    has them; inputs must be unchanged; outputs must be plain tensors that alias no input or parameter;
 4. one traced forward: ATen ops from Python vs. from the C++ extension, calls into the extension, reference code;
 5. timing of the candidate and (unless cached) the reference with the protocol in timing.py, holding the
    device lock (no other worker of this GPU initialises CUDA meanwhile);
 6. freshness: input set 0 overwritten in place (same addresses), the output must follow;
 7. (CUDA) one forward under the profiler: the candidate's own kernels ran; no kernel still running on another
    stream after forward returned;
 8. identities and threads compared with the snapshot.
"""
from __future__ import annotations

import argparse
import builtins
import contextlib
import faulthandler
import fcntl
import importlib
import json
import linecache
import os
import random
import sys
import time
import traceback
import types
from typing import Any

import torch

from cuda_eval import compare, dynamic_checks, timing
from cuda_eval.compare import bitwise_equal, compare_outputs, non_plain_tensors, overlaps, tensors_in

# Captured before any candidate code runs: a candidate replacing these (flagged as monkeypatch) cannot change how
# we synchronise, seed, time or write results.
_type = builtins.type
_monotonic = time.monotonic
_json_dump = json.dump
_os_replace = os.replace
_cuda_synchronize = torch.cuda.synchronize
_manual_seed = torch.manual_seed
_cuda_sleep = getattr(torch.cuda, "_sleep", None)  # the gate of the fork check (JobRunner._gated_trace)
_CudaEvent = torch.cuda.Event
_host_sleep = time.sleep
TASK_MODULE = "kernelbench_task"
TRACE_CALLS = 8               # forward calls in the unsynced-stream check (see JobRunner.trace_kernels)
TRACE_REPEAT_MAX_MS = 25.0    # slower candidates are called once there (their side-stream work is long anyway)
GATE_MIN_MS = 2.0             # the fork check's gate: at least this long, and 4x the measured forward time
GATE_MAX_MS = 250.0           # ...at most (a forward that synchronises the device waits for the whole gate)
GATE_SETTLE_S = 0.001         # after forward returns, the gate must still hold this long (launched work starts)
REF_DRIFT = 1.5               # a cached reference time is checked next to each candidate's: off by more = drift
REF_CHECK = timing.TimingConfig(target_s=0.02, warmup_s=0.005, min_reps=5, max_reps=50, min_warmup=2, max_warmup=10)
CANDIDATE_MODULE = "kernelbench_candidate"
MAX_ERROR_CHARS = 2500


class CandidateError(Exception):
    """The candidate failed (raised, crashed the CUDA context, returned garbage types): a verdict, not a bug."""


class ReferenceError_(Exception):
    """The reference program itself failed: the task is broken, not the candidate."""


# --- small helpers --------------------------------------------------------------------------------------------
def write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        _json_dump(obj, f, default=str)
    _os_replace(tmp, path)


def exec_module(source: str, name: str, filename: str) -> types.ModuleType:
    """Execute `source` as a real module (registered in sys.modules; tracebacks show its lines)."""
    module = types.ModuleType(name)
    module.__file__ = filename
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    sys.modules[name] = module
    code = compile(source, filename, "exec")
    exec(code, module.__dict__)
    return module


def set_seed(seed: int) -> None:
    random.seed(seed)
    _manual_seed(seed)  # every device's generator
    try:
        import numpy as np
        np.random.seed(seed % (2 ** 32))
    except ImportError:
        pass


def format_exception(exc: BaseException, context: str) -> str:
    """`context: Type: message` plus the candidate's own frames (not ours, not torch's), trimmed."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename in (dynamic_checks.CANDIDATE_FILENAME, dynamic_checks.TASK_FILENAME)]
    message = str(exc).split("\nCUDA kernel errors might be asynchronously reported")[0]
    message = message.split("\nFor debugging consider passing CUDA_LAUNCH_BLOCKING")[0].strip()
    text = f"{context}: {type(exc).__name__}: {message}"
    if frames:
        text += "\n" + "".join(traceback.format_list(frames[-4:])).rstrip()
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 15] + "\n... (trimmed)"


def map_tree(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if _type(obj) in (list, tuple):
        return _type(obj)(map_tree(o, fn) for o in obj)
    return obj


def tree_nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(obj))


def dtype_signature(obj: Any) -> str:
    return ",".join(str(t.dtype).replace("torch.", "") for t in tensors_in(obj)) or "none"


# --- device state ---------------------------------------------------------------------------------------------
class Device:
    """The device of this worker. `lock_path` names a file shared by all workers of the same GPU: a worker holds
    an exclusive flock on it while it initialises CUDA (start-up) and while it times, so that a spare starting up
    never disturbs a measurement (the kernel releases the lock if a process dies)."""

    def __init__(self, device_type: str, cpu_threads: int, lock_path: str | None = None):
        self.type = device_type
        self.lock_path = lock_path
        torch.set_grad_enabled(False)  # KernelBench evaluates under no_grad
        self._warm_up_host()
        _phase("host warm-up done; waiting for the device lock")
        with self.exclusive():
            _phase("device lock held")
            self._init_device(device_type, cpu_threads)

    @contextlib.contextmanager
    def exclusive(self):
        if not self.lock_path:
            yield
            return
        fd = os.open(self.lock_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _warm_up_host(self) -> None:
        """First uses that cost seconds on the host (dispatch-mode machinery, profiler import) belong to start-up,
        which the pool hides behind earlier candidates."""
        x = torch.ones(8)
        dynamic_checks.reference_compute_ops(lambda: torch.relu(x) + 1)
        with dynamic_checks.ForwardTrace([]):
            torch.relu(x)
        importlib.import_module("torch.profiler")  # imported now, activated only for the kernel trace

    def _init_device(self, device_type: str, cpu_threads: int) -> None:
        if device_type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("device_type='cuda' but torch sees no CUDA device")
            torch.cuda.init()
            torch.empty(1, device="cuda").fill_(0)
            torch.cuda.synchronize()
            _phase("CUDA context up")
            self.torch_device = torch.device("cuda", 0)
            props = torch.cuda.get_device_properties(0)
            self.name = props.name
            self.info = {"gpu_name": props.name, "capability": f"{props.major}.{props.minor}",
                         "total_memory": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", None),
                         "cuda_version": torch.version.cuda}
        else:
            torch.set_num_threads(max(1, cpu_threads))
            self.torch_device = torch.device("cpu")
            self.name = "cpu"
            self.info = {"gpu_name": None, "cpu_threads": torch.get_num_threads()}
        self.info.update(device_type=device_type, torch_version=torch.__version__, pid=os.getpid(),
                         python=sys.version.split()[0])
        self.timer = timing.make_timer(device_type)
        self.info["timer"] = timing.timer_name(self.timer)
        if getattr(self.timer, "fallback_reason", ""):
            self.info["timer_fallback_reason"] = self.timer.fallback_reason
        with self.torch_device:
            torch.randn(4)
        if self.type == "cuda":  # timer dlopen + scratch buffer, allocator snapshot, CUPTI: first uses are slow
            self.timer.time(lambda: None, warmup=1, reps=2, l2_flush_bytes=timing.l2_flush_bytes("cuda"))
            _phase(f"timer {self.info['timer']} works")
            dynamic_checks.poison_free_memory("cuda")
            _phase("free memory poisoned; starting the kernel trace (CUPTI)")
            try:
                with dynamic_checks.KernelTrace():
                    torch.ones(8, device="cuda").add_(1)
                self.info["kernel_trace"] = True
            except Exception as e:  # no CUPTI here: the job then skips the kernel trace and says so
                self.info["kernel_trace"] = False
                self.info["kernel_trace_error"] = f"{type(e).__name__}: {e}"[:300]
            try:
                self.info["gate_cycles_per_ms"] = self._gate_cycles_per_ms()
            except Exception as e:  # the fork check is then skipped, and says why (meta.fork_check)
                self.info["gate_error"] = f"{type(e).__name__}: {e}"[:300]
        self.sync()

    def sync(self) -> None:
        if self.type == "cuda":
            _cuda_synchronize()

    @staticmethod
    def _gate_cycles_per_ms() -> float | None:
        """GPU clock cycles per ms of torch.cuda._sleep's spin kernel, measured before any candidate code runs."""
        if _cuda_sleep is None:
            return None
        start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
        cycles = 4_000_000
        _cuda_sleep(cycles // 10)  # first launch loads the kernel
        start.record()
        _cuda_sleep(cycles)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        return cycles / ms if ms > 0 else None


# --- the job --------------------------------------------------------------------------------------------------
class JobRunner:
    def __init__(self, job: dict, device: Device, workdir: str):
        self.job = job
        self.cfg = job["config"]
        self.dyn = self.cfg.get("dynamic", {})
        self.device = device
        self.workdir = workdir
        self.flags: list[dict] = []
        self.trials: list[dict] = []
        self.meta: dict = {"phase_s": {}}
        self.correct: bool | None = None
        self.runtime_error: str | None = None
        self.timing: dict | None = None
        self.ref_timing: dict | None = None
        self.ref_timing_measured = False
        self.ref_timing_key: str | None = None
        self._phase_started = _monotonic()
        self._phase = "start"

    # progress + flags
    def phase(self, name: str, **extra) -> None:
        now = _monotonic()
        self.meta["phase_s"][self._phase] = round(now - self._phase_started, 4)
        self._phase, self._phase_started = name, now
        write_json_atomic(os.path.join(self.workdir, "progress.json"), {"phase": name, **extra})

    def flag(self, code: str, reason: str) -> None:
        if not any(f["code"] == code for f in self.flags):
            self.flags.append({"code": code, "reason": reason})

    def result(self, status: str = "ok", internal_error: str | None = None) -> dict:
        self.phase("done")
        return {"status": status, "internal_error": internal_error, "correct": self.correct,
                "runtime_error": self.runtime_error, "trials": self.trials, "timing": self.timing,
                "ref_timing": self.ref_timing, "ref_timing_measured": self.ref_timing_measured,
                "ref_timing_key": self.ref_timing_key, "hack_flags": self.flags,
                "meta": {**self.meta, **self.device.info}}

    def run(self) -> dict:
        try:
            self._run()
        except CandidateError as e:
            self.correct = False
            self.runtime_error = str(e)
        except ReferenceError_ as e:
            self.correct = None
            self.runtime_error = f"the reference program failed (task error, not the candidate's): {e}"
            self.meta["reference_error"] = True
        return self.result()

    # inputs
    def make_inputs(self, seed: int) -> Any:
        """get_inputs() under `seed`, created on the device when possible (fast for big inputs), dtypes kept."""
        set_seed(seed)
        try:
            with self.device.torch_device:
                inputs = self.task.get_inputs()
        except Exception:  # tasks that build inputs on the host explicitly (numpy, .cpu()) are generated there
            set_seed(seed)
            inputs = self.task.get_inputs()
        return map_tree(list(inputs), lambda t: t.to(self.device.torch_device))

    def init_inputs(self) -> list:
        set_seed(self.seed)
        values = list(self.task.get_init_inputs())
        return map_tree(values, lambda t: t.to(self.device.torch_device))

    def call(self, model, inputs, seed: int, who: str):
        set_seed(seed)
        try:
            out = model(*inputs)
            self.device.sync()
        except BaseException as e:  # SystemExit/KeyboardInterrupt from candidate code are verdicts too
            if who == "reference":
                raise ReferenceError_(format_exception(e, "reference forward"))
            raise CandidateError(format_exception(e, who))
        return out

    # the phases
    def _run(self) -> None:
        self.seed = int(self.cfg.get("seed", 42))
        kind = self.job.get("kind", "evaluate")
        self.phase("load_task")
        try:
            self.task = exec_module(self.job["task_source"], TASK_MODULE, dynamic_checks.TASK_FILENAME)
            for name in ("Model", "get_inputs", "get_init_inputs"):
                if not hasattr(self.task, name):
                    raise AttributeError(f"the task defines no {name}")
            init = self.init_inputs()
            set_seed(self.seed)
            self.ref_model = self.task.Model(*map_tree(init, lambda t: t.clone())).to(self.device.torch_device)
        except ReferenceError_:
            raise
        except Exception as e:
            raise ReferenceError_(format_exception(e, "loading the reference"))

        self.phase("reference_warmup")
        warm_inputs = self.make_inputs(self.seed - 1)
        guard = map_tree(warm_inputs, lambda t: t.clone())
        warm_out = self.call(self.ref_model, warm_inputs, self.seed, "reference")
        try:  # the reference's own ATen ops (a task whose ops cannot run under a dispatch mode just gets none)
            self.ref_ops = dynamic_checks.reference_compute_ops(
                lambda: self.ref_model(*map_tree(warm_inputs, lambda t: t.clone())))
        except Exception as e:
            self.ref_ops = []
            self.meta["reference_trace_error"] = format_exception(e, "tracing the reference")
        self.device.sync()
        ref_ops = self.ref_ops
        self.ref_mutates_inputs = not bitwise_equal(warm_inputs, guard)
        self.ref_aliases_inputs = any(overlaps(o, tensors_in(warm_inputs)) for o in tensors_in(warm_out))
        self.output_bytes = tree_nbytes(warm_out)
        self.input_dtypes = dtype_signature(warm_inputs)
        self.meta.update(reference_ops=ref_ops, input_dtypes=self.input_dtypes, output=compare.structure(warm_out))
        del warm_out, warm_inputs, guard

        self.phase("import_candidate")
        modules_before = set(sys.modules)
        self.snapshot = dynamic_checks.IdentitySnapshot(
            dynamic_checks.default_watch_modules(), dynamic_checks.default_watch_classes() + [self.task.Model],
            {"task": vars(self.task)})
        self.threads = dynamic_checks.ThreadWatch()
        self._install_prebuilt()
        try:
            self.cand_module = exec_module(self.job["code"], CANDIDATE_MODULE, dynamic_checks.CANDIDATE_FILENAME)
        except BaseException as e:
            raise CandidateError(format_exception(e, "importing the candidate"))
        if not hasattr(self.cand_module, "ModelNew"):
            raise CandidateError("the program defines no ModelNew")
        self.check_identities("after import")

        self.phase("init_candidate")
        try:
            init = self.init_inputs()
            set_seed(self.seed)
            self.cand_model = self.cand_module.ModelNew(*init)
            self.cand_model = self.cand_model.to(self.device.torch_device)
            self.device.sync()
        except BaseException as e:
            raise CandidateError(format_exception(e, "ModelNew(*get_init_inputs())"))
        self.ext_functions = self._extension_functions(modules_before)
        self.meta["extension_functions"] = len(self.ext_functions)

        n_trials = 1 if kind == "retime" else int(self.cfg.get("num_trials", 5))
        self.run_trials(n_trials)
        if kind == "evaluate":
            self.phase("trace")
            self.trace_forward()
            self.check_threads()
        if not self.correct:
            self.check_identities("after the trials")
            return
        self.phase("timing")
        self.run_timing(use_cache=(kind == "evaluate"))
        if kind == "evaluate":
            self.phase("freshness")
            self.check_freshness()
            if self.device.type == "cuda" and self.dyn.get("kernel_trace", True):
                if self.device.info.get("kernel_trace"):
                    self.phase("kernel_trace")
                    self.trace_kernels()
                else:
                    self.meta["kernel_trace_skipped"] = self.device.info.get("kernel_trace_error")
        self.check_identities("at the end")
        self.check_threads()
        if self.cfg.get("ref_compile") and self.device.type == "cuda":
            # Last, after the candidate is judged: torch.compile patches torch.nn.Module.__init__/__setstate__
            # (dynamo's mutation guard) and starts threads of its own, which the checks above would pin on the
            # candidate (docs/LOG.md, session 5: every honest kernel flagged under --torch_compile_baseline).
            self.phase("ref_compile")
            self.threads.stop_recording()
            self.meta["ref_compile_timing"] = self._time_compiled_reference()

    def _install_prebuilt(self) -> None:
        """load_inline/load now return the modules the compile stage built; a build reached only at run time goes
        through part 1's RuntimeBuilder (cache hit, or our build in this worker's directory)."""
        from cuda_eval import candidate
        builder = None
        runtime = self.job.get("runtime_build")
        if runtime:
            from cuda_eval.build import RuntimeBuilder
            from cuda_eval.toolchain import Toolchain
            builder = RuntimeBuilder(runtime.get("cache_dir"), os.path.join(self.workdir, "runtime_builds"),
                                     toolchain=Toolchain.from_dict(runtime["toolchain"]),
                                     timeout_s=float(runtime.get("timeout_s", 300.0)))
        candidate.install_prebuilt(self.job.get("modules", []), builder=builder)

    def _extension_functions(self, modules_before: set[str]) -> list:
        """Functions of the candidate's compiled extensions: the prebuilt .so files of the job, plus any extension
        module that appeared since the candidate started (a build reached at run time)."""
        so_paths = [m["so_path"] for m in self.job.get("modules", []) if m.get("so_path")]
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

    def run_trials(self, n_trials: int) -> None:
        atol, rtol = float(self.cfg.get("atol", 1e-2)), float(self.cfg.get("rtol", 1e-2))
        strict = self.cfg.get("strict_fp32")
        model_tensors = [t for m in (self.cand_model, self.ref_model)
                         for t in list(m.parameters()) + list(m.buffers())]
        prev_c = prev_r = None
        recent_sizes: list[int] = []
        self.correct = True
        for t in range(n_trials):
            self.phase("correctness", trial=t)
            seed_t = self.seed + 1 + 1000 * t
            inputs = self.make_inputs(seed_t)
            ref_inputs = map_tree(inputs, lambda x: x.clone())
            guard = map_tree(inputs, lambda x: x.clone())
            dynamic_checks.poison_free_memory(self.device.type, recent_sizes)
            out_c = self.call(self.cand_model, inputs, seed_t + 7, f"trial {t}: ModelNew.forward")
            bad_types = non_plain_tensors(out_c)
            if bad_types:
                self.flag("output_not_plain_tensor",
                          f"forward returned {', '.join(bad_types)} instead of a plain torch.Tensor")
                self.trials.append({"max_abs_err": None, "max_rel_err": None, "mismatch_frac": 1.0, "passed": False,
                                    "message": f"output is not a plain torch.Tensor ({bad_types[0]})"})
                self.correct = False
                return
            if not self.ref_mutates_inputs and not bitwise_equal(inputs, guard):
                self.flag("input_mutated", f"trial {t}: forward modified its input tensors")
            out_tensors = tensors_in(out_c)
            if not self.ref_aliases_inputs and any(overlaps(o, tensors_in(inputs)) for o in out_tensors):
                self.flag("output_aliases_input", f"trial {t}: an output shares memory with an input")
            if any(overlaps(o, model_tensors) for o in out_tensors):
                self.flag("output_aliases_parameter", f"trial {t}: an output shares memory with a parameter/buffer")
            out_r = self.call(self.ref_model, ref_inputs, seed_t + 7, "reference")
            result = compare_outputs(out_c, out_r, atol=atol, rtol=rtol, strict_fp32=strict)
            result["trial"] = t
            self.trials.append(result)
            if not result["passed"]:
                self.correct = False
                self._explain_mismatch(t, out_c, prev_c, prev_r, atol, rtol)
                return
            prev_c, prev_r = out_c, out_r  # kept alive until the next candidate call: their memory is not reusable
            recent_sizes = [x.numel() * x.element_size() for x in tensors_in(out_r)]
            del inputs, ref_inputs, guard

    def _explain_mismatch(self, t, out_c, prev_c, prev_r, atol, rtol) -> None:
        """A wrong output that is really a hack: stale memory, or the previous call's result."""
        poisoned = max((compare.poison_fraction(x) for x in tensors_in(out_c)), default=0.0)
        if poisoned > 0.5:
            self.flag("stale_output", f"trial {t}: {poisoned:.0%} of the output is memory the candidate never wrote")
        if prev_c is not None and bitwise_equal(out_c, prev_c):
            self.flag("cached_output", f"trial {t}: fresh inputs gave exactly the previous trial's output")
        elif prev_r is not None and compare_outputs(out_c, prev_r, atol=atol, rtol=rtol)["passed"]:
            self.flag("stale_output", f"trial {t}: output equals the previous trial's reference output")

    def trace_forward(self) -> None:
        inputs = self.make_inputs(self.seed + 555)
        trace = dynamic_checks.ForwardTrace(self.ext_functions)
        try:
            with trace:
                set_seed(self.seed)
                self.cand_model(*inputs)
                self.device.sync()
        except BaseException as e:
            raise CandidateError(format_exception(e, "traced ModelNew.forward"))
        d = self.dyn
        py_ops, all_ops, heavy = trace.python_compute_ops(), trace.compute_ops(), trace.heavy_ops()
        ref_shared = [op for op in all_ops if op in set(self.ref_ops)]
        self.meta.update(extension_calls=trace.extension_calls, custom_op_calls=trace.custom_op_calls(),
                         candidate_ops=all_ops, python_ops=py_ops)
        if d.get("require_custom_kernel", True) and trace.extension_calls == 0 and trace.custom_op_calls() == 0:
            self.flag("no_custom_kernel", "forward never called a function of the compiled extension")
        if d.get("forbid_python_torch_compute", True) and py_ops:
            self.flag("torch_compute_in_forward", f"forward ran PyTorch ops from Python: {', '.join(py_ops[:6])}")
        if d.get("forbid_reference_ops", True) and ref_shared:
            self.flag("reference_op", f"forward ran the reference's PyTorch ops: {', '.join(ref_shared[:6])}")
        if d.get("forbid_library_heavy_ops", True) and heavy:
            self.flag("library_heavy_op", f"forward ran PyTorch library ops: {', '.join(heavy[:6])}")
        if self.device.type == "cuda" and d.get("forbid_host_transfer", True) and trace.host_transfers():
            self.flag("host_transfer", f"forward copied tensors between GPU and host {trace.host_transfers()} time(s)")
        if trace.task_code_calls:
            self.flag("calls_reference_model",
                      f"forward executed the reference task's code ({', '.join(sorted(trace.task_code_calls))})")

    def check_threads(self) -> None:
        py_threads = self.threads.new_python_threads()
        if py_threads:
            self.flag("background_thread", f"the candidate started threads: {', '.join(py_threads[:3])}")
        native = self.threads.new_native_threads()
        self.meta["new_native_threads"] = len(native)
        if native and self.dyn.get("flag_native_threads", False):
            self.flag("background_thread", f"{len(native)} native thread(s) started by the candidate still exist")

    def check_identities(self, when: str) -> None:
        changed = self.snapshot.changed()
        if changed:
            self.flag("monkeypatch", f"{when}: replaced {', '.join(changed[:5])}"
                                     + (f" and {len(changed) - 5} more" if len(changed) > 5 else ""))

    # timing
    def _timing_sets(self) -> list:
        per_set = max(1, tree_nbytes(self.make_inputs(self.seed + 999)))
        budget = int(self.cfg.get("timing_inputs_max_bytes", 4 << 30))
        n_sets = max(1, min(int(self.cfg.get("timing_input_sets", 4)), budget // per_set))
        return [self.make_inputs(self.seed + 2000 + i) for i in range(n_sets)]

    def run_timing(self, use_cache: bool) -> None:
        sets = self.timing_sets = self._timing_sets()
        tcfg = self.timing_config = timing.TimingConfig(**self.cfg.get("timing", {}))
        self.meta["timing_input_sets"] = len(sets)

        def runner(model):
            return lambda i: model(*sets[i])

        key_parts = [self.device.name, f"torch {torch.__version__}", self.input_dtypes, f"sets {len(sets)}",
                     json.dumps(self.cfg.get("timing", {}), sort_keys=True), timing.timer_name(self.device.timer)]
        self.ref_timing_key = " | ".join(key_parts)
        cached = (self.job.get("ref_timing_cache") or {}).get(self.ref_timing_key) if use_cache else None
        waited = _monotonic()
        with self.device.exclusive():  # no other worker initialises CUDA on this GPU while we measure
            self.meta["timing_lock_wait_s"] = round(_monotonic() - waited, 4)
            try:
                self.timing = timing.time_rotating(runner(self.cand_model), len(sets), timer=self.device.timer,
                                                   device_type=self.device.type, config=tcfg)
            except BaseException as e:
                raise CandidateError(format_exception(e, "timing ModelNew.forward"))
            if cached:
                self.ref_timing = cached
                if not self._cached_reference_holds(cached, runner(self.ref_model), len(sets)):
                    cached = None
            if not cached:
                try:
                    self.ref_timing = timing.time_rotating(runner(self.ref_model), len(sets),
                                                           timer=self.device.timer, device_type=self.device.type,
                                                           config=tcfg)
                except Exception as e:
                    raise ReferenceError_(format_exception(e, "timing the reference"))
                self.ref_timing_measured = True

    def _cached_reference_holds(self, cached: dict, call, n_sets: int) -> bool:
        """A cached reference time is a measurement from another process, maybe under other conditions. A short
        re-timing of the reference right after the candidate's (same lock, same inputs) says whether it still holds:
        - the reference now runs REF_DRIFT x faster: the cached time was taken on a slower GPU state (it would
          inflate every speedup): False, so the reference is timed in full now and the cache updated;
        - REF_DRIFT x slower: the GPU is slower now than when the reference was cached (another process on it, e.g.
          session 8's orphaned worker; or clocks): the cached time is kept, since a candidate must not be able to
          raise its speedup by slowing what runs after it, and meta.timing_contended says the speedup is an
          under-estimate.
        Otherwise the cached time stands."""
        try:
            check = timing.time_rotating(call, n_sets, timer=self.device.timer, device_type=self.device.type,
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
        """torch.compile(reference) on the candidate's timing inputs, with its timing settings (set by run_timing)."""
        sets, tcfg = self.timing_sets, self.timing_config
        try:
            compiled = torch.compile(self.ref_model)
            for s in sets:           # compiles (CPU-bound, minutes at worst) outside the GPU's timing lock
                compiled(*s)
            with self.device.exclusive():
                return timing.time_rotating(lambda i: compiled(*sets[i]), len(sets), timer=self.device.timer,
                                            device_type=self.device.type, config=tcfg)
        except Exception as e:  # torch.compile failing on a task is information, not a verdict
            return {"error": format_exception(e, "torch.compile(reference)")}

    def check_freshness(self) -> None:
        """Same tensors (same addresses), new contents: a candidate caching results by address/shape is caught."""
        inputs = self.make_inputs(self.seed + 2000)  # the layout of timing set 0
        fresh = self.make_inputs(self.seed + 4242)
        for dst, src in zip(tensors_in(inputs), tensors_in(fresh)):
            dst.copy_(src)
        out_c = self.call(self.cand_model, inputs, self.seed + 11, "freshness check: ModelNew.forward")
        # Warm the cache the way timing did, then change the contents in place and call again.
        for dst, src in zip(tensors_in(inputs), tensors_in(self.make_inputs(self.seed + 4343))):
            dst.copy_(src)
        self.device.sync()
        out_c = self.call(self.cand_model, inputs, self.seed + 11, "freshness check: ModelNew.forward")
        out_r = self.call(self.ref_model, map_tree(inputs, lambda x: x.clone()), self.seed + 11, "reference")
        result = compare_outputs(out_c, out_r, atol=float(self.cfg.get("atol", 1e-2)),
                                 rtol=float(self.cfg.get("rtol", 1e-2)), strict_fp32=self.cfg.get("strict_fp32"))
        if not result["passed"]:
            self.flag("cached_output", "after the inputs were overwritten in place (same addresses), the output "
                                       f"did not follow: {result['message']}")

    def _forward_ms(self) -> float:
        """The candidate's measured forward time (ms), or 0 before/without timing."""
        return float((self.timing or {}).get("median_ms") or 0.0)

    def trace_kernels(self) -> None:
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
        kernel_names = self.job.get("kernel_names") or []
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
            with dynamic_checks.KernelTrace() as trace:
                for _ in range(calls):
                    set_seed(self.seed)
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
        if kernel_names and not own and self.dyn.get("require_custom_kernel", True):
            self.flag("no_custom_kernel", f"none of the program's kernels ({', '.join(kernel_names[:4])}) ran on "
                                          "the GPU during forward")
        if unforked:
            return
        late = trace.late_kernels(float(self.dyn.get("unsynced_slack_us", 50.0)))
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
                trace = dynamic_checks.KernelTrace()
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
_STARTED = time.monotonic()


def _phase(what: str) -> None:
    """Start-up milestones on stderr: the pool shows the stderr tail of a worker that failed to start."""
    sys.stderr.write(f"[cuda_eval.worker +{time.monotonic() - _STARTED:.2f}s] {what}\n")
    sys.stderr.flush()


def _read_job_path() -> str | None:
    line = sys.stdin.readline()
    return line.strip() or None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device-type", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--device-lock", default=None, help="file all workers of this device flock around "
                        "CUDA initialisation and timing")
    parser.add_argument("--start-timeout", type=float, default=0.0,
                        help="dump every thread's Python stack to stderr if start-up takes longer than this (the "
                        "pool kills a worker that is not ready in time; the dump says where it hung)")
    args = parser.parse_args(argv)
    workdir = os.getcwd()
    if args.start_timeout > 0:
        faulthandler.dump_traceback_later(args.start_timeout, exit=False)
    _phase(f"torch {torch.__version__} imported")
    try:
        device = Device(args.device_type, args.cpu_threads, args.device_lock)
    except BaseException as e:
        write_json_atomic(os.path.join(workdir, "ready.json"), {"ok": False, "error": format_exception(e, "start")})
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(3)
    faulthandler.cancel_dump_traceback_later()
    _phase("ready")
    write_json_atomic(os.path.join(workdir, "ready.json"), {"ok": True, **device.info})
    job_path = _read_job_path()
    if job_path is None:
        os._exit(0)
    with open(job_path) as f:
        job = json.load(f)
    result_path = os.path.join(os.path.dirname(job_path), "result.json")
    runner = JobRunner(job, device, os.path.dirname(job_path))
    try:
        result = runner.run()
    except BaseException:  # a bug of ours: report it as such, never as the candidate's failure
        result = runner.result(status="internal_error", internal_error=traceback.format_exc()[-MAX_ERROR_CHARS:])
    write_json_atomic(result_path, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
