"""One GPU job as plain, typed data: what the trainer's process asks the judge to do, and the settings the judge and
the candidate's worker read.

Built once in the trainer's process from EvalConfig (api.py: `Evaluator._payload`), every field given: these classes
have no defaults of their own, so EvalConfig's are the only ones. On the wire a payload is plain JSON (`to_dict`;
the pool sends it to the judge, the judge sends `config` on to the worker), never a pickle; each side rebuilds it
with `from_dict`, which refuses a missing or unknown field and a value of the wrong type, so that a reader never
falls back to a default of its own.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

KINDS = ("evaluate", "retime", "reference")   # a candidate; its re-timing in a fresh process; the reference alone
TIMING_METHODS = ("gated", "device_sync", "kernelbench")   # protocol/timing.py METHODS (no torch imported here)


class PayloadError(ValueError):
    """A job payload or its config is malformed (a bug of ours: only our processes write them)."""


def _check(value: Any, kind: type | tuple, where: str) -> Any:
    """`value` if it is of `kind` (an int is never a bool here; a float may be given as an int; floats are finite)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(isinstance(value, k) and not (k in (int, float) and isinstance(value, bool)) for k in kinds)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        names = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
        raise PayloadError(f"{where}: expected {names}, got {type(value).__name__} {value!r:.80}")
    return value


def _fields(cls, data: Any, where: str) -> dict:
    """The items of `data` (a mapping) with exactly the field names of `cls`."""
    if not isinstance(data, Mapping):
        raise PayloadError(f"{where}: expected an object, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    missing, unknown = [n for n in names if n not in data], sorted(set(data) - set(names))
    if missing or unknown:
        raise PayloadError(f"{where}: missing fields {missing}, unknown fields {unknown}")
    return {n: data[n] for n in names}


def _checked(obj, where: str) -> None:
    """Every field of a dataclass instance against its annotation (the simple types used here)."""
    kinds = {"bool": bool, "int": int, "float": float, "str": str, "float | None": (float, type(None)),
             "str | None": (str, type(None))}
    for f in dataclasses.fields(obj):
        if f.type in kinds:
            _check(getattr(obj, f.name), kinds[f.type], f"{where}.{f.name}")


@dataclasses.dataclass(frozen=True)
class JobTiming:
    """The timing protocol's settings (protocol/timing.TimingConfig takes them; the reference-timing cache key
    holds them as they are)."""
    target_s: float
    warmup_s: float
    min_reps: int
    max_reps: int
    method: str

    def __post_init__(self):
        _checked(self, "config.timing")
        if self.method not in TIMING_METHODS:
            raise PayloadError(f"config.timing.method: {self.method!r} is not one of {TIMING_METHODS}")


@dataclasses.dataclass(frozen=True)
class DynamicChecks:
    """Which of the run-time hack checks apply (EvalConfig's fields of the same names)."""
    require_custom_kernel: bool
    forbid_python_torch_compute: bool
    forbid_reference_ops: bool
    forbid_library_heavy_ops: bool
    forbid_host_transfer: bool
    kernel_trace: bool
    kernel_trace_calls: bool
    flag_native_threads: bool
    unsynced_slack_us: float

    def __post_init__(self):
        _checked(self, "config.dynamic")


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """The evaluator's settings of one job, as the judge and the worker read them."""
    num_trials: int                 # correctness trials (EvalConfig.num_correct_trials)
    affine_trials: int              # trials on affinely changed inputs after those (EvalConfig.affine_trials)
    atol: float
    rtol: float
    strict_fp32: float | None       # replaces atol and rtol for float32 outputs (the strict profile), or None
    seed: int
    timing: JobTiming
    timing_input_sets: int
    timing_inputs_max_bytes: int
    ref_compile: bool
    kernel_profile: bool            # profile feedback for this job (EvalConfig.kernel_profile or the request's)
    kernel_profile_timeout_s: float
    profile_tools: dict             # {"cuobjdump": path | None}: the tools the worker runs on the candidate's build
    dynamic: DynamicChecks

    def __post_init__(self):
        _checked(self, "config")
        _check(self.timing, JobTiming, "config.timing")
        _check(self.dynamic, DynamicChecks, "config.dynamic")
        if self.num_trials < 1 or self.affine_trials < 0 or self.timing_input_sets < 1 or self.timing_inputs_max_bytes < 0:
            raise PayloadError(f"config: num_trials {self.num_trials} and timing_input_sets "
                               f"{self.timing_input_sets} must be >= 1, timing_inputs_max_bytes >= 0")
        if set(_check(self.profile_tools, dict, "config.profile_tools")) - {"cuobjdump"}:
            raise PayloadError(f"config.profile_tools: unknown tools {sorted(self.profile_tools)}")
        _check(self.profile_tools.get("cuobjdump"), (str, type(None)), "config.profile_tools.cuobjdump")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> JobConfig:
        items = _fields(cls, data, "config")
        items["timing"] = JobTiming(**_fields(JobTiming, items["timing"], "config.timing"))
        items["dynamic"] = DynamicChecks(**_fields(DynamicChecks, items["dynamic"], "config.dynamic"))
        items["profile_tools"] = dict(_check(items["profile_tools"], Mapping, "config.profile_tools"))
        return cls(**items)


@dataclasses.dataclass(frozen=True)
class RuntimeBuild:
    """What the worker needs to build an extension reached only at run time (worker/runtime_build.py)."""
    toolchain: dict                 # compile/toolchain.Toolchain.to_dict()
    cache_dir: str | None           # the compile stage's cache, read only
    timeout_s: float
    # [real prefix, staged prefix] pairs: where the worker's sandbox uid reads the toolchain's files that it cannot
    # read where they are (sandbox/runtime.py); empty where it reads them as they are
    path_map: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        _checked(self, "runtime_build")
        _check(self.toolchain, dict, "runtime_build.toolchain")
        if not all(isinstance(e, (list, tuple)) and len(e) == 2 and all(isinstance(x, str) for x in e)
                   for e in _check(self.path_map, list, "runtime_build.path_map")):
            raise PayloadError("runtime_build.path_map: expected a list of [real prefix, staged prefix]")


def kernels_known(modules: list) -> bool:
    """Whether the compile stage read the kernels of every built extension of the job (BuiltModule.kernels is a
    list, empty for an extension without device code): then `kernel_names` is every kernel the program has, and a
    CUDA program that runs none of them (or has none) ran no kernel of its own. Unknown without any extension."""
    return bool(modules) and all(isinstance(m, dict) and isinstance(m.get("kernels"), list) for m in modules)


@dataclasses.dataclass(frozen=True)
class JobPayload:
    """What the trainer's process hands the judge (through the pool) for one job."""
    kind: str                       # KINDS
    task_source: str                # the reference program
    code: str | None                # the candidate's program (None for kind "reference")
    modules: list                   # the compile stage's BuiltModule dicts
    kernel_names: list              # the names of the kernels in the program's built extensions (their symbols)
    runtime_build: RuntimeBuild | None
    ref_timing_cache: dict          # reference-timing cache entries of the task: {key: timing}
    config: JobConfig

    def __post_init__(self):
        _checked(self, "payload")
        if self.kind not in KINDS:
            raise PayloadError(f"payload.kind: {self.kind!r} is not one of {KINDS}")
        if self.kind != "reference":
            _check(self.code, str, "payload.code")
        if not all(isinstance(m, dict) for m in _check(self.modules, list, "payload.modules")):
            raise PayloadError("payload.modules: expected a list of objects")
        if not all(isinstance(n, str) for n in _check(self.kernel_names, list, "payload.kernel_names")):
            raise PayloadError("payload.kernel_names: expected a list of strings")
        _check(self.runtime_build, (RuntimeBuild, type(None)), "payload.runtime_build")
        if not all(isinstance(k, str) and isinstance(v, dict)
                   for k, v in _check(self.ref_timing_cache, dict, "payload.ref_timing_cache").items()):
            raise PayloadError("payload.ref_timing_cache: expected {key: timing}")
        _check(self.config, JobConfig, "payload.config")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> JobPayload:
        items = _fields(cls, data, "payload")
        if items["runtime_build"] is not None:
            items["runtime_build"] = RuntimeBuild(**_fields(RuntimeBuild, items["runtime_build"],
                                                            "payload.runtime_build"))
        items["config"] = JobConfig.from_dict(items["config"])
        for name, kind in (("modules", list), ("kernel_names", list), ("ref_timing_cache", Mapping)):
            items[name] = (list if kind is list else dict)(_check(items[name], kind, f"payload.{name}"))
        return cls(**items)
