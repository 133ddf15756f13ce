"""The contract's types between the trainer and the evaluator (Contract 1 in docs/ARCHITECTURE.md): the `eval`
config section, one request, one verdict, as plain data. Users reach them through `cuda_eval.api`, the one door;
they live here so that the evaluator's own modules (orchestrator/) can use them without importing the door that
re-exports the evaluator itself. No torch, no jax.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from cuda_eval.orchestrator import scoring


@dataclasses.dataclass
class EvalConfig:
    """Evaluator settings (the `eval` config section has exactly these field names)."""
    profile: str = "kevin"              # "kevin" | "kernelbench" | "strict": a named set of the fields below
                                        # (cuda_eval/orchestrator/scoring.py; docs/EVALUATOR.md, "Profiles")
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
        from cuda_eval.sandbox.config import parse_uid_range
        try:
            parse_uid_range(self.sandbox_uids)
        except ValueError as e:
            raise ValueError(f"EvalConfig.sandbox_uids: {e}") from None



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

