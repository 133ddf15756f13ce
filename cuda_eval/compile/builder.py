"""Our own build of a recorded extension: what load_inline would produce, without ninja, faster.

The sources are generated exactly as load_inline generates them (main.cpp = `#include <torch/extension.h>` + the
cpp_sources + the PYBIND11_MODULE for `functions`; cuda.cu = `#include <torch/types.h>`, `<cuda.h>`,
`<cuda_runtime.h>` + the cuda_sources), with `#line` markers so that diagnostics name the candidate's strings
("cuda_sources[0]:12"). Flags come from the installed torch (toolchain.py). Where the time goes and what we do
about it (measurements: docs/LOG.md):
- cuda.cu is parsed three times (cudafe++ for the host side, cicc for the device side, gcc for the host object);
  nearly all of it is torch headers. (1) Light headers: when the cuda sources need nothing beyond tensors, dispatch
  macros and a few ATen ops, `<torch/types.h>`/`<torch/extension.h>` are replaced by a generated header with just
  those (`light_header_text`). It must never change a verdict: if the light build fails to compile or leaves
  symbols the full headers would have defined, the file is rebuilt exactly as written, and only that build's
  result counts (`header_mode` records which path was used). (2) Parallel phases: nvcc's host chain
  (preprocess, cudafe++) and device chain (preprocess, cicc, ptxas, fatbinary) are independent once the module id
  is fixed, so we run the commands of `nvcc -dryrun` ourselves, both chains at once, then the final host compile;
  anything unexpected in the dry run falls back to plain nvcc.
- main.cpp: a unit that includes torch/extension.h costs ~8 CPU-s at -O0 even with the precompiled header (the
  instantiations the headers require are redone in every unit). (3) Glue binding: when the cpp sources are plain
  declarations, main.cpp becomes a glue unit without torch/extension.h plus a binding object: over the types the
  shared binding knows, one object per toolchain and flag set for every signature (the glue describes each function
  and calls it through a thunk; the binding builds pybind11's function record from the casters at run time);
  otherwise one per signature set (load_inline's PYBIND11_MODULE for those signatures). Both are cached and shared
  across extensions (`glue_plan`; verified by the compiler, with the exact main.cpp as fallback, as for the light
  header: `binding_mode`). Otherwise a precompiled header of
  torch/extension.h (built once per toolchain and flag set, stored in the cache) and an object cache (main.cpp
  rarely changes between refinements of one kernel).
Every compiler process runs in the sandbox (its own uid, rlimits, a deadline), with only allow-listed candidate
flags (flag_policy). Directories of one build: `src/` is ours and read-only for the sandbox uid (the generated
sources, module ids, objects restored from the object cache), `out/` belongs to the sandbox uid (the compilers'
cwd and outputs), `product/` is ours again: what the build produced is copied there out of `out/` through a
checked descriptor (cache.copy_untrusted) before anything uses it. Nothing of ours ever writes into `out/` or
follows a link there.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

from cuda_eval.compile.build_dirs import MAX_PRODUCT_BYTES, BuildDirs, write_private, write_private_tree
from cuda_eval.compile.cache import BuildCache, UnsafeFile, copy_untrusted
from cuda_eval.compile.glue import ANY_PRELUDE_TEXT, BINDING_OBJECT, GLUE_PRELUDE, GluePlan, any_binding_text, glue_plan
from cuda_eval.compile.nvcc import Phase, Runner, clean_log, compile_cuda, output_text
from cuda_eval.compile.pch import PchStore, pch_flags
from cuda_eval.compile.sources import (LEAN_DIR, LIGHT_HEADER, PCH_HEADER, cuda_cu, lean_op_headers,
                                      light_header_text, main_cpp)
from cuda_eval.compile.toolchain import Toolchain
from cuda_eval.protocol.extension_spec import ExtensionSpec
from cuda_eval.sandbox import runner as sb
from cuda_eval.static import flag_policy

_SHARED_BINDING_LOCK = threading.Lock()
# Compiles yield the CPU to the host threads of the GPU jobs running beside them (docs/EVALUATOR.md, "Timing").
COMPILE_NICE = 10


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    light_headers: bool = True       # try the light-header build of cuda sources first (safe: see module doc)
    lean_op_headers: bool = True     # with the light header, ATen/ops headers less Context.h/DeviceGuard.h (ditto)
    parallel_phases: bool = True     # drive nvcc's host and device chains ourselves, in parallel
    use_pch: bool = True             # precompiled torch/extension.h for main.cpp
    glue_binding: bool = True        # main.cpp as a header-free glue unit + a binding object shared by signature
    object_cache: bool = True        # reuse main.o / cuda.o of identical sources and flags
    host_opt_level: str | None = None  # e.g. "-O0": appended to the .cu host compile (None: the candidate's flags)
    max_log_chars: int = 4000
    max_errors: int = 8
    limits: sb.SandboxLimits = sb.SandboxLimits(address_space_bytes=8 << 30, cpu_seconds=900,
                                                file_size_bytes=2 << 30, processes=256, wall_timeout_s=600,
                                                output_cap_bytes=1 << 20, nice=COMPILE_NICE)


@dataclasses.dataclass
class BuildResult:
    ok: bool
    so_path: str | None = None
    error_kind: str | None = None     # None | "compile_error" | "compile_timeout" | "sandbox_killed" | "flag_rejected"
    log: str = ""                     # cleaned, mapped to the candidate's sources, trimmed (for the model)
    raw_log: str = ""                 # compiler output as is (capped), for debugging
    header_mode: str = ""             # "light" | "exact" | "light_failed_exact" | "none" (no cuda sources)
    light_failure: str = ""           # why the light build was not used (when it was tried)
    binding_mode: str = ""            # "glue" | "exact" | "glue_failed_exact" (how main.cpp was built)
    binding_failure: str = ""         # why the glue build was not used (when it was tried or ruled out)
    phases: list[Phase] = dataclasses.field(default_factory=list)
    build_s: float = 0.0


class BuildError(RuntimeError):
    """A build failed (the message is the cleaned compiler log). Raised by RuntimeBuilder."""

    def __init__(self, result: BuildResult):
        super().__init__(f"Error building extension ({result.error_kind}):\n{result.log}")
        self.result = result


# --- the build --------------------------------------------------------------------------------------------------
class Builder:
    """Builds ExtensionSpecs into .so files in the cache (compile stage) or in a work dir (run-time builds)."""

    def __init__(self, toolchain: Toolchain, cache: BuildCache | None, *, config: BuildConfig = BuildConfig(),
                 pch_store: PchStore | None = None, work_root: str | None = None):
        self.toolchain, self.cache, self.config = toolchain, cache, config
        self.pch_store = pch_store
        self.work_root = work_root or tempfile.gettempdir()

    def cache_key(self, spec: ExtensionSpec) -> str:
        ident = self.toolchain.ident()
        if self.config.host_opt_level:  # changes the bytes of the product (not its behaviour)
            ident["host_opt_level"] = self.config.host_opt_level
        return spec.content_hash(ident)

    def _object_key(self, kind: str, text: str, flags: Sequence[str], extra: str = "") -> str:
        blob = json.dumps({"kind": kind, "text": text, "flags": list(flags), "extra": extra,
                           "toolchain": self.toolchain.ident()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def build(self, spec: ExtensionSpec, build_dir: str, timeout_s: float) -> BuildResult:
        """Build `spec` in `build_dir` (created; must be ours and hold nothing else). The .so is left in
        <build_dir>/product (BuildResult.so_path), a copy of ours."""
        t_start = time.monotonic()
        deadline = t_start + timeout_s
        result = BuildResult(ok=False)
        rejected = flag_policy.rejection(spec, self.toolchain.arch)
        if rejected:  # before anything runs: these flags would reach the compilers
            result.error_kind, result.log = "flag_rejected", rejected
            return result
        try:
            dirs = BuildDirs.create(build_dir)
            with sb.SandboxSession(dirs.out) as session:
                dirs.confine(session)
                runner = Runner(session, self.config.limits, deadline, dirs.out)
                if spec.kind == "files":
                    self._build_files(spec, dirs, runner, result)
                else:
                    self._build_inline(spec, dirs, runner, result)
        except OSError as e:
            result.ok, result.so_path, result.error_kind = False, None, "sandbox_killed"
            result.log = f"the build could not run: {e}"
        result.build_s = round(time.monotonic() - t_start, 3)
        if not result.ok and result.error_kind is None:
            result.error_kind = "compile_error"
        return result

    def _spec_flags(self, spec: ExtensionSpec) -> dict:
        """The toolchain's compile/link flags for one extension, with the flags its load_inline/load call passed."""
        return self.toolchain.flags(spec.name, with_cuda=spec.uses_cuda, extra_cflags=spec.extra_cflags,
                                    extra_cuda_cflags=spec.extra_cuda_cflags, extra_ldflags=spec.extra_ldflags,
                                    extra_include_paths=spec.extra_include_paths)

    # one load_inline extension
    def _build_inline(self, spec: ExtensionSpec, dirs: BuildDirs, runner: Runner, result: BuildResult) -> None:
        tc, cfg = self.toolchain, self.config
        flags = self._spec_flags(spec)
        cflags = flags["cflags"]  # host_opt_level concerns the .cu host pass only (main.cpp is pybind glue)
        objects: dict[str, str] = {}
        logs: dict[str, str] = {}
        phases = result.phases

        def compile_main() -> bool:
            exact_text = main_cpp(spec, pch_include=False)
            key = self._object_key("main.o", exact_text, cflags)
            cached = self._from_object_cache(key, "main.o", dirs, phases)
            if cached:
                objects["main"], result.binding_mode = cached, "exact"
                return True
            pch_dir = None
            if cfg.use_pch and self.pch_store is not None and not spec.no_implicit_headers:
                pch_dir = self.pch_store.ensure(pch_flags(cflags), wait=False)
            plan, result.binding_failure = glue_plan(spec, tc) if cfg.glue_binding else (None, "disabled")
            result.binding_mode = "exact"
            if plan is not None:
                why_not = self._compile_glue(plan, cflags, pch_dir, dirs, runner, objects, phases)
                if why_not is None:
                    result.binding_mode = "glue"
                    return True
                result.binding_mode, result.binding_failure = "glue_failed_exact", why_not
                if runner.timed_out:
                    return False
            obj = os.path.join(dirs.out, "main.o")
            if pch_dir:
                src = write_private(dirs.src, "main.cpp", main_cpp(spec, pch_include=True))
                argv = [tc.cxx, f"-I{pch_dir}", "-Winvalid-pch", *pch_flags(cflags), "-c", src, "-o", obj]
            else:
                src = write_private(dirs.src, "main.cpp", exact_text)
                argv = [tc.cxx, *cflags, "-c", src, "-o", obj]
            res = runner.run(argv, "g++ main.cpp" + (" (pch)" if pch_dir else ""), phases)
            logs["main"] = output_text(res)
            if pch_dir and "not used because" in logs["main"]:
                # gcc fell back to parsing the headers (correct, only slow): say so in the breakdown.
                phases[-1].name = "g++ main.cpp (pch rejected)"
            if res["exit_code"] != 0 or res["timed_out"]:
                return False
            objects["main"] = obj
            self._to_object_cache(key, "main.o", dirs)
            return True

        def compile_cu(light_text: str | None) -> tuple[bool, str]:
            light = light_text is not None
            text = cuda_cu(spec, light=light)
            cuda_cflags = flags["cuda_cflags"]
            lean = {}
            if light:
                write_private(dirs.src, LIGHT_HEADER, light_text)
                if cfg.lean_op_headers:
                    lean = lean_op_headers(spec.cuda_sources, light_text, tc)
                if lean:  # found before torch's own (-I precedes -isystem)
                    write_private_tree(os.path.join(dirs.src, LEAN_DIR), lean)
                    cuda_cflags = [f"-I{os.path.join(dirs.src, LEAN_DIR)}", *cuda_cflags]
            key = self._object_key("cuda.o", text + (light_text or "") + json.dumps(lean, sort_keys=True),
                                   flags["cuda_cflags"], cfg.host_opt_level or "")
            cached = self._from_object_cache(key, "cuda.cuda.o", dirs, phases)
            if cached:
                objects["cuda"] = cached
                return True, ""
            obj = os.path.join(dirs.out, "cuda.cuda.o")
            ok, log = compile_cuda(runner, write_private(dirs.src, "cuda.cu", text), obj, cuda_cflags,
                                   toolchain=tc, parallel=cfg.parallel_phases, host_opt_level=cfg.host_opt_level,
                                   phases=phases)
            if ok:
                objects["cuda"] = obj
                self._to_object_cache(key, "cuda.cuda.o", dirs)
            return ok, log

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            main_future = pool.submit(compile_main)
            cu_ok = True
            if spec.cuda_sources:
                light_text, why_not = (None, "disabled")
                if cfg.light_headers and not spec.no_implicit_headers:
                    light_text, why_not = light_header_text(spec.cuda_sources, tc)
                result.header_mode = "light" if light_text else "exact"
                result.light_failure = "" if light_text else why_not
                cu_ok, logs["cuda"] = compile_cu(light_text)
                if light_text is not None:
                    light_problem = None if cu_ok else "the light build failed to compile"
                    if cu_ok:
                        main_ok = main_future.result()
                        light_problem = self._undefined_after_light(runner, objects, phases) if main_ok else None
                    if light_problem and not runner.timed_out:
                        result.header_mode, result.light_failure = "light_failed_exact", light_problem
                        objects.pop("cuda", None)
                        cu_ok, logs["cuda"] = compile_cu(None)
            else:
                result.header_mode = "none"
            main_ok = main_future.result()
        raw = (logs.get("cuda", "") if not cu_ok else "") + (logs.get("main", "") if not main_ok else "")
        if cu_ok and main_ok:
            obj_list = [objects["main"]] + ([objects["binding"]] if "binding" in objects else []) + \
                ([objects["cuda"]] if spec.cuda_sources else [])
            so_name = f"{spec.name}.so"
            res = runner.run([tc.cxx, *obj_list, *flags["ldflags"], "-o", os.path.join(dirs.out, so_name)], "link",
                             phases)
            if res["exit_code"] == 0 and not res["timed_out"]:
                self._take_product(so_name, dirs, result)
            else:
                raw = output_text(res)
        self._finish(result, raw or "\n".join(logs.values()), dirs, runner)

    def _compile_glue(self, plan: GluePlan, cflags: Sequence[str], pch_dir: str | None, dirs: BuildDirs,
                      runner: Runner, objects: dict[str, str], phases: list[Phase]) -> str | None:
        """main.cpp as glue unit + binding object (cached by its text and flags) into `objects`; None if both
        built, else why not (then nothing of the glue build is used)."""
        tc = self.toolchain
        flags = pch_flags(cflags)  # neither unit names the extension: TORCH_EXTENSION_NAME is not their business
        glue_pch = None
        if plan.shared and self.config.use_pch and self.pch_store is not None:
            glue_pch = self.pch_store.ensure(flags, wait=False, header=(GLUE_PRELUDE, plan.prelude_text))
        if glue_pch:  # the prelude and its .gch are found there (the glue's own folder has no prelude)
            argv = [tc.cxx, f"-I{glue_pch}", "-Winvalid-pch", *flags]
        else:
            write_private(dirs.src, GLUE_PRELUDE, plan.prelude_text)
            argv = [tc.cxx, *flags]
        glue_obj = os.path.join(dirs.out, "main.o")
        res = runner.run([*argv, "-c", write_private(dirs.src, "main.cpp", plan.glue_text), "-o", glue_obj],
                         "g++ main.cpp (glue" + (", pch)" if glue_pch else ")"), phases)
        if res["exit_code"] != 0 or res["timed_out"]:
            return "the glue unit did not compile: " + (clean_log(output_text(res), build_dir=[dirs.src, dirs.out],
                                                                  toolchain=tc, max_errors=1, max_chars=300)
                                                        or "no output")
        key = self._object_key(BINDING_OBJECT, plan.binding_text, flags)
        if plan.shared:
            cached = self._shared_binding(plan, key, flags, pch_dir, dirs, runner.deadline, phases)
            if cached is None:
                return "the shared binding unit did not compile"
        else:
            cached = self._from_object_cache(key, BINDING_OBJECT, dirs, phases)
        if not cached:
            obj = os.path.join(dirs.out, BINDING_OBJECT)
            if not self._run_binding(plan, flags, pch_dir, dirs, runner, phases):
                return "the binding unit did not compile"
            self._to_object_cache(key, BINDING_OBJECT, dirs)
            cached = obj
        objects["main"], objects["binding"] = glue_obj, cached
        return None

    def _run_binding(self, plan: GluePlan, flags: Sequence[str], pch_dir: str | None, dirs: BuildDirs,
                     runner: Runner, phases: list[Phase]) -> bool:
        """Compile the binding unit of `plan` into <dirs.out>/BINDING_OBJECT."""
        tc = self.toolchain
        if pch_dir:
            text = plan.binding_text.replace("#include <torch/extension.h>", f'#include "{PCH_HEADER}"', 1)
            argv = [tc.cxx, f"-I{pch_dir}", "-Winvalid-pch", *flags]
        else:
            text, argv = plan.binding_text, [tc.cxx, *flags]
        src = write_private(dirs.src, "kj_binding.cpp", text)
        res = runner.run([*argv, "-c", src, "-o", os.path.join(dirs.out, BINDING_OBJECT)],
                         "binding" + (" (shared" if plan.shared else "") + (", pch" if pch_dir else "") +
                         (")" if plan.shared else ""), phases)
        return res["exit_code"] == 0 and not res["timed_out"]

    def _shared_binding(self, plan: GluePlan, key: str, flags: Sequence[str], pch_dir: str | None, dirs: BuildDirs,
                        deadline: float, phases: list[Phase]) -> str | None:
        """The one binding object for every signature over the known types (per toolchain and flag set), copied
        into this build's src/: from the cache, or built now in a build of its own (`_build_shared_binding`)."""
        with _SHARED_BINDING_LOCK:  # one build of it per process at a time; the others wait for the cache
            cached = self._from_object_cache(key, BINDING_OBJECT, dirs, phases)
            if cached:
                return cached
            return self._build_shared_binding(plan.binding_text, key, flags, pch_dir, deadline, phases,
                                              os.path.join(dirs.src, BINDING_OBJECT))

    def _build_shared_binding(self, text: str, key: str, flags: Sequence[str], pch_dir: str | None,
                              deadline: float, phases: list[Phase], dst: str | None) -> str | None:
        """Build the shared binding object in a sandbox session and directories of its own, where nothing of any
        candidate ever ran (every later extension links it), publish it in the object cache and copy it to `dst`."""
        os.makedirs(self.work_root, exist_ok=True)
        work = tempfile.mkdtemp(prefix="binding-", dir=self.work_root)
        try:
            own = BuildDirs.create(work)
            with sb.SandboxSession(own.out) as session:
                own.confine(session)
                runner = Runner(session, self.config.limits, deadline, own.out)
                plan = GluePlan("", (), "", text, "", shared=True)
                if not self._run_binding(plan, flags, pch_dir, own, runner, phases):
                    return None
                copy = own.take(BINDING_OBJECT, self.config.limits.file_size_bytes)
            if dst is not None:
                shutil.copyfile(copy, dst)
            if self.config.object_cache and self.cache:
                self.cache.publish(key, {BINDING_OBJECT: copy}, {"kind": "object"}, move=True)
            return dst or copy
        except (OSError, UnsafeFile, ValueError):
            return None
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def warm_glue(self, cflags: Sequence[str]) -> bool:
        """Build now what every glue build with these main.cpp flags shares: the glue prelude's precompiled header
        and the shared binding object (start-up, like the PCH of torch/extension.h). True if the binding is ready."""
        if not (self.config.glue_binding and self.config.object_cache and self.cache):
            return False
        flags = pch_flags(cflags)
        pch_dir = None
        if self.config.use_pch and self.pch_store is not None:
            self.pch_store.ensure(flags, wait=True, header=(GLUE_PRELUDE, ANY_PRELUDE_TEXT))
            pch_dir = self.pch_store.lookup(flags)
        text = any_binding_text()
        key = self._object_key(BINDING_OBJECT, text, flags)
        with _SHARED_BINDING_LOCK:
            if self.cache.lookup(key, required=(BINDING_OBJECT,)) is not None:
                return True
            return self._build_shared_binding(text, key, flags, pch_dir, time.monotonic() + 900, [], None) is not None

    def _undefined_after_light(self, runner: Runner, objects: Mapping[str, str], phases: list[Phase]) -> str | None:
        """Symbols the light cuda.o needs that no torch/CUDA library defines (the full headers would have
        defined them inline). None if there are none."""
        tc = self.toolchain
        libs = [f"-L{tc.torch_lib_dir}", "-lc10", "-ltorch_cpu", "-ltorch", "-lc10_cuda", "-ltorch_cuda",
                f"-L{os.path.join(tc.cuda_home, 'lib64')}", "-lcudart"]
        others = [objects["main"]] + ([objects["binding"]] if "binding" in objects else [])
        res = runner.run([tc.cxx, "-shared", objects["cuda"], *others, *tc.link_existing(libs), "-o",
                          os.path.join(runner.cwd, "light_check.so"), "-Wl,--unresolved-symbols=report-all",
                          "-Wl,--no-undefined"], "light symbol check", phases)
        if res["exit_code"] == 0:
            return None
        missing = []
        for ln in output_text(res).splitlines():
            m = re.search(r"cuda\.cuda\.o.*undefined reference to [`'](.+)'", ln)
            if not m:
                continue
            sym = m.group(1)
            # With a CPU-only torch the CUDA parts of torch are absent: their symbols cannot be checked here.
            if tc.missing_torch_libs and re.match(r"(c10|at)::cuda::|c10::cuda|at::cuda", sym):
                continue
            if sym.startswith(("cuda", "__cuda")):
                continue
            missing.append(sym)
        if missing:
            return "the light build leaves undefined symbols: " + ", ".join(sorted(set(missing))[:5])
        return None

    # load(name, sources=[files])
    def _build_files(self, spec: ExtensionSpec, dirs: BuildDirs, runner: Runner, result: BuildResult) -> None:
        tc, cfg = self.toolchain, self.config
        with_cuda = spec.uses_cuda
        flags = self._spec_flags(spec)
        result.header_mode = "exact"
        for name, content in spec.source_files:
            write_private(dirs.src, name, content)
        objects, raw = [], ""
        ok = True
        for name, _ in spec.source_files[:spec.n_sources]:
            stem, ext = os.path.splitext(name)
            src = os.path.join(dirs.src, name)
            if ext in (".cu", ".cuh") and with_cuda:
                obj = os.path.join(dirs.out, f"{stem}.cuda.o")
                ok, log = compile_cuda(runner, src, obj, flags["cuda_cflags"], toolchain=tc,
                                       parallel=cfg.parallel_phases, host_opt_level=cfg.host_opt_level,
                                       phases=result.phases)
            else:
                obj = os.path.join(dirs.out, f"{stem}.o")
                res = runner.run([tc.cxx, *flags["cflags"], "-c", src, "-o", obj], f"g++ {name}", result.phases)
                ok, log = res["exit_code"] == 0 and not res["timed_out"], output_text(res)
            objects.append(obj)
            if not ok:
                raw = log
                break
        if ok:
            out = spec.name + ("" if spec.is_standalone else ".so")
            ld = [f for f in flags["ldflags"] if not (spec.is_standalone and f == "-shared")]
            res = runner.run([tc.cxx, *objects, *ld, "-o", os.path.join(dirs.out, out)], "link", result.phases)
            if res["exit_code"] == 0 and not res["timed_out"]:
                self._take_product(out, dirs, result)
            else:
                raw = output_text(res)
        self._finish(result, raw, dirs, runner)

    # helpers
    def _take_product(self, name: str, dirs: BuildDirs, result: BuildResult) -> None:
        """The linked file, copied out of the sandbox's directory: result.so_path is the copy."""
        try:
            result.so_path = dirs.take(name, self.config.limits.file_size_bytes)
            result.ok = True
        except (OSError, UnsafeFile) as e:
            result.ok, result.so_path, result.error_kind = False, None, "sandbox_killed"
            result.log = f"the build's output could not be read safely: {e}"

    def _finish(self, result: BuildResult, raw: str, dirs: BuildDirs, runner: Runner) -> None:
        cfg = self.config
        if result.error_kind == "sandbox_killed":
            return
        if runner.timed_out and not result.ok:
            result.error_kind = "compile_timeout"
            raw = (raw + "\n" if raw else "") + "the build timed out and was killed"
        result.raw_log = raw[-50000:]
        if not result.ok:
            result.log = clean_log(raw, build_dir=[dirs.src, dirs.out, dirs.root], toolchain=self.toolchain,
                                   max_errors=cfg.max_errors, max_chars=cfg.max_log_chars)
            if result.error_kind == "compile_timeout" and "timed out" not in result.log:
                result.log = (result.log + "\n" if result.log else "") + "the build timed out and was killed"

    def _from_object_cache(self, key: str, name: str, dirs: BuildDirs, phases: list[Phase]) -> str | None:
        """A cached object copied into src/ (ours; the link step reads it there), or None."""
        if not (self.config.object_cache and self.cache):
            return None
        entry = self.cache.lookup(key, required=(name,))
        if entry is None:
            return None
        dst = os.path.join(dirs.src, name)
        if os.path.lexists(dst):
            os.unlink(dst)
        try:
            copy_untrusted(entry.path, name, dst, owner=os.geteuid(), max_bytes=MAX_PRODUCT_BYTES)
        except (OSError, UnsafeFile):
            return None  # evicted meanwhile, or not ours: build it
        phases.append(Phase(f"{name} (cached)", 0.0, True))
        return dst

    def _to_object_cache(self, key: str, name: str, dirs: BuildDirs) -> None:
        """Publish out/<name> (copied out of the sandbox's directory first) under `key`."""
        if self.config.object_cache and self.cache:
            try:
                copy = dirs.take(name, self.config.limits.file_size_bytes)
                self.cache.publish(key, {name: copy}, {"kind": "object"}, move=True)
            except (OSError, ValueError):
                pass  # the cache is an optimisation: never fail a build for it
