"""The one door between kevin_jax and the evaluator (Contract 1 in docs/ARCHITECTURE.md).

    with Evaluator(EvalConfig(devices="all", mode="auto")) as ev:
        results = ev.evaluate(requests)       # blocking, order preserved
        futures = ev.submit(requests)         # concurrent.futures, one per request

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
import json
import logging
import os
import shutil
import subprocess
import time
from typing import Any, Sequence

from cuda_eval import feedback, scoring
from cuda_eval.cluster import EvaluatorTimeout  # the Ray backend's deadline verdict (no ray import)
from cuda_eval.compile import kernel_symbols
from cuda_eval.profile import kernel_profile
# re-exported: a report over saved verdicts shows a kernel's profile (launch/eval.py --profile)
from cuda_eval.profile.kernel_profile import render_breakdown as profile_breakdown  # noqa: F401
from cuda_eval.protocol.job import DynamicChecks, JobConfig, JobPayload, JobTiming, RuntimeBuild
from cuda_eval.ref_timing import ReferenceTimingCache, task_hash
from cuda_eval.static import checks
from cuda_eval.static.extraction import extract_code  # re-exported: env.parse uses the same extraction
# re-exported: the trainer sizes and watches the host's memory by the same reading as the output buffers' grants
from cuda_eval.host_memory import host_memory_available, host_memory_total  # noqa: F401

log = logging.getLogger(__name__)

__all__ = ["EvalConfig", "EvalRequest", "EvalResult", "Evaluator", "evaluate", "extract_code", "host_memory_available",
           "host_memory_total", "profile_breakdown"]


@dataclasses.dataclass
class EvalConfig:
    """Evaluator settings (the `eval` config section has exactly these field names)."""
    profile: str = "kevin"              # "kevin" | "kernelbench" | "strict": a named set of the fields below
                                        # (cuda_eval/scoring.py; docs/EVALUATOR.md, "Profiles")
    mode: str = "auto"                  # "full" (compile + run), "compile_only" (no GPU: nvcc only), "auto"
    device_type: str = "cuda"           # "cuda", or "cpu": C++ (with_cuda=False) candidates on CPU tensors (tests)
    devices: Any = "all"                # GPU indices: "all", "0,1", [0, 1] or 0
    cpu_workers: int = 1                # parallel candidates in CPU mode
    cpu_threads: int = 1                # torch threads of a CPU-mode worker
    # compilation (compile/pool.py)
    compile_workers: int = 0            # 0 = one per CPU core
    compile_parallel_phases: bool = True  # a build's host and device chains side by side: it holds up to ~4.3 GiB
                                          # at once; one after the other ~2.1 GiB and ~20% more wall time (a host
                                          # short of memory builds more at once that way)
    compile_pch_at_start: bool = False  # build the precompiled torch/extension.h of the default and -O3 flag sets
                                        # when the evaluator starts (else in the background at first use: ~2.9 GiB
                                        # beside that candidate's own build, which then compiles without it)
    arch: str = "auto"                  # "auto" (the GPU in use; sm_90 without one) or e.g. "sm_90"
    cache_dir: str = ""                 # "" = $CUDA_EVAL_CACHE_DIR or /var/tmp/cuda_eval_cache (sandbox-readable)
    cache_max_bytes: int = 20 << 30
    record_timeout_s: float = 120.0
    compile_timeout_s: float = 300.0
    max_log_chars: int = 4000           # compile log shown to the model
    # running
    run_timeout_s: float = 180.0        # one candidate in a worker (correctness + timing + checks)
    worker_start_timeout_s: float = 180.0
    spare_workers: int = 0              # pre-started workers kept per device; 0 = auto (auto_spare_workers)
    run_dir: str = ""                   # worker directories ("" = a temporary directory)
    worker_memory_bytes: int = 32 << 30  # host memory of a judge/worker process (RLIMIT_DATA and, where the
                                         # machine offers one, its memory cgroup; GPU memory is not counted); 0 = none
    host_memory_reserve_gib: float = 0.0  # host memory a job's output buffer must leave available; 0 = max(2 GiB,
                                          # 2% of the host's). A trainer beside the evaluator sets its own floor here
    # the sandbox (docs/EVALUATOR.md, "Sandbox")
    sandbox_uids: str = "60000-60999"   # as root: the dedicated uids candidates run as (inclusive); a uid is used
                                        # only if no account, process or file has it
    allow_unsandboxed: bool = False     # not root and no user namespaces: run candidates as our own uid (with a
                                        # warning) instead of refusing
    # correctness
    num_correct_trials: int = 5
    affine_trials: int = 2              # more trials on inputs x * s + m, s and m drawn per trial (docs/EVALUATOR.md,
                                        # "Correctness"), after the others pass; 0: none
    atol: float = 1e-2
    rtol: float = 1e-2
    strict: bool = False                # the strict profile: atol = rtol = 1e-4 for float32 outputs
    seed: int = 42
    # timing
    timing_method: str = "gated"        # "gated" | "device_sync" | "kernelbench" (docs/EVALUATOR.md, "Timing")
    timing_target_s: float = 0.25       # timed work per model (reps adapt within [min, max])
    timing_warmup_s: float = 0.03
    timing_min_reps: int = 20
    timing_max_reps: int = 200
    timing_input_sets: int = 4          # input sets rotated between reps
    timing_inputs_max_bytes: int = 4 << 30
    ref_compile: bool = False           # also time torch.compile(reference) (meta.ref_compile_timing)
    ref_timing_cache: bool = True
    ref_timing_cache_dir: str = ""      # "" = <cache_dir>/ref_timing
    # reward-hack defence
    static_policy: str = "auto"         # "kevin", "cpu" (no __global__ rule), "off"; "auto": by device_type
    skip_run_on_static_flags: bool = True
    require_custom_kernel: bool = True
    forbid_python_torch_compute: bool = True
    forbid_reference_ops: bool = True
    forbid_library_heavy_ops: bool = True
    forbid_host_transfer: bool = True
    kernel_trace: bool = True           # profile one forward (CUDA): own kernels ran, no unsynchronised streams
    kernel_trace_calls: bool = True     # ... and trace the kernels of every call, timed ones included (CUPTI)
    flag_native_threads: bool = False
    unsynced_slack_us: float = 50.0
    retime_speedup_threshold: float = 5.0   # re-time in a fresh process above this speedup (0 = never)
    retime_min_ratio: float = 0.5           # flag if the fresh speedup is below this fraction of the first
    max_feedback_chars: int = 3000
    # profile feedback (profile/; docs/EVALUATOR.md, "Profile feedback"): a correct, unflagged candidate of
    # a request with feedback="profile" is profiled after its verdict is complete; kernel_profile=True profiles every
    # such candidate (launch/eval.py --profile). Advisory: never changes a verdict or a score.
    kernel_profile: bool = False
    kernel_profile_timeout_s: float = 30.0
    # one verdict per distinct (task, program) within a batch: a policy that has converged on an answer samples the
    # same program many times (the 80M demo: most of a 128-kernel round), and each copy would cost a GPU slot
    share_identical: bool = True
    # where the workers run (docs/ARCHITECTURE.md, "Evaluation on a Ray cluster"): "local" (this host's compile pool
    # and GPUs) or "ray" (compile and GPU workers on the nodes of a Ray cluster that offer the resources
    # cuda_eval_compile / cuda_eval_gpu; this process runs none). The same verdicts either way.
    backend: str = "local"
    ray_address: str = "auto"           # ray.init's address: "auto" joins the cluster this process runs in
    ray_candidate_deadline_s: float = 0.0  # one stage of a candidate (its build, a GPU job) on a Ray worker; past it
                                           # the verdict is evaluator_timeout. 0 = the stage's own timeouts + 120 s
    ray_batch_deadline_s: float = 14400.0  # every verdict of one submit() call, queueing included; 0 = none
    ray_max_attempts: int = 3           # runs of a stage whose worker (or node) died before it answered

    def __post_init__(self):
        scoring.apply(self, {f.name: f.default for f in dataclasses.fields(self)
                              if f.default is not dataclasses.MISSING})
        checks_ok = {"mode": ("auto", "full", "compile_only"), "device_type": ("cuda", "cpu"),
                     "static_policy": ("auto", "kevin", "cpu", "kernelbench", "off"),
                     "timing_method": ("gated", "device_sync", "kernelbench"), "backend": ("local", "ray")}
        for name, allowed in checks_ok.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"EvalConfig.{name}={getattr(self, name)!r}: expected one of {allowed}")
        if self.ray_max_attempts < 1 or self.ray_candidate_deadline_s < 0 or self.ray_batch_deadline_s < 0:
            raise ValueError("EvalConfig.ray_max_attempts must be >= 1 and the ray_*_deadline_s >= 0")
        if self.num_correct_trials < 1:
            raise ValueError("EvalConfig.num_correct_trials must be >= 1")
        if self.affine_trials < 0:
            raise ValueError("EvalConfig.affine_trials must be >= 0")
        if self.spare_workers < 0:
            raise ValueError("EvalConfig.spare_workers must be >= 0 (0 = auto)")
        if self.worker_memory_bytes < 0:
            raise ValueError("EvalConfig.worker_memory_bytes must be >= 0 (0 = no limit)")
        if not self.host_memory_reserve_gib >= 0:
            raise ValueError("EvalConfig.host_memory_reserve_gib must be >= 0 (0 = the evaluator's default)")
        from cuda_eval.sandbox.runner import parse_uid_range
        try:
            parse_uid_range(self.sandbox_uids)
        except ValueError as e:
            raise ValueError(f"EvalConfig.sandbox_uids: {e}") from None


def _usable_cpus() -> int:
    from cuda_eval.compile.pool import usable_cpus  # the pool module loads lazily, with the evaluator
    return usable_cpus()


def compile_workers(config: EvalConfig) -> int:
    """Builds at once: EvalConfig.compile_workers, or one per usable core."""
    return config.compile_workers or _usable_cpus()


def spare_workers(config: EvalConfig, n_devices: int) -> int:
    """Spare workers per device: EvalConfig.spare_workers, or auto_spare_workers."""
    return config.spare_workers or auto_spare_workers(n_devices)


def auto_spare_workers(n_devices: int, cpu_count: int | None = None) -> int:
    """Spare workers per device when EvalConfig.spare_workers is 0. A device runs one candidate at a time (~0.9 s of
    worker wall on an H200) while a fresh worker needs seconds to import torch and initialise CUDA; with 2 spares
    the GPU mostly waited for workers (docs/LOG.md, "steps are evaluation-bound": 28% busy in eval_throughput, a
    68-kernel round took 117 s for ~0.9 s jobs). Enough spares to hide start-up, bounded by the cores (a start-up is
    CPU-bound) and by memory (a CUDA context each)."""
    cores = cpu_count if cpu_count is not None else max(2, _usable_cpus())
    return max(2, min(8, cores // (2 * max(1, n_devices))))


FEEDBACK_MODES = ("kevin", "profile")
STRICT_FP32_TOLERANCE = 1e-4   # atol = rtol for float32 outputs under the strict profile (EvalConfig.strict)
# How a verdict that is our failure, not the candidate's, begins (its meta also says internal_error).
INTERNAL_ERROR = "internal evaluator error (not the candidate's fault): "


@dataclasses.dataclass
class EvalRequest:
    task_id: str
    task_source: str          # the reference program (KernelBench format)
    response: str             # raw model text (the program is extracted from it)
    request_id: str = ""
    feedback: str = "kevin"   # "kevin": today's text; "profile": a correct kernel's text adds a short profile of
                              # its kernels and the reference's (docs/EVALUATOR.md, "Profile feedback")

    def __post_init__(self):
        if self.feedback not in FEEDBACK_MODES:
            raise ValueError(f"EvalRequest.feedback={self.feedback!r}: expected one of {FEEDBACK_MODES}")


@dataclasses.dataclass
class EvalResult:
    request_id: str
    task_id: str
    mode: str
    format_ok: bool
    format_error: str | None = None
    code: str | None = None
    compiled: bool | None = None
    compile_log: str = ""
    runtime_error: str | None = None
    correct: bool | None = None
    trials: list = dataclasses.field(default_factory=list)
    timing: dict | None = None
    ref_timing: dict | None = None
    speedup: float | None = None
    peak_fraction: float | None = None   # the share of the roofline the candidate's time reached (judge/floor.py)
    hack_flags: list = dataclasses.field(default_factory=list)       # each zeroes the score
    advisory_flags: list = dataclasses.field(default_factory=list)   # reported only (profiles other than kevin)
    stage_times: dict = dataclasses.field(default_factory=dict)
    feedback: str = ""
    meta: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: dict) -> "EvalResult":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"EvalResult.from_dict: unknown fields {sorted(unknown)}")
        return cls(**data)


# --- helpers --------------------------------------------------------------------------------------------------
def visible_gpu_count() -> int:
    """GPUs this process may use, without importing torch or initialising CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        n = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        n = 0
    if n == 0 and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            n = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            n = 0
    if visible is not None and n:
        n = min(n, len([v for v in visible.split(",") if v.strip()]))
    return n


# The card named where no GPU is visible (compile_only): the one of the arch the build targets then.
DEFAULT_GPU_NAME = "NVIDIA H100"                 # toolchain.DEFAULT_ARCH, sm_90
ARCH_CARDS = {"sm_80": "NVIDIA A100", "sm_86": "NVIDIA A10", "sm_89": "NVIDIA L40S", "sm_90": "NVIDIA H100",
              "sm_90a": "NVIDIA H100", "sm_100": "NVIDIA B200", "sm_100a": "NVIDIA B200", "sm_103": "NVIDIA B300",
              "sm_120": "NVIDIA RTX PRO 6000 Blackwell"}


def arch_of_capability(capability: str) -> str:
    """A compute capability ("9.0", "12.0", as nvidia-smi and torch report it) -> the nvcc arch ("sm_90", "sm_120")."""
    from cuda_eval.compile.toolchain import normalize_arch
    major, _, minor = str(capability).strip().partition(".")
    if not (major.isdigit() and (minor or "0").isdigit()):
        raise ValueError(f"bad compute capability {capability!r} (expected e.g. '9.0')")
    return normalize_arch(f"sm_{int(major)}{int(minor or 0)}")


def card_of_arch(arch: str) -> str:
    """The card named for an arch when no GPU is there to ask (compile_only with eval.arch set)."""
    from cuda_eval.compile.toolchain import normalize_arch
    arch = normalize_arch(arch)
    if arch in ARCH_CARDS:
        return ARCH_CARDS[arch]
    digits = arch[3:].rstrip("abf")
    return f"NVIDIA GPU of compute capability {digits[:-1]}.{digits[-1]}"


def gpu_facts(devices: Any) -> list[dict]:
    """[{index, name, capability}] of the GPUs `devices` names (EvalConfig.devices: indices among the visible ones),
    read with nvidia-smi: no CUDA context, no torch. Empty without a GPU or nvidia-smi."""
    n = visible_gpu_count()
    smi = shutil.which("nvidia-smi")
    if not n or not smi:
        return []
    from cuda_eval.gpu_pool import _physical_device
    facts = []
    for index in resolve_devices(devices, n):
        try:
            out = subprocess.run([smi, "-i", _physical_device(str(index)), "--query-gpu=name,compute_cap",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            name, capability = (x.strip() for x in out.stdout.strip().splitlines()[0].rsplit(",", 1))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            continue
        facts.append({"index": index, "name": name, "capability": capability})
    return facts


def target_arch(config: EvalConfig) -> str:
    """The arch the candidates are built for: EvalConfig.arch, or ("auto") the compute capability of the GPUs the
    evaluator runs on (all must have the same: one build serves them all), else toolchain.DEFAULT_ARCH (no GPU)."""
    from cuda_eval.compile.toolchain import DEFAULT_ARCH, normalize_arch
    if config.arch != "auto":
        return normalize_arch(config.arch)
    if config.device_type != "cuda":
        return DEFAULT_ARCH
    archs = {arch_of_capability(f["capability"]) for f in gpu_facts(config.devices)}
    if len(archs) > 1:
        raise ValueError(f"EvalConfig.devices={config.devices!r} are GPUs of different architectures "
                         f"({', '.join(sorted(archs))}): one evaluator builds for one; run one per kind of GPU, or "
                         "set EvalConfig.arch to the lowest")
    return archs.pop() if archs else DEFAULT_ARCH


def target_gpu_name(config: EvalConfig) -> str:
    """The GPU the kernels will run on, as CUDA names it ("NVIDIA H100 80GB HBM3"): the first of the evaluator's
    devices; with none visible (compile_only), the card of EvalConfig.arch, or of the default arch."""
    if config.device_type == "cuda":
        facts = gpu_facts(config.devices)
        if facts:
            return facts[0]["name"]
    return card_of_arch(config.arch) if config.arch != "auto" else DEFAULT_GPU_NAME


def check_nvcc_arch(arch: str, nvcc: str | None = None) -> None:
    """RuntimeError when the installed nvcc cannot build for `arch` (every candidate would fail to compile): said
    once, at start-up, instead. Skipped where nvcc or its --list-gpu-code is missing."""
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        return
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return
    known = set(out.stdout.split())
    if out.returncode != 0 or not known:
        return
    base = arch.rstrip("af") if arch[-1:] in ("a", "f") and arch[-2:-1].isdigit() else arch
    if base not in known:
        raise RuntimeError(f"{nvcc} cannot build for {arch}, the GPU's architecture (it knows "
                           f"{' '.join(sorted(known))}): install a CUDA toolkit that supports it, or set "
                           "EvalConfig.arch")


def resolve_devices(devices: Any, available: int) -> list[int]:
    if devices == "all" or devices is None:
        return list(range(available))
    if isinstance(devices, int):
        chosen = [devices]
    elif isinstance(devices, str):
        chosen = [int(d) for d in devices.split(",") if d.strip()]
    else:
        chosen = [int(d) for d in devices]
    bad = [d for d in chosen if d < 0 or d >= max(available, 1) and available]
    if bad:
        raise ValueError(f"devices {bad} do not exist: {available} GPU(s) visible")
    return chosen


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
    from cuda_eval.gpu_pool import PoolConfig
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
        from cuda_eval.sandbox import runner as sandbox
        sandbox.configure(uid_range=config.sandbox_uids, allow_unsandboxed=config.allow_unsandboxed)
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
        from cuda_eval.gpu_pool import GpuPool
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
        return RuntimeBuild(toolchain=toolchain.to_dict(), cache_dir=getattr(self.compile_pool, "cache_dir", None),
                            timeout_s=self.config.compile_timeout_s)

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
