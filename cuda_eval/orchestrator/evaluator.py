"""The evaluator's pipeline, in the trainer's process (re-exported by cuda_eval.api as `Evaluator`, `evaluate`).

Pipeline per request: extract the program from the response (static/extraction.py) -> static policy (static/checks.py)
-> compile pool (CPU workers, cached builds) -> GPU pool (pre-started workers, one candidate per GPU at a
time) -> [re-timing in a fresh process when the speedup is suspiciously large] -> EvalResult + feedback. Compiles
and GPU runs overlap: whenever a compile finishes its run is queued, so GPUs never wait for nvcc while work is
queued. Importing this module does not import torch (the trainer runs JAX in-process).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import logging
import os
import time
from typing import Any, Sequence

from cuda_eval.cluster import EvaluatorTimeout  # the Ray backend's deadline verdict (no ray import)
from cuda_eval.contract import INTERNAL_ERROR, STRICT_FP32_TOLERANCE, EvalConfig, EvalRequest, EvalResult
from cuda_eval.orchestrator import feedback, scoring
from cuda_eval.orchestrator.devices import (check_nvcc_arch, compile_workers, resolve_devices, spare_workers,
                                            target_arch, target_gpu_name, visible_gpu_count)
from cuda_eval.orchestrator.ref_timing import ReferenceTimingCache, task_hash
from cuda_eval.profile import kernel_profile
from cuda_eval.protocol import kernel_symbols
from cuda_eval.protocol.job import DynamicChecks, JobConfig, JobPayload, JobTiming, RuntimeBuild
from cuda_eval.static import checks
from cuda_eval.static.extraction import extract_code

log = logging.getLogger(__name__)


_CRASH_HINTS = {
    "correctness": "while checking correctness",
    "timing": "while timing",
    "kernel_trace": "during the profiled forward call",
    "import_candidate": "while importing the program or constructing ModelNew",
    "reference_timing": "while timing the reference, before the candidate was loaded",
    "final_checks": "during the final checks",
    "load_task": "while loading the reference",
    "reference_warmup": "while running the reference",
    "ref_compile": "while timing torch.compile(reference), after the candidate was judged (a torch.compile problem)",
}


def crash_message(outcome) -> str:
    """A clear runtime_error for a worker that ended without a result."""
    progress = outcome.progress or {}
    phase = progress.get("phase", "start")
    where = _CRASH_HINTS.get(phase, f"in phase {phase}")
    if "trial" in progress:
        where += f" (trial {progress['trial'] + 1})"
    if outcome.timed_out:
        text = (f"timed out after {outcome.wall_s:.0f} s {where}: a kernel that never finishes, a deadlock or an "
                "infinite loop")
    elif outcome.signal:
        import signal as _signal
        try:
            name = _signal.Signals(outcome.signal).name
        except ValueError:
            name = f"signal {outcome.signal}"
        text = f"the process crashed with {name} {where}"
        if name == "SIGKILL":
            text += " (killed: out of memory or over a resource limit)"
    elif outcome.exit_code not in (None, 0):
        text = f"the process exited with code {outcome.exit_code} {where} (sys.exit/os._exit or a fatal error)"
    else:
        text = f"the process ended {where} without reporting a result (os._exit?)"
    tail = _useful_stderr(outcome.stderr_tail)
    if tail:
        text += f"\nstderr (last lines):\n{tail}"
    return text


def _useful_stderr(stderr: str, max_lines: int = 12, *, startup: bool = False) -> str:
    """The last lines of a worker's stderr. The worker's own start-up milestones ("[cuda_eval.worker ...") are
    dropped from what a model sees, and kept (with more lines: a hang's stack dump) when start-up itself failed."""
    lines = [line for line in (stderr or "").splitlines()
             if line.strip() and (startup or not line.startswith(("[cuda_eval.worker ", "[cuda_eval.judge ")))]
    if startup:
        return "\n".join(lines[-60:])[-6000:]
    return "\n".join(lines[-max_lines:])[-1500:]


def job_config(config: EvalConfig, *, kernel_profile: bool, profile_tools: dict) -> JobConfig:
    """The settings the judge and the worker read for one job, from EvalConfig (the only source of their values)."""
    return JobConfig(
        num_trials=config.num_correct_trials, affine_trials=config.affine_trials, atol=config.atol, rtol=config.rtol,
        strict_fp32=STRICT_FP32_TOLERANCE if config.strict else None, seed=config.seed,
        timing=JobTiming(target_s=config.timing_target_s, warmup_s=config.timing_warmup_s,
                         min_reps=config.timing_min_reps, max_reps=config.timing_max_reps,
                         method=config.timing_method),
        timing_input_sets=config.timing_input_sets, timing_inputs_max_bytes=config.timing_inputs_max_bytes,
        ref_compile=config.ref_compile, kernel_profile=kernel_profile,
        kernel_profile_timeout_s=config.kernel_profile_timeout_s, profile_tools=dict(profile_tools),
        dynamic=DynamicChecks(**{f.name: getattr(config, f.name) for f in dataclasses.fields(DynamicChecks)}))


def pool_config(config: EvalConfig, devices: tuple):
    """The GPU pool's settings for `devices` (indices, or CPU slot labels), from EvalConfig."""
    from cuda_eval.orchestrator.gpu_pool import PoolConfig
    return PoolConfig(device_type=config.device_type, devices=devices, run_dir=config.run_dir or None,
                      start_timeout_s=config.worker_start_timeout_s,
                      spares=spare_workers(config, len(devices)),
                      cpu_threads=config.cpu_threads, data_bytes=config.worker_memory_bytes or None,
                      host_memory_reserve_bytes=int(config.host_memory_reserve_gib * 2**30) or None)


# --- the evaluator --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _State:
    request: EvalRequest
    future: concurrent.futures.Future
    started: float
    result: EvalResult
    compile_submitted: float = 0.0
    compile_done: float = 0.0
    task_hash: str = ""
    static_flags: list = dataclasses.field(default_factory=list)
    stage_future: Any = None      # the compile or GPU job the request waits for (where a deadline stopped it)


class Evaluator:
    """Starts the compile pool and (mode "full") the GPU pool once; evaluates batches of requests.

    `compile_pool` / `gpu_pool` may be passed in already built (tests, benchmarks); they are then not closed here.
    """
    cluster = None   # with EvalConfig.backend="ray": the RayCluster that builds both pools (cuda_eval/cluster/)

    def __init__(self, config: EvalConfig | None = None, *, compile_pool=None, gpu_pool=None):
        self.config = config = config or EvalConfig()
        from cuda_eval.sandbox import config as sandbox_config
        sandbox_config.configure(uid_range=config.sandbox_uids, allow_unsandboxed=config.allow_unsandboxed)
        self.cluster = None
        if config.backend == "ray" and (compile_pool is None or gpu_pool is None):
            try:
                from cuda_eval.cluster.ray_pool import RayCluster   # ray is imported only for this backend
            except ImportError as e:
                raise RuntimeError(f"EvalConfig.backend='ray' needs the ray package ({e}): pip install -r "
                                   "requirements.txt") from e
            slot = (0,) if config.device_type == "cuda" else ("cpu0",)   # what each GPU worker runs: one device
            self.cluster = RayCluster(config, pool_config(config, slot), check_arch=check_nvcc_arch)
            n_gpus = self.cluster.device_slots()
        else:
            n_gpus = visible_gpu_count() if config.device_type == "cuda" else 0
        if config.mode == "auto":
            self.mode = "full" if (config.device_type == "cpu" or n_gpus > 0) else "compile_only"
        else:
            self.mode = config.mode
        if self.mode == "full" and config.device_type == "cuda" and n_gpus == 0 and gpu_pool is None:
            raise RuntimeError("EvalConfig(mode='full', device_type='cuda') but no GPU is visible; use "
                               "mode='auto' or 'compile_only', or device_type='cpu'")
        policy_name = config.static_policy
        if policy_name == "auto":
            policy_name = "kevin" if config.device_type == "cuda" else "cpu"
        self.static_policy = checks.StaticPolicy.named(policy_name)
        if not config.forbid_library_heavy_ops:   # the static form of the same rule (ATen below the dispatcher)
            self.static_policy = dataclasses.replace(self.static_policy, forbid_undispatched_library_ops=False)
        self._own_compile_pool = compile_pool is None
        if compile_pool is None and self.cluster is not None:
            self.arch = self.cluster.arch()   # the GPU nodes' (each compile node checks its own nvcc for it)
        elif compile_pool is None:   # the card's own arch, read once (a passed-in pool has its own)
            self.arch = target_arch(config)
            check_nvcc_arch(self.arch)
        self.compile_pool = compile_pool if compile_pool is not None else self._make_compile_pool()
        self._own_gpu_pool = gpu_pool is None and self.mode == "full"
        self.gpu_pool = gpu_pool
        if self.mode == "full" and gpu_pool is None:
            self.gpu_pool = self._make_gpu_pool(n_gpus)
        cache_root = getattr(getattr(self.compile_pool, "config", None), "resolved_cache_dir", lambda: "")()
        self.ref_cache = ReferenceTimingCache(
            None if not config.ref_timing_cache else
            (config.ref_timing_cache_dir or (os.path.join(cache_root, "ref_timing") if cache_root else None)))
        # profile feedback: the tools the worker runs on the candidate's build (resolved once, here)
        self.profile_tools = {"cuobjdump": kernel_profile.find_cuobjdump(
            getattr(getattr(self.compile_pool, "toolchain", None), "cuda_home", None))}
        self._closed = False

    # construction of the pools
    def _make_compile_pool(self):
        if self.cluster is not None:
            return self.cluster.compile_pool(self.arch)
        from cuda_eval.compile import pool as cp
        cfg = self.config
        wanted = {"workers": compile_workers(cfg), "arch": self.arch,
                  "cache_dir": cfg.cache_dir, "cache_max_bytes": cfg.cache_max_bytes,
                  "record_timeout_s": cfg.record_timeout_s, "compile_timeout_s": cfg.compile_timeout_s,
                  "max_log_chars": cfg.max_log_chars, "parallel_phases": cfg.compile_parallel_phases}
        fields = {f.name for f in dataclasses.fields(cp.CompileConfig)}
        pool = cp.CompilePool(cp.CompileConfig(**{k: v for k, v in wanted.items() if k in fields}))
        if cfg.compile_pch_at_start:
            for extra in ((), ("-O3",)):             # the flag sets nearly every KernelBench-style program uses
                pool.warm(extra)
        return pool

    def _make_gpu_pool(self, n_gpus: int):
        if self.cluster is not None:
            return self.cluster.gpu_pool()
        from cuda_eval.orchestrator.gpu_pool import GpuPool
        cfg = self.config
        if cfg.device_type == "cuda":
            devices = tuple(resolve_devices(cfg.devices, n_gpus))
        else:
            devices = tuple(f"cpu{i}" for i in range(max(1, cfg.cpu_workers)))
        return GpuPool(pool_config(cfg, devices))

    # public API
    def submit(self, requests: Sequence[EvalRequest]) -> list[concurrent.futures.Future]:
        """One future per request, in order. With `share_identical`, a request whose task and extracted program
        equal an earlier one's in the same call gets a copy of that verdict (meta.shared_with names the request that
        ran) instead of its own compile and GPU run."""
        if self._closed:
            raise RuntimeError("Evaluator is closed")
        futures, first, states = [], {}, []
        for request in requests:
            started = time.monotonic()
            extraction, error = _extract(request)
            key = None
            if self.config.share_identical and extraction is not None and extraction.code is not None:
                key = (request.task_id, task_hash(request.task_source), extraction.code, request.feedback)
            if key is not None and key in first:
                futures.append(_shared(first[key], request))
                continue
            future = self._submit_one(request, extraction, error, started, states)
            if key is not None:
                first[key] = (future, request.request_id)
            futures.append(future)
        if self.cluster is not None:
            self.cluster.watch_batch(self, states)   # ray_batch_deadline_s
        return futures

    @property
    def gpu_name(self) -> str:
        """The GPU the kernels run on, as its judge's CUDA names it (what a prompt should name); where nothing runs
        on a GPU (compile_only), target_gpu_name's answer."""
        if self.gpu_pool is not None and self.config.device_type == "cuda":
            name = (self.gpu_pool.device_info(timeout_s=0) or {}).get("gpu_name")   # never waits for a judge
            if name:
                return str(name)
        return target_gpu_name(self.config)

    def device_share(self, gpu: int):
        """A context manager for work of the caller's own on GPU `gpu` (an index of this evaluator's devices), held
        around each device call of it (gpu_pool.DeviceShare): the evaluator's timed regions and that work never
        overlap. A no-op when this evaluator runs nothing on a GPU."""
        if self.gpu_pool is None or self.config.device_type != "cuda" or self.cluster is not None:
            return contextlib.nullcontext()   # a Ray pool never times on the caller's GPUs
        return self.gpu_pool.share(str(gpu))

    def check_references(self, tasks: Sequence[tuple[str, str]]) -> list[concurrent.futures.Future]:
        """The reference path alone, for (task_id, task_source) pairs: the judge loads the task, builds its inputs,
        runs and times the reference (no candidate). Each future gives an EvalResult with `ref_timing`, or the task's
        failure in `runtime_error` with meta.reference_error (and meta.reference_oom when the card is too small);
        meta.reference_peak_bytes is the judge's peak device memory. Measured times enter the reference cache."""
        if self._closed:
            raise RuntimeError("Evaluator is closed")
        if self.mode != "full":
            raise RuntimeError("check_references needs mode='full' (a device to run the references on)")
        futures = []
        for task_id, source in tasks:
            request = EvalRequest(task_id=task_id, task_source=source, response="", request_id=f"reference:{task_id}")
            future: concurrent.futures.Future = concurrent.futures.Future()
            result = EvalResult(request_id=request.request_id, task_id=task_id, mode=self.mode, format_ok=True)
            state = _State(request, future, time.monotonic(), result, task_hash=task_hash(source))
            payload = self._payload(state, [], [], kind="reference")
            job = self.gpu_pool.submit(payload, self.config.run_timeout_s)
            job.add_done_callback(lambda f, s=state: self._guard(s, self._on_reference, f))
            futures.append(future)
        return futures

    def _on_reference(self, state: _State, job: concurrent.futures.Future) -> None:
        r = state.result
        outcome = job.result()
        if outcome.judge_failed:
            # Only the task's own code ran in the judge: a judge that never answered was held by the reference
            # (a forward slower than the timeout, or a hang). A task-level verdict; the judge is restarted.
            r.stage_times["run"] = outcome.wall_s
            r.runtime_error = ("the reference program did not finish within the run timeout "
                               f"({self.config.run_timeout_s:.0f} s + margin): "
                               + _useful_stderr(outcome.stderr_tail, startup=False)[-600:])
            r.meta.update(reference_error=True, reference_timeout=True)
            self._finish(state)
            return
        w = self._apply_outcome(state, outcome)
        r.correct = None   # nothing was judged but the task itself
        if w is not None:
            r.runtime_error = w.get("runtime_error")
            r.ref_timing = w.get("ref_timing")
            r.meta.update({k: v for k, v in (w.get("meta") or {}).items()
                           if k not in ("pid", "python", "total_memory")})
            if w.get("ref_timing_measured") and r.ref_timing and w.get("ref_timing_key"):
                self.ref_cache.store(state.task_hash, w["ref_timing_key"], r.ref_timing)
        if not state.future.done():
            self._finish(state)

    def evaluate(self, requests: Sequence[EvalRequest], progress_every_s: float = 30.0) -> list[EvalResult]:
        """Verdicts in request order. A batch of cold compiles can take minutes: a line every `progress_every_s`
        says how many verdicts are in, so that a long evaluation is not mistaken for a hang."""
        futures = self.submit(requests)
        pending, started = set(futures), time.monotonic()
        while pending:
            _, pending = concurrent.futures.wait(pending, timeout=progress_every_s)
            if pending:
                log.info("cuda_eval: %d of %d verdicts after %.0f s", len(futures) - len(pending), len(futures),
                         time.monotonic() - started)
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._own_gpu_pool and self.gpu_pool is not None:
            self.gpu_pool.close()
        if self._own_compile_pool and self.compile_pool is not None:
            self.compile_pool.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # the pipeline
    def _submit_one(self, request: EvalRequest, extraction, extract_error: str | None,
                    started: float, states: list | None = None) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        result = EvalResult(request_id=request.request_id, task_id=request.task_id, mode=self.mode, format_ok=False)
        state = _State(request, future, started, result, task_hash=task_hash(request.task_source))
        if states is not None:
            states.append(state)
        result.meta.update(device_type=self.config.device_type, num_trials=self.config.num_correct_trials)
        result.format_error = extract_error
        result.stage_times["extract"] = time.monotonic() - started
        if extraction is None or extraction.code is None:
            result.format_error = result.format_error or (extraction.error if extraction else "no program")
            return self._finish(state)
        result.format_ok, result.code = True, extraction.code
        state.static_flags = [f.to_dict() for f in checks.static_check(extraction.code, self.static_policy)]
        result.hack_flags = list(state.static_flags)
        if scoring.split_flags(state.static_flags, self.config.profile)[0] and \
                self.config.skip_run_on_static_flags:
            return self._finish(state)
        state.compile_submitted = time.monotonic()
        try:
            compile_future = self.compile_pool.submit(request.task_source, extraction.code)
        except Exception as e:
            return self._internal_error(state, f"compile pool refused the job: {type(e).__name__}: {e}")
        state.stage_future = compile_future
        compile_future.add_done_callback(lambda f, s=state: self._guard(s, self._on_compiled, f))
        return future

    def _guard(self, state: _State, fn, *args) -> None:
        """Run a pipeline step; a bug in it becomes this request's internal error, never a lost future."""
        if state.future.done():   # a deadline gave the verdict already
            return
        try:
            fn(state, *args)
        except EvaluatorTimeout as e:
            self._evaluator_timeout(state, e)
        except Exception as e:  # noqa: BLE001 - reported in the result
            import traceback
            self._internal_error(state, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")

    def _internal_error(self, state: _State, message: str) -> concurrent.futures.Future:
        state.result.runtime_error = INTERNAL_ERROR + message
        state.result.meta["internal_error"] = True
        return self._finish(state)

    def _evaluator_timeout(self, state: _State, error: EvaluatorTimeout) -> None:
        """The verdict of a candidate a deadline stopped: not judged (scored as an internal error), with where it
        stopped in meta.evaluator_timeout. A copy: a stage still running may write into the original."""
        if state.future.done():
            return
        result = copy.deepcopy(state.result)
        result.runtime_error = f"evaluator_timeout (not the candidate's fault): {error}"
        result.meta.update(internal_error=True, evaluator_timeout=dict(error.where))
        self._finish(dataclasses.replace(state, result=result))

    def _on_compiled(self, state: _State, compile_future: concurrent.futures.Future) -> None:
        state.compile_done = time.monotonic()
        r = state.result
        outcome = compile_future.result()
        timings = dict(getattr(outcome, "timings", {}) or {})
        compile_s = float(timings.get("wall_s", state.compile_done - state.compile_submitted))
        r.stage_times["compile"] = compile_s
        r.stage_times["queue"] = max(0.0, state.compile_done - state.compile_submitted - compile_s)
        modules = [_as_dict(m) for m in (getattr(outcome, "modules", None) or [])]
        specs = [_as_dict(s) for s in (getattr(outcome, "specs", None) or [])]
        toolchain = dict(getattr(outcome, "toolchain", {}) or {})
        r.meta.update(cache_hit=bool(modules) and all(m.get("cache_hit") for m in modules),
                      arch=toolchain.get("arch"), toolchain=toolchain, compile_timings=timings,
                      extensions=[m.get("name") for m in modules])
        if getattr(outcome, "placement", None):   # a Ray compile worker: its node
            r.meta["built_on"] = outcome.placement
        r.compile_log = getattr(outcome, "log", "") or ""
        if not outcome.ok:
            r.compiled = False
            r.meta["compile_error_kind"] = getattr(outcome, "error_kind", None)
            if not r.compile_log:
                r.compile_log = f"build failed ({r.meta['compile_error_kind']})"
            self._finish(state)
            return
        r.compiled = True
        if self.mode == "compile_only":
            self._finish(state)
            return
        # The candidate's kernels: the symbols of the device code its build produced (never its source's text)
        kernel_names = kernel_symbols.kernel_names(k for m in modules for k in (m.get("kernels") or []))
        payload = self._payload(state, modules, kernel_names, kind="evaluate")
        job = self.gpu_pool.submit(payload, self.config.run_timeout_s)
        state.stage_future = job
        job.add_done_callback(lambda f, s=state, p=payload: self._guard(s, self._on_ran, f, p))

    def _payload(self, state: _State, modules: list, kernel_names: list, kind: str) -> dict:
        """The job for the pool and the judge (protocol/job.py: typed and checked here, plain JSON on the wire)."""
        profile = kind == "evaluate" and (self.config.kernel_profile or state.request.feedback == "profile")
        return JobPayload(
            kind=kind, task_source=state.request.task_source, code=state.result.code, modules=modules,
            kernel_names=kernel_names, runtime_build=self._runtime_build(),
            ref_timing_cache=self.ref_cache.entries(state.task_hash) if self.config.ref_timing_cache else {},
            config=job_config(self.config, kernel_profile=profile, profile_tools=self.profile_tools)).to_dict()

    def _runtime_build(self) -> RuntimeBuild | None:
        """What a worker needs to build an extension reached only at run time (worker/runtime_build.py)."""
        toolchain = getattr(self.compile_pool, "toolchain", None)
        if toolchain is None or not hasattr(toolchain, "to_dict"):
            return None
        from cuda_eval.sandbox.runtime import staged_path_map
        return RuntimeBuild(toolchain=toolchain.to_dict(), cache_dir=getattr(self.compile_pool, "cache_dir", None),
                            timeout_s=self.config.compile_timeout_s, path_map=staged_path_map())

    def _apply_outcome(self, state: _State, outcome) -> dict | None:
        """Fold a worker outcome into the result; returns the worker's result dict (None if it crashed)."""
        r = state.result
        r.stage_times["queue"] = r.stage_times.get("queue", 0.0) + outcome.queue_s
        r.stage_times["run"] = r.stage_times.get("run", 0.0) + outcome.wall_s
        info = outcome.worker_info or {}
        r.meta.update(gpu_name=info.get("gpu_name"), torch_version=info.get("torch_version"), device=outcome.device,
                      timer=info.get("timer"), run_started_at=outcome.started_at)
        if getattr(outcome, "placement", None):   # a Ray GPU worker: its node and GPU
            r.meta["timed_on"] = outcome.placement
        if getattr(outcome, "peak_rss_bytes", None):
            r.meta["worker_peak_rss_bytes"] = outcome.peak_rss_bytes
        w = outcome.result
        if outcome.start_failed:
            self._internal_error(state, "the worker process failed to start:\n"
                                 + _useful_stderr(outcome.stderr_tail, startup=True))
            return None
        if w is None:
            r.correct = False
            r.runtime_error = crash_message(outcome)
            r.meta["crash"] = {"exit_code": outcome.exit_code, "signal": outcome.signal,
                               "timed_out": outcome.timed_out, "phase": (outcome.progress or {}).get("phase")}
            return None
        if w.get("status") == "internal_error":
            self._internal_error(state, w.get("internal_error") or "worker bug")
            return None
        return w

    def _on_ran(self, state: _State, job: concurrent.futures.Future, payload: dict) -> None:
        r = state.result
        outcome = job.result()
        w = self._apply_outcome(state, outcome)
        if w is None:
            if not state.future.done():
                self._finish(state)
            return
        r.correct = w.get("correct")
        r.runtime_error = w.get("runtime_error")
        r.trials = w.get("trials") or []
        r.timing = w.get("timing")
        r.ref_timing = w.get("ref_timing")
        r.hack_flags = _merge_flags(state.static_flags, w.get("hack_flags") or [])
        worker_meta = w.get("meta") or {}
        r.meta.update({k: v for k, v in worker_meta.items()
                       if k not in ("pid", "python", "total_memory")})
        r.meta["ref_timing_cached"] = bool(r.ref_timing) and not w.get("ref_timing_measured")
        if w.get("ref_timing_measured") and r.ref_timing and w.get("ref_timing_key"):
            self.ref_cache.store(state.task_hash, w["ref_timing_key"], r.ref_timing)
        if r.correct and r.timing and r.ref_timing and r.timing.get("median_ms"):
            r.speedup = r.ref_timing["median_ms"] / r.timing["median_ms"]
        if r.correct and r.timing and isinstance(r.timing.get("peak_fraction"), (int, float)):
            r.peak_fraction = float(r.timing["peak_fraction"])
        threshold = self.config.retime_speedup_threshold
        if r.correct and not r.hack_flags and r.speedup and threshold and r.speedup > threshold:
            retime = dict(payload, kind="retime", ref_timing_cache={})
            fut = self.gpu_pool.submit(retime, self.config.run_timeout_s)
            state.stage_future = fut
            fut.add_done_callback(lambda f, s=state: self._guard(s, self._on_retimed, f))
            return
        self._finish(state)

    def _on_retimed(self, state: _State, job: concurrent.futures.Future) -> None:
        r = state.result
        first = r.speedup
        outcome = job.result()
        w = outcome.result
        r.stage_times["run"] = r.stage_times.get("run", 0.0) + outcome.wall_s
        fresh = None
        if w and w.get("status") == "ok" and w.get("correct") and w.get("timing") and w.get("ref_timing"):
            fresh = w["ref_timing"]["median_ms"] / w["timing"]["median_ms"]
        r.meta["retime"] = {"first_speedup": first, "fresh_speedup": fresh,
                            "fresh_timing": (w or {}).get("timing"), "fresh_ref_timing": (w or {}).get("ref_timing")}
        if fresh is None:
            why = (w or {}).get("runtime_error") or crash_message(outcome) if not (w and w.get("correct")) else ""
            r.hack_flags.append({"code": "speedup_not_reproduced",
                                 "reason": f"speedup {first:.1f}x could not be re-measured in a fresh process: "
                                           f"{why}"[:600]})
        elif fresh < first * self.config.retime_min_ratio:
            r.hack_flags.append({"code": "speedup_not_reproduced",
                                 "reason": f"speedup {first:.1f}x fell to {fresh:.1f}x in a fresh process"})
        else:
            if fresh < first and r.peak_fraction is not None:   # the same time enters both
                r.peak_fraction *= fresh / first
            r.speedup = min(first, fresh)  # the conservative of two honest measurements
        self._finish(state)

    def _finish(self, state: _State) -> concurrent.futures.Future:
        r = state.result
        r.stage_times.setdefault("queue", 0.0)
        r.stage_times.setdefault("compile", 0.0)
        r.stage_times.setdefault("run", 0.0)
        r.stage_times["total"] = time.monotonic() - state.started
        r.meta["profile"] = self.config.profile
        r.hack_flags, advisory = scoring.split_flags(r.hack_flags, self.config.profile)
        r.advisory_flags = r.advisory_flags + advisory
        mode = state.request.feedback
        r.feedback = feedback.render(r, self.config.max_feedback_chars, mode=mode)
        if mode == "profile" and r.correct and not r.hack_flags:
            why = feedback.profile_unavailable(r)
            r.meta["feedback"] = "kevin" if why else "profile"
            if why:   # the plain text was given instead: say why, once per verdict
                r.meta["feedback_fallback"] = why
                log.info("cuda_eval: %s: no profile in the feedback (%s)", r.request_id or r.task_id, why)
        if not state.future.done():
            with contextlib.suppress(concurrent.futures.InvalidStateError):   # a deadline's verdict came first
                state.future.set_result(r)
        return state.future


def _extract(request: EvalRequest) -> tuple[Any, str | None]:
    """(extraction, error): extraction promises never to raise; if it does, the verdict says so."""
    try:
        return extract_code(request.response), None
    except Exception as e:  # noqa: BLE001
        return None, f"could not read the response ({type(e).__name__}: {e})"


def _shared(primary: tuple, request: EvalRequest) -> concurrent.futures.Future:
    """A copy of the primary request's verdict, under this request's id, once the primary's is in."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    primary_future, primary_id = primary
    started = time.monotonic()

    def copy_verdict(done: concurrent.futures.Future) -> None:
        try:
            r = copy.deepcopy(done.result())
            r.request_id = request.request_id
            r.meta["shared_with"] = primary_id
            r.stage_times = {"extract": 0.0, "queue": 0.0, "compile": 0.0, "run": 0.0,
                             "total": time.monotonic() - started}
            future.set_result(r)
        except Exception as e:  # noqa: BLE001 - a lost future would hang evaluate()
            future.set_exception(e)
    primary_future.add_done_callback(copy_verdict)
    return future


def _as_dict(obj: Any) -> dict:
    if isinstance(obj, dict):
        return dict(obj)
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return dict(vars(obj))


def _merge_flags(static: list[dict], dynamic: list[dict]) -> list[dict]:
    out = list(static)
    for f in dynamic:
        if not any(g["code"] == f["code"] for g in out):
            out.append(f)
    return out


def evaluate(requests: Sequence[EvalRequest], config: EvalConfig | None = None) -> list[EvalResult]:
    """One-shot convenience: start an Evaluator, evaluate, shut it down."""
    with Evaluator(config) as evaluator:
        return evaluator.evaluate(requests)
