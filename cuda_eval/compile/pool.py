"""N CPU workers turning candidate programs into prebuilt extension modules (stage 1 of the evaluator).

    with CompilePool(CompileConfig(workers=16)) as pool:
        outcome = pool.submit(task_source, code).result()    # CompileOutcome (plain data)

Per candidate: record its extension specs in a sandboxed `python -m cuda_eval.worker.record` (candidate executed on the
CPU with load_inline intercepted, timeout record_timeout_s), then for every spec: a cache hit, or our build (builder.py)
in a fresh sandboxed build dir within compile_timeout_s, published into the content-addressed cache. Identical specs
requested concurrently are built once. A bad candidate (infinite loop, fork bomb, huge allocation, compiler hang) costs
at most its own timeouts; the other workers keep going.

Works without a GPU (the arch comes from the config, default sm_90): that is the evaluator's "compile_only" mode.
The process hosting the pool never imports torch (the toolchain is described by a helper subprocess, once).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time

from cuda_eval.compile import toolchain as tcmod
from cuda_eval.compile.builder import COMPILE_NICE, BuildConfig, Builder, BuildResult
from cuda_eval.compile.cache import BuildCache, UnsafeFile, read_untrusted
from cuda_eval.protocol import kernel_symbols
from cuda_eval.compile.pch import PchStore, pch_flags
from cuda_eval.protocol.extension_spec import CANDIDATE_FILE, RECORD_FILE, TASK_FILE, BuiltModule, ExtensionSpec
from cuda_eval.sandbox import runner as sb, safe_dirs
from cuda_eval.sandbox.identity import identity_mode
from cuda_eval.sandbox.runtime import world_readable
from cuda_eval.static import flag_policy
from cuda_eval.static.static_record import speculate_specs, static_record_specs

log = logging.getLogger(__name__)

RECORD_VERSION = 1  # bump when record.py changes what it records
ERROR_KINDS = ("syntax", "no_model_new", "no_load_inline", "record_error", "record_timeout", "flag_rejected",
               "compile_error", "compile_timeout", "sandbox_killed")
MAX_RECORD_BYTES = 16 << 20  # record.json is written by the candidate's process: read at most this much of it


def usable_cpus() -> int:
    """The cores this process may run on (its CPU affinity: a job pinned with taskset or a cgroup cpuset), not the
    machine's: os.cpu_count() would start a compiler per core of the host for a job given half of them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_cache_dir() -> str:
    return os.environ.get("CUDA_EVAL_CACHE_DIR", "/var/tmp/cuda_eval_cache")


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    """Settings of the compile stage."""
    workers: int = usable_cpus()                 # candidates compiled at once
    arch: str = "auto"                           # "auto" (the GPU's, else sm_90) | "sm_90" | "9.0" ...
    cache_dir: str = ""                          # "" = $CUDA_EVAL_CACHE_DIR or /var/tmp/cuda_eval_cache
    cache_max_bytes: int = 20 << 30              # built .so and object files (LRU beyond this)
    record_cache_max_bytes: int = 1 << 30        # recorded specs of programs seen before (root-only store)
    pch_max_bytes: int = 8 << 30                 # precompiled headers (~800 MB each)
    work_root: str = ""                          # "" = <tmp>/cuda_eval_work; scratch dirs, removed after each job
    record_timeout_s: float = 60.0               # running the candidate on the CPU to record its builds
    compile_timeout_s: float = 300.0             # all builds of one candidate
    max_log_chars: int = 4000                    # compile log shown to the model
    max_errors: int = 8                          # diagnostics kept in that log
    light_headers: bool = True                   # light torch headers for cuda sources (verified, with fallback)
    lean_op_headers: bool = True                 # the light build's ATen/ops headers without Context/DeviceGuard
    parallel_phases: bool = True                 # nvcc host/device chains in parallel
    pch: str = "background"                      # "background" | "sync" (build before first use) | "off"
    object_cache: bool = True                    # reuse main.o/cuda.o of identical sources
    glue_binding: bool = True                    # main.cpp without torch headers + a binding object shared by
                                                 # signature (verified, with fallback; build.glue_plan)
    host_opt_level: str | None = None            # None: the candidate's own flags; "-O1" etc. overrides host code
    record_address_space_bytes: int = 16 << 30   # RLIMIT_AS of the record process (a CUDA torch maps GBs of libs)
    record_processes: int = 128                  # RLIMIT_NPROC (threads count) of the record process
    compile_address_space_bytes: int = 8 << 30   # RLIMIT_AS of each compiler process (cc1plus on the full torch
                                                 # headers needs ~3 GB; an include of /dev/zero stops here)
    speculate: bool = True                       # start builds read statically from the program while it is
                                                 # still being recorded (the recorded specs stay the truth)
    static_record: bool = True                   # programs whose builds can be read from the source skip the
                                                 # recording (candidate.static_record_specs)
    keep_workdirs: bool = False                  # debugging: leave job dirs behind

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.pch not in ("background", "sync", "off"):
            raise ValueError(f"pch must be 'background', 'sync' or 'off', got {self.pch!r}")
        for name in ("record_timeout_s", "compile_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.arch != "auto":
            tcmod.normalize_arch(self.arch)  # raises on a bad arch

    def resolved_cache_dir(self) -> str:
        return os.path.abspath(os.path.expanduser(self.cache_dir or default_cache_dir()))

    def resolved_work_root(self) -> str:
        return os.path.abspath(os.path.expanduser(self.work_root or os.path.join(tempfile.gettempdir(),
                                                                                  "cuda_eval_work")))


@dataclasses.dataclass
class CompileOutcome:
    """Result of compiling one candidate (plain data; to_dict() is JSON-ready)."""
    ok: bool
    error_kind: str | None = None                # one of ERROR_KINDS, None when ok
    log: str = ""                                # trimmed, mapped to the candidate's source strings
    modules: list[BuiltModule] = dataclasses.field(default_factory=list)
    specs: list[dict] = dataclasses.field(default_factory=list)      # ExtensionSpec.to_dict() of each build
    timings: dict = dataclasses.field(default_factory=dict)          # record_s, build_s, wall_s, modules: [...]
    toolchain: dict = dataclasses.field(default_factory=dict)        # arch, torch/nvcc versions, recipe
    warnings: list[str] = dataclasses.field(default_factory=list)    # e.g. failures after recording succeeded

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["modules"] = [m.to_dict() for m in self.modules]
        return d


class CompilePool:
    """Compiles candidates on `config.workers` threads (each driving sandboxed processes). submit() returns a
    concurrent.futures.Future[CompileOutcome]; close() waits for running jobs (also via `with`)."""

    def __init__(self, config: CompileConfig = CompileConfig()):
        self.config = config
        self.cache_dir = config.resolved_cache_dir()
        self.work_root = config.resolved_work_root()
        # Both are written by us (often root) and trusted: a directory someone else created first (a candidate,
        # before the first evaluator ran on this machine) is refused, never adopted (safe_dirs).
        safe_dirs.ensure_dir(self.cache_dir, 0o755, what="the build cache dir",
                             fix=safe_dirs.fix_hint("CompileConfig.cache_dir / $CUDA_EVAL_CACHE_DIR"))
        # sandbox uids reach their own dirs, cannot list others'
        safe_dirs.ensure_dir(self.work_root, 0o711, what="the compile work root",
                             fix=safe_dirs.fix_hint("CompileConfig.work_root"))
        self.cache = BuildCache(os.path.join(self.cache_dir, "builds"), config.cache_max_bytes)
        # Recorded specs hold candidates' sources: a store only we can read (the builds cache is sandbox-readable).
        self.records = BuildCache(os.path.join(self.cache_dir, "records"), config.record_cache_max_bytes,
                                  private=True)
        if identity_mode() == "dedicated" and not world_readable(self.cache.root):
            raise ValueError(f"cache_dir {self.cache_dir} is not readable by the sandbox uids (an ancestor lacks "
                             "o+x, e.g. /root): use a directory like /var/tmp/cuda_eval_cache")
        self.toolchain = tcmod.detect(config.arch, cache_dir=self.cache_dir)
        self.pch_store = PchStore(BuildCache(os.path.join(self.cache_dir, "pch"), config.pch_max_bytes),
                                  self.toolchain, self.work_root, BuildConfig().limits)
        limits = dataclasses.replace(BuildConfig().limits, address_space_bytes=config.compile_address_space_bytes)
        self.build_config = BuildConfig(light_headers=config.light_headers, lean_op_headers=config.lean_op_headers,
                                        parallel_phases=config.parallel_phases,
                                        use_pch=config.pch != "off", object_cache=config.object_cache,
                                        glue_binding=config.glue_binding,
                                        host_opt_level=config.host_opt_level, max_log_chars=config.max_log_chars,
                                        max_errors=config.max_errors, limits=limits)
        self.builder = Builder(self.toolchain, self.cache, config=self.build_config, pch_store=self.pch_store,
                               work_root=self.work_root)
        self._executor = concurrent.futures.ThreadPoolExecutor(config.workers, thread_name_prefix="cuda_eval-compile")
        self._speculation = concurrent.futures.ThreadPoolExecutor(config.workers, thread_name_prefix="cuda_eval-spec")
        self._inflight: dict[str, concurrent.futures.Future] = {}
        self._inflight_lock = threading.Lock()
        self._closed = False
        if config.pch == "sync":
            self.warm()

    # --- public ---------------------------------------------------------------------------------------------------
    def submit(self, task_source: str, code: str) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("CompilePool is closed")
        if not isinstance(task_source, str) or not isinstance(code, str):
            raise TypeError("task_source and code must be strings")
        return self._executor.submit(self._compile_guarded, task_source, code, time.monotonic())

    def compile(self, task_source: str, code: str) -> CompileOutcome:
        return self.submit(task_source, code).result()

    def warm(self, extra_cflags: tuple[str, ...] = ()) -> bool:
        """Build the precompiled header for the default main.cpp flags (plus `extra_cflags`) now, and what glue
        builds with them share (the glue prelude's PCH, the shared binding object). True if the PCH is ready."""
        if self.config.pch == "off":
            return False
        flags = self.toolchain.flags("warm", with_cuda=True, extra_cflags=extra_cflags)["cflags"]
        ready = self.pch_store.ensure(pch_flags(flags), wait=True) is not None
        self.builder.warm_glue(flags)
        return ready

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._executor.shutdown(wait=True)
            self._speculation.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- one candidate --------------------------------------------------------------------------------------------
    def _compile_guarded(self, task_source: str, code: str, submitted: float) -> CompileOutcome:
        try:
            return self._compile(task_source, code, submitted)
        except Exception as e:  # noqa: BLE001 - an evaluator bug must come back as a result, not a lost future
            log.exception("compile job failed")
            return CompileOutcome(ok=False, error_kind="sandbox_killed",
                                  log=f"internal compile-stage error (not the candidate's fault): "
                                      f"{type(e).__name__}: {e}", toolchain=self.toolchain.summary())

    def _compile(self, task_source: str, code: str, submitted: float) -> CompileOutcome:
        cfg = self.config
        t0 = time.monotonic()
        outcome = CompileOutcome(ok=False, toolchain=self.toolchain.summary())
        outcome.timings["queue_s"] = round(t0 - submitted, 4)
        job_dir = tempfile.mkdtemp(prefix="job-", dir=self.work_root)
        os.chmod(job_dir, 0o711)  # its sandboxed sub-dirs belong to sandbox uids
        try:
            # A program whose builds can be read from its source is not run here: no sandboxed process, no torch
            # import (most of a record's CPU; docs/LOG.md, "static record"). Others are recorded, and meanwhile
            # what they appear to build is built.
            specs = static_record_specs(code) if cfg.static_record else None
            if specs is not None:
                speculated = frozenset()
                outcome.timings.update(record_s=0.0, record_cpu_s=0.0, record_static=True)
            else:
                speculated = self._speculate(code) if cfg.speculate else frozenset()
                specs = self._recorded_specs(task_source, code, job_dir, outcome)
            if specs is None:
                return outcome
            outcome.specs = [s.to_dict() for s in specs]
            for spec in specs:  # before any build: refused flags never reach a compiler
                rejected = flag_policy.rejection(spec, self.toolchain.arch)
                if rejected:
                    header = f"extension {spec.name!r}: " if len(specs) > 1 else ""
                    outcome.error_kind, outcome.log = "flag_rejected", (header + rejected)[:cfg.max_log_chars]
                    outcome.timings.update(modules=[], speculated=len(speculated), build_s=0.0)
                    return outcome
            deadline = time.monotonic() + cfg.compile_timeout_s
            module_timings = []
            for i, spec in enumerate(specs):
                module, result = self._module(spec, os.path.join(job_dir, f"build{i}"), deadline, speculated)
                if result is not None:
                    module_timings.append({"name": spec.name, "build_s": result.build_s,
                                           "header_mode": result.header_mode, "light_failure": result.light_failure,
                                           "binding_mode": result.binding_mode,
                                           "binding_failure": result.binding_failure,
                                           "phases": [p.to_dict() for p in result.phases]})
                else:
                    module_timings.append({"name": spec.name, "build_s": 0.0, "cache_hit": True})
                if module is None:
                    outcome.error_kind = result.error_kind or "compile_error"
                    header = f"extension {spec.name!r} failed to build:\n" if len(specs) > 1 else ""
                    outcome.log = (header + result.log)[:cfg.max_log_chars]
                    break
                outcome.modules.append(module)
            else:
                outcome.ok = True
            outcome.timings["modules"] = module_timings
            outcome.timings["speculated"] = len(speculated)
            outcome.timings["build_s"] = round(sum(m["build_s"] for m in module_timings), 4)
            return outcome
        finally:
            outcome.timings["wall_s"] = round(time.monotonic() - t0, 4)
            if not cfg.keep_workdirs:
                shutil.rmtree(job_dir, ignore_errors=True)

    def _recorded_specs(self, task_source: str, code: str, job_dir: str, outcome: CompileOutcome) -> list | None:
        """The specs of this exact (task, program) pair: from the record cache (a program seen before costs no
        process and no torch import), else recorded now. Identical programs submitted together record once."""
        key = hashlib.sha256(json.dumps({"task": task_source, "code": code, "record": RECORD_VERSION,
                                         "toolchain": self.toolchain.ident()}).encode()).hexdigest()
        mine: concurrent.futures.Future | None = None
        while True:
            entry = self.records.lookup(key, required=("record.json",))
            if entry is not None:
                with open(entry.file("record.json")) as f:
                    specs = [ExtensionSpec.from_dict(d) for d in json.load(f)]
                outcome.timings.update(record_s=0.0, record_cpu_s=0.0, record_cache_hit=True)
                return specs
            with self._inflight_lock:
                waiting = self._inflight.get("record:" + key)
                if waiting is None:
                    mine = concurrent.futures.Future()
                    self._inflight["record:" + key] = mine
            if waiting is None or not waiting.result():
                break  # ours to record (or the first recording of this program failed: try again ourselves)
        specs = None
        try:
            specs = self._record(task_source, code, job_dir, outcome)
            if specs is not None and not outcome.warnings:  # only complete recordings are remembered
                path = os.path.join(job_dir, "record_cache.json")
                with open(path, "w") as f:
                    json.dump([sp.to_dict() for sp in specs], f)
                try:
                    self.records.publish(key, {"record.json": path}, {"kind": "record"}, move=True)
                except (OSError, ValueError):
                    pass  # an optimisation only
            return specs
        finally:
            if mine is not None:
                mine.set_result(specs is not None)
                with self._inflight_lock:
                    self._inflight.pop("record:" + key, None)

    def _record(self, task_source: str, code: str, job_dir: str, outcome: CompileOutcome) -> list | None:
        """Run the candidate in the record sandbox. Returns its specs, or None with `outcome` filled in."""
        cfg = self.config
        rec_dir = os.path.join(job_dir, "record")
        os.makedirs(rec_dir)
        for name, text in ((TASK_FILE, task_source), (CANDIDATE_FILE, code)):
            with open(os.path.join(rec_dir, name), "w") as f:
                f.write(text)
        limits = sb.SandboxLimits(address_space_bytes=cfg.record_address_space_bytes,
                                  cpu_seconds=int(cfg.record_timeout_s) + 5, open_files=256,
                                  file_size_bytes=64 << 20, processes=cfg.record_processes,
                                  wall_timeout_s=cfg.record_timeout_s, output_cap_bytes=64 << 10,
                                  nice=COMPILE_NICE)
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "CUDA_VISIBLE_DEVICES": "", "TORCH_EXTENSIONS_DIR": os.path.join(rec_dir, "torch_extensions")}
        res = sb.run_sandboxed([sys.executable, "-m", "cuda_eval.worker.record", rec_dir], rec_dir, limits,
                               extra_env=env)
        outcome.timings["record_s"] = round(res["wall_s"], 4)
        outcome.timings["record_cpu_s"] = round(res["cpu_s"], 4)
        owner = res.get("uid") if res.get("uid") is not None else os.geteuid()
        try:
            record, specs = read_record(rec_dir, owner)
        except RecordCorrupted as e:
            outcome.error_kind, outcome.log = "record_error", f"the program corrupted its record ({e})"
            return None
        ended = sb.describe(res, limits)
        if record is not None and record.get("error_kind") in ("syntax", "no_model_new"):
            outcome.error_kind, outcome.log = record["error_kind"], str(record.get("error", ""))[:cfg.max_log_chars]
            return None
        if specs:
            if not (record or {}).get("done"):
                outcome.warnings.append(f"recording stopped early (the program {ended}); building what was "
                                        "recorded before")
            unique = list({s.key(): s for s in specs}.values())
            return unique
        if record is not None and record.get("done"):
            kind = record.get("error_kind")
            outcome.error_kind = kind if kind in ("record_error", "no_load_inline") else "no_load_inline"
            outcome.log = str(record.get("error", ""))[:cfg.max_log_chars]
            return None
        # It never finished and recorded nothing.
        if res["timed_out"]:
            outcome.error_kind = "record_timeout"
            outcome.log = f"running the program (import, ModelNew construction) {ended}: infinite loop or far " \
                          "too much work at import time?"
        else:
            outcome.error_kind = "sandbox_killed"
            tail = (res["stderr"] or b"").decode("utf-8", "replace").strip()[-1500:]
            outcome.log = f"the program {ended} while being imported" + (f":\n{tail}" if tail else "")
        phases = (record or {}).get("phases")
        imp = phases.get("import") if isinstance(phases, dict) else None
        if isinstance(imp, dict) and not imp.get("ok"):
            outcome.error_kind = "record_error"
            outcome.log = f"the program raised before building any extension:\n{str(imp.get('error'))}"[
                :cfg.max_log_chars]
        return None

    def _module(self, spec: ExtensionSpec, build_dir: str, deadline: float, speculated: frozenset = frozenset()
                ) -> tuple[BuiltModule | None, BuildResult | None]:
        """A cache hit (None result), or our build published to the cache. Concurrent identical specs share one
        build; `speculated` holds the keys this job started building itself before recording finished."""
        key = self.builder.cache_key(spec)
        entry = self.cache.lookup(key, required=(_so_name(spec),))
        if entry is not None:
            so_path = entry.file(_so_name(spec))
            return BuiltModule(spec.name, so_path, key, True, spec.key(), entry.meta.get("header_mode", ""), 0.0,
                               kernel_symbols.binary_kernels(so_path)), None
        owner, future = self._claim(key)
        if not owner:
            result, module = future.result()
            if module is not None and key not in speculated:
                module = dataclasses.replace(module, cache_hit=True, build_s=0.0)  # another candidate's build
            return module, result
        return self._build_claimed(spec, key, build_dir, deadline, future)

    def _claim(self, key: str) -> tuple[bool, concurrent.futures.Future]:
        """(True, new future) if the caller must build `key`, else (False, the future of the build in flight)."""
        with self._inflight_lock:
            future = self._inflight.get(key)
            if future is not None:
                return False, future
            future = concurrent.futures.Future()
            self._inflight[key] = future
            return True, future

    def _build_claimed(self, spec: ExtensionSpec, key: str, build_dir: str, deadline: float,
                       future: concurrent.futures.Future, *, remove_dir: bool = False
                       ) -> tuple[BuiltModule | None, BuildResult]:
        module = None
        result = BuildResult(ok=False, error_kind="sandbox_killed", log="internal build error")
        try:
            result = self.builder.build(spec, build_dir, max(1.0, deadline - time.monotonic()))
            if result.ok:
                entry = self.cache.publish(key, {_so_name(spec): result.so_path},
                                           {"name": spec.name, "header_mode": result.header_mode,
                                            "build_s": result.build_s, "toolchain": self.toolchain.summary()},
                                           move=True)
                so_path = entry.file(_so_name(spec))
                module = BuiltModule(spec.name, so_path, key, False, spec.key(), result.header_mode, result.build_s,
                                     kernel_symbols.binary_kernels(so_path))
        finally:
            future.set_result((result, module))
            with self._inflight_lock:
                self._inflight.pop(key, None)
            if remove_dir and not self.config.keep_workdirs:
                shutil.rmtree(build_dir, ignore_errors=True)
        return module, result

    def _speculate(self, code: str) -> frozenset:
        """Start building the extensions the program statically appears to build, while it is being recorded.
        Builds run in their own dirs (never the job's), so a job ending early cannot break a build others wait on."""
        started = set()
        deadline = time.monotonic() + self.config.compile_timeout_s
        for spec in speculate_specs(code):
            if flag_policy.rejection(spec, self.toolchain.arch):
                continue  # the recorded spec will get the verdict; nothing of it is built
            key = self.builder.cache_key(spec)
            if key in started or self.cache.lookup(key, required=(_so_name(spec),)) is not None:
                continue
            owner, future = self._claim(key)
            if owner:
                build_dir = tempfile.mkdtemp(prefix="spec-", dir=self.work_root)
                self._speculation.submit(self._build_claimed, spec, key, build_dir, deadline, future,
                                         remove_dir=True)
                started.add(key)
        return frozenset(started)


class RecordCorrupted(ValueError):
    """record.json is not what cuda_eval.worker.record writes (tampered with by the program, or unreadable)."""


def read_record(rec_dir: str, owner: int) -> tuple[dict | None, list[ExtensionSpec]]:
    """(record, specs) of <rec_dir>/record.json, a file the candidate's process wrote and may have replaced: read
    through a checked descriptor (a regular file with one link, owned by `owner`, at most MAX_RECORD_BYTES) and
    parsed as untrusted data. (None, []) if there is none; RecordCorrupted for anything else unexpected."""
    try:
        data = read_untrusted(rec_dir, RECORD_FILE, owner=owner, max_bytes=MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None, []
    except (OSError, UnsafeFile) as e:
        raise RecordCorrupted(str(e)) from None
    try:
        record = json.loads(data)
        if not isinstance(record, dict):
            raise TypeError("not a JSON object")
        raw_specs = record.get("specs", [])
        if not isinstance(raw_specs, list) or not all(isinstance(d, dict) for d in raw_specs):
            raise TypeError("specs is not a list of objects")
        specs = [ExtensionSpec.from_dict(d) for d in raw_specs]
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as e:
        raise RecordCorrupted(f"{type(e).__name__}: {str(e)[:200]}") from None
    return record, specs


def _so_name(spec: ExtensionSpec) -> str:
    return spec.name if spec.is_standalone else f"{spec.name}.so"
