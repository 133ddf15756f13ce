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
  declarations, main.cpp becomes a header-free glue unit plus a binding object (load_inline's PYBIND11_MODULE for
  those signatures) that is cached and shared across extensions (`glue_plan`; verified by the compiler, with the
  exact main.cpp as fallback, as for the light header: `binding_mode`). Otherwise a precompiled header of
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
import shlex
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

from cuda_eval import flag_policy
from cuda_eval import sandbox as sb
from cuda_eval.cache import BuildCache, UnsafeFile, copy_untrusted
from cuda_eval.candidate import ExtensionSpec
from cuda_eval.toolchain import Toolchain

PCH_HEADER = "kj_torch_extension.h"
# Compiles yield the CPU to the host threads of the GPU jobs running beside them (docs/EVALUATOR.md, "Timing").
COMPILE_NICE = 10
LIGHT_HEADER = "kj_light_torch.h"
# Sources that need more than the light header gives (python bindings, the C++ frontend, autograd, operator
# registration, ATen internals, from_blob & co. from ATen/Functions.h): straight to the exact build.
_NOT_LIGHT = re.compile(r"PYBIND11|pybind11|\bpy::|torch::(nn|autograd|jit|optim|data|serialize|python|Library|"
                        r"library|cuda)\b|TORCH_LIBRARY|at::native|"
                        r"#\s*include\s*[<\"]torch/(?!extension\.h|types\.h)|\bfrom_blob\b|NoGradGuard|"
                        r"InferenceMode|\bIValue\b|globalContext|manual_seed")
_TORCH_INCLUDE = re.compile(r"^([ \t]*#[ \t]*include[ \t]*)<torch/(extension|types)\.h>", re.M)
_IDENT = re.compile(r"\b[a-z_][a-z0-9_]*\b")
_INDEXING = re.compile(r"indexing|\bSlice\b|\bEllipsis\b|\.index(_put_)?\s*\(\s*\{")
# ATen headers that include every operator unless AT_PER_OPERATOR_HEADERS is set (the mode torch builds itself
# in); their definitions are the same either way, only their includes differ.
_PER_OP_WRAP = """#ifndef AT_PER_OPERATOR_HEADERS
#define AT_PER_OPERATOR_HEADERS
#define KJ_LIGHT_UNDEF_PER_OP
#endif
{includes}
#ifdef KJ_LIGHT_UNDEF_PER_OP
#undef AT_PER_OPERATOR_HEADERS
#undef KJ_LIGHT_UNDEF_PER_OP
#endif"""


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    light_headers: bool = True       # try the light-header build of cuda sources first (safe: see module doc)
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
class Phase:
    name: str
    seconds: float
    ok: bool
    cpu_s: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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


# --- sources ------------------------------------------------------------------------------------------------------
def _line(label: str) -> str:
    return f'#line 1 "{label}"'


def main_cpp(spec: ExtensionSpec, *, pch_include: bool) -> str:
    """main.cpp as load_inline writes it; with pch_include, the first include is our PCH wrapper and
    TORCH_EXTENSION_NAME is defined after it (torch headers never read it: checked per toolchain)."""
    parts: list[str] = []
    if not spec.no_implicit_headers:
        if pch_include:
            parts += [f'#include "{PCH_HEADER}"', f"#define TORCH_EXTENSION_NAME {spec.name}"]
        else:
            parts.append("#include <torch/extension.h>")
    for i, src in enumerate(spec.cpp_sources):
        parts += [_line(f"cpp_sources[{i}]"), src]
    if spec.functions is not None:
        parts.append(_line("load_inline bindings"))
        parts.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fn, doc in spec.functions:
            if spec.with_pytorch_error_handling:
                parts.append(f'm.def("{fn}", torch::wrap_pybind_function({fn}), "{doc}");')
            else:
                parts.append(f'm.def("{fn}", {fn}, "{doc}");')
        parts.append("}")
    return "\n".join(parts)


def cuda_cu(spec: ExtensionSpec, *, light: bool) -> str:
    """cuda.cu as load_inline writes it; light=True swaps the torch includes for LIGHT_HEADER (same line count)."""
    parts: list[str] = []
    if not spec.no_implicit_headers:
        parts += [f'#include "{LIGHT_HEADER}"' if light else "#include <torch/types.h>", "#include <cuda.h>",
                  "#include <cuda_runtime.h>"]
    for i, src in enumerate(spec.cuda_sources):
        if light:
            src = _TORCH_INCLUDE.sub(lambda m: f'{m.group(1)}"{LIGHT_HEADER}"', src)
        parts += [_line(f"cuda_sources[{i}]"), src]
    return "\n".join(parts)


def light_header_text(sources: Sequence[str], toolchain: Toolchain) -> tuple[str | None, str]:
    """(header text, "") if the sources can use the light header, else (None, why not)."""
    text = "\n".join(sources)
    m = _NOT_LIGHT.search(text)
    if m:
        return None, f"uses {m.group(0).strip()!r}"
    if not toolchain.torch_namespace_block:
        return None, "torch/types.h of this torch has no recognisable namespace block"
    ops = sorted(set(_IDENT.findall(text)) & set(toolchain.aten_ops))
    lines = ["// Generated by cuda_eval.build: the part of <torch/types.h> these sources use.", "#pragma once",
             "#include <ATen/core/Tensor.h>", "#include <ATen/Dispatch.h>", "#include <c10/core/TensorOptions.h>",
             "#include <ATen/core/Formatting.h>", "#include <optional>"]
    lines += [f"#include <ATen/ops/{op}.h>" for op in ops]
    wrapped = ["#include <ATen/TensorOperators.h>"]
    if _INDEXING.search(text):
        wrapped.append("#include <ATen/TensorIndexing.h>")
    lines.append(_PER_OP_WRAP.format(includes="\n".join(wrapped)))
    lines.append(toolchain.torch_namespace_block)
    return "\n".join(lines) + "\n", ""


# --- main.cpp without the torch headers: glue unit + shared binding object ------------------------------------------
# Every unit that includes <torch/extension.h> pays ~8 CPU-s (g++, -O0, with the PCH) for the instantiations the
# headers themselves require, even when it declares nothing (measured: docs/LOG.md); load_inline's main.cpp is
# usually nothing more than declarations plus PYBIND11_MODULE. So when the cpp sources are plain declarations over a
# few known types, main.cpp is built as two objects: a glue unit (the candidate's declarations verbatim after a
# tiny prelude, the function addresses, PyInit_<name>) and a binding object, the PYBIND11_MODULE of load_inline
# generated from the signatures alone, which is cached and shared by every extension with the same signatures and
# flags. The same m.def calls run on the same types (checked by the compiler: the glue static_asserts the exact
# function type); anything unexpected, or any failure, builds main.cpp exactly as load_inline writes it instead,
# and only that build counts.
GLUE_PRELUDE = "kj_glue_prelude.h"
BINDING_OBJECT = "binding.o"
_GLUE_PRELUDE_TEXT = """// Generated by cuda_eval.build: the names of <torch/extension.h> that plain declarations use.
#pragma once
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>
namespace at { class Tensor; }
namespace torch { using at::Tensor; }
"""
# Anything that could make a name mean something else than in load_inline's main.cpp (macros, using-directives,
# namespaces, templates), or that needs the real headers: the exact build.
_GLUE_BLOCKERS = re.compile(r"PYBIND11|pybind11|\bpy::|\busing\b|\bnamespace\b|\btemplate\b|\btypedef\b|"
                            r"\boperator\b|\bdecltype\b|\bauto\b|\bstatic\b|\binline\b|\bconstexpr\b|[{}\[\]\"'\\]|"
                            r"\b(TORCH|C10|AT)_")
_GLUE_DIRECTIVE_OK = re.compile(r"#[ \t]*(pragma[ \t]+once|include[ \t]*<(torch/extension\.h|torch/types\.h|vector|"
                                r"cstdint|optional|tuple|stdint\.h)>)[ \t]*")
_GLUE_TYPES = {"Tensor": "::at::Tensor", "at::Tensor": "::at::Tensor", "torch::Tensor": "::at::Tensor",
               "::at::Tensor": "::at::Tensor", "::torch::Tensor": "::at::Tensor",
               "std::vector": "::std::vector", "std::optional": "::std::optional", "std::tuple": "::std::tuple",
               "int64_t": "::std::int64_t", "std::int64_t": "::std::int64_t", "int32_t": "::std::int32_t",
               "std::int32_t": "::std::int32_t", "size_t": "::std::size_t", "std::size_t": "::std::size_t",
               **{k: k for k in ("const", "int", "long", "short", "unsigned", "signed", "char", "float", "double",
                                 "bool", "void")}}
_GLUE_TOKEN = re.compile(r"(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|&&|[<>,&*]|\S")


@dataclasses.dataclass(frozen=True)
class GluePlan:
    key: str                          # names the binding's entry point; same signatures and mode, same key
    signatures: tuple[str, ...]       # one function-pointer type per bound function, in load_inline's order
    glue_text: str                    # main.cpp (glue)
    binding_text: str                 # the binding unit, with `#include <torch/extension.h>` first


def _glue_type(text: str, *, drop_name: bool) -> str | None:
    """`text` spelled with fully qualified names, or None if it uses anything but the known types."""
    tokens = _GLUE_TOKEN.findall(text)
    if drop_name and len(tokens) > 1 and re.fullmatch(r"[A-Za-z_]\w*", tokens[-1]) and tokens[-1] not in _GLUE_TYPES:
        tokens = tokens[:-1]
    out = []
    for tok in tokens:
        if tok in ("<", ">", ",", "&", "&&", "*"):
            out.append(tok)
        elif tok in _GLUE_TYPES:
            out.append(_GLUE_TYPES[tok])
        else:
            return None
    return " ".join(out) if out else None


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _glue_declarations(cpp_text: str) -> dict[str, set[str]] | None:
    """name -> function-pointer types of its declarations, if the text is nothing but plain declarations."""
    text = re.sub(r"/\*.*?\*/", " ", cpp_text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    lines = []
    for ln in text.splitlines():
        if ln.strip().startswith("#"):
            if not _GLUE_DIRECTIVE_OK.fullmatch(ln.strip()):
                return None
            continue
        lines.append(ln)
    body = " ".join(lines)
    if _GLUE_BLOCKERS.search(body):
        return None
    decls: dict[str, set[str]] = {}
    for stmt in body.split(";"):
        stmt = stmt.strip()
        if not stmt:
            continue
        m = re.fullmatch(r"(?:extern\s+)?(?P<ret>.+?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^()]*)\)", stmt, re.S)
        if not m:
            continue  # not a function declaration: compiled as written, never bound
        ret = _glue_type(m.group("ret"), drop_name=False)
        params_text = m.group("params").strip()
        params = [] if params_text in ("", "void") else [
            _glue_type(p.split("=", 1)[0], drop_name=True) for p in _split_top(params_text)]
        if ret is None or any(p is None for p in params):
            decls.setdefault(m.group("name"), set()).add("")  # declared with a type we do not know
            continue
        decls.setdefault(m.group("name"), set()).add(f"{ret} (*)({', '.join(params)})")
    return decls


def _pybind11_major(toolchain: Toolchain) -> int:
    for inc in toolchain.torch_include:
        try:
            with open(os.path.join(inc, "pybind11", "detail", "common.h")) as f:
                m = re.search(r"#define PYBIND11_VERSION_MAJOR (\d+)", f.read())
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return 0


def glue_plan(spec: ExtensionSpec, toolchain: Toolchain) -> tuple[GluePlan | None, str]:
    """(plan, "") if main.cpp can be built as glue + shared binding, else (None, why not)."""
    if spec.kind != "inline" or not spec.functions:
        return None, "no generated bindings"
    if spec.no_implicit_headers or spec.is_standalone or not spec.is_python_module or spec.extra_include_paths:
        return None, "not the default load_inline module"
    if toolchain.headers_use_extension_name:
        return None, "torch headers read TORCH_EXTENSION_NAME"
    # pybind11 >= 3 initialises modules in two phases, the module's name coming from the import (spec); with older
    # versions the name would be compiled into the shared binding object.
    if _pybind11_major(toolchain) < 3:
        return None, "pybind11 older than 3"
    for fn, doc in spec.functions:
        if not re.fullmatch(r"[A-Za-z_]\w*", fn) or not re.fullmatch(r"[^\"\\\n\r?]*", doc):
            return None, f"function name or docstring of {fn!r} is not plain text"
    decls = _glue_declarations("\n".join(spec.cpp_sources))
    if decls is None:
        return None, "cpp sources are not plain declarations"
    signatures = []
    for fn, _ in spec.functions:
        found = decls.get(fn, set())
        if len(found) != 1 or "" in found:
            return None, f"no single declaration of {fn!r} over known types"
        signatures.append(next(iter(found)))
    mode = "wrap" if spec.with_pytorch_error_handling else "plain"
    key = hashlib.sha256(json.dumps([mode, signatures]).encode()).hexdigest()[:16]
    entry = f"kj_pyinit_{key}"
    entry_decl = (f'extern "C" __attribute__((visibility("hidden"))) _object* {entry}(const char*, const char* const*, '
                  "const char* const*, void (*const*)());")
    glue = [_line("kj glue prelude"), f'#include "{GLUE_PRELUDE}"']
    for i, src in enumerate(spec.cpp_sources):
        glue += [_line(f"cpp_sources[{i}]"), _TORCH_INCLUDE.sub(lambda m: f'{m.group(1)}"{GLUE_PRELUDE}"', src)]
    glue += [_line("load_inline bindings"), "struct _object;", entry_decl]
    for i, ((fn, _), sig) in enumerate(zip(spec.functions, signatures)):
        glue.append(f'static_assert(::std::is_same<decltype(&{fn}), {sig}>::value, "signature of {fn}");')
    names = ", ".join(f'"{fn}"' for fn, _ in spec.functions)
    docs = ", ".join(f'"{doc}"' for _, doc in spec.functions)
    fns = ", ".join(f"reinterpret_cast<void (*)()>(&{fn})" for fn, _ in spec.functions)
    glue += [f'extern "C" __attribute__((visibility("default"))) _object* PyInit_{spec.name}() {{',
             f"  static const char* const names[] = {{{names}}};", f"  static const char* const docs[] = {{{docs}}};",
             f"  static void (*const fns[])() = {{{fns}}};", f'  return {entry}("{spec.name}", names, docs, fns);', "}"]
    binding = ["#include <torch/extension.h>",
               "// Generated by cuda_eval.build: load_inline's PYBIND11_MODULE for these signatures; the names,",
               "// docstrings and functions come from the glue unit of each extension.",
               # static: the entry point of this copy stays inside its .so (no PyInit_ symbol of ours exported)
               "#undef PYBIND11_PLUGIN_IMPL", "#define PYBIND11_PLUGIN_IMPL(name) static PyObject* PyInit_##name()",
               "namespace {", "const char* const* kj_names;", "const char* const* kj_docs;",
               "void (*const* kj_fns)();", "}"]
    binding += [f"using kj_sig_{i} = {sig};" for i, sig in enumerate(signatures)]
    binding.append("PYBIND11_MODULE(kj_module, m) {")
    for i in range(len(signatures)):
        fn = f"*reinterpret_cast<kj_sig_{i}>(kj_fns[{i}])"
        fn = f"torch::wrap_pybind_function({fn})" if spec.with_pytorch_error_handling else fn
        binding.append(f"  m.def(kj_names[{i}], {fn}, kj_docs[{i}]);")
    binding += ["}", entry_decl.replace("_object*", "PyObject*"),
                f"PyObject* {entry}(const char* name, const char* const* names, const char* const* docs, "
                "void (*const* fns)()) {",
                "  kj_names = names;", "  kj_docs = docs;", "  kj_fns = fns;",
                "  PyObject* def = PyInit_kj_module();",
                "  // the module's name as load_inline's PYBIND11_MODULE(<name>, m) spells it",
                "  if (def != nullptr && PyObject_TypeCheck(def, &PyModuleDef_Type))",
                "    reinterpret_cast<PyModuleDef*>(def)->m_name = name;",
                "  return def;", "}"]
    return GluePlan(key, tuple(signatures), "\n".join(glue) + "\n", "\n".join(binding) + "\n"), ""


# --- logs ----------------------------------------------------------------------------------------------------------
_NOISE = re.compile(r"^(In file included from|                 from |compilation terminated|\d+ errors? detected in|"
                    r"Remark: The warnings can be suppressed|ninja: |\s*$|nvcc warning : .*deprecated)")
_ERROR_START = re.compile(r"(\berror\b|undefined reference|fatal error|: error:|\(\d+\): error)", re.I)
_LOCATION = re.compile(r"^(?P<file>[^:()\s]+?)(?:\((?P<eline>\d+)\)|:(?P<gline>\d+)(?::\d+)?):")


def clean_log(raw: str, *, build_dir: str | Sequence[str], toolchain: Toolchain | None, max_errors: int,
              max_chars: int) -> str:
    """The first `max_errors` diagnostics (error lines with the source/caret lines that follow), paths relative to
    the candidate's strings, torch header paths shortened, include chains and notes dropped, trimmed.
    `build_dir`: the directory (or directories) whose prefix is dropped from paths."""
    text = raw
    for d in sorted([build_dir] if isinstance(build_dir, str) else build_dir, key=len, reverse=True):
        text = text.replace(d.rstrip("/") + "/", "")
    if toolchain:
        for inc in sorted(toolchain.torch_include, key=len, reverse=True):
            text = text.replace(inc.rstrip("/") + "/", "<torch>/")
        text = text.replace(toolchain.cuda_home.rstrip("/") + "/", "<cuda>/")
    lines = [ln.rstrip() for ln in text.splitlines()]
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for ln in lines:
        if _NOISE.match(ln):
            continue
        is_error = bool(_ERROR_START.search(ln)) and "warning" not in ln.split(":", 3)[-1][:20].lower()
        is_note = re.search(r"(: note:|: warning:|\(\d+\): warning|\): remark|detected during)", ln) is not None
        if is_error and not is_note:
            current = [ln]
            blocks.append(current)
        elif is_note:
            current = None
        elif current is not None and len(current) < 6:
            current.append(ln)
    if not blocks:  # no recognisable diagnostics: the tail of the output is the best we have
        tail = "\n".join(ln for ln in lines if ln.strip())
        return tail[-max_chars:]
    out = "\n".join("\n".join(b) for b in blocks[:max_errors])
    if len(blocks) > max_errors:
        out += f"\n... ({len(blocks) - max_errors} more errors)"
    if len(out) > max_chars:
        out = out[:max_chars - 20].rstrip() + "\n... (trimmed)"
    return out


# --- running compiler processes --------------------------------------------------------------------------------------
class _Runner:
    """Runs compiler commands of one build in one sandbox session, with a shared deadline; every process can be
    killed when a sibling chain fails."""

    def __init__(self, session: sb.SandboxSession, limits: sb.SandboxLimits, deadline: float, cwd: str,
                 parent: _Runner | None = None):
        self.session, self.limits, self.deadline, self.cwd = session, limits, deadline, cwd
        self._procs: set = set()
        self._lock = threading.Lock()
        self.cancelled = False
        self._timed_out = False
        self._parent = parent

    def group(self) -> _Runner:
        """A runner for one group of processes (one nvcc compile) that can be cancelled on its own."""
        return _Runner(self.session, self.limits, self.deadline, self.cwd, parent=self)

    @property
    def timed_out(self) -> bool:
        return self._timed_out

    @timed_out.setter
    def timed_out(self, value: bool) -> None:
        self._timed_out = value
        if value and self._parent is not None:
            self._parent.timed_out = True

    def run(self, argv: Sequence[str], name: str, phases: list[Phase], extra_env: Mapping[str, str] | None = None
            ) -> dict:
        left = self.deadline - time.monotonic()
        if self.cancelled or left <= 0:
            self.timed_out = self.timed_out or left <= 0
            return {"exit_code": -1, "signal": 9, "timed_out": left <= 0, "stdout": b"", "stderr": b"",
                    "wall_s": 0.0, "cancelled": True}
        limits = dataclasses.replace(self.limits, wall_timeout_s=max(0.1, left))
        t0 = time.monotonic()
        # this thread waits for the step below, so the step may die with it (no compile left running unwatched)
        proc = self.session.spawn(list(argv), limits, cwd=self.cwd, extra_env=extra_env, die_with_parent_thread=True)
        with self._lock:
            self._procs.add(proc)
        try:
            res = proc.wait(None)
        finally:
            with self._lock:
                self._procs.discard(proc)
        if res["timed_out"]:
            self.timed_out = True
        ok = res["exit_code"] == 0 and not res["timed_out"]
        phases.append(Phase(name, round(time.monotonic() - t0, 3), ok, round(res["cpu_s"], 3)))
        return res

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            procs = list(self._procs)
        for p in procs:
            p.kill()


def _text(res: Mapping) -> str:
    return (res.get("stdout", b"") + res.get("stderr", b"")).decode("utf-8", "replace")


# --- nvcc, phase by phase ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _NvccPlan:
    assignments: list[str]
    host: list[tuple[str, str]]      # (phase name, shell command)
    device: list[tuple[str, str]]
    final: list[tuple[str, str]]
    module_id_file: str | None


def _classify(cmds: list[str]) -> _NvccPlan | None:
    """Split nvcc's dry run into host chain / device chain / final compile, or None if it is not the plain
    one-file -c compilation we know (then plain nvcc runs instead)."""
    assignments, host, device, final = [], [], [], []
    module_id_file = None
    for cmd in cmds:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd):
            assignments.append(cmd)
            continue
        try:
            argv = shlex.split(cmd.replace("$CICC_PATH", "CICC"))
        except ValueError:
            return None
        tool = os.path.basename(argv[0])
        if tool == "rm":
            continue
        if tool == "cudafe++":
            if "--gen_module_id_file" not in argv or "--module_id_file_name" not in argv:
                return None
            module_id_file = argv[argv.index("--module_id_file_name") + 1]
            # We write the module id ourselves so that cicc need not wait for cudafe++.
            host.append(("cudafe++", cmd.replace(" --gen_module_id_file ", " ")))
        elif tool == "cicc":
            device.append(("cicc", cmd))
        elif tool in ("ptxas", "fatbinary"):
            device.append((tool, cmd))
        elif "-E" in argv:
            (device if any(a.startswith("-D__CUDA_ARCH__=") for a in argv) else host).append(
                ("device preprocess" if any(a.startswith("-D__CUDA_ARCH__=") for a in argv) else "host preprocess",
                 cmd))
        elif "-c" in argv:
            final.append(("host compile", cmd))
        else:
            return None
    if len(host) != 2 or not device or len(final) != 1 or module_id_file is None:
        return None
    return _NvccPlan(assignments, host, device, final, module_id_file)


def _script(cmd: str) -> list[str]:
    return ["/bin/sh", "-c", cmd]


def _assignments_env(assignments: list[str]) -> dict[str, str]:
    """nvcc's dry-run variable lines (`NAME=value`, value shell-quoted) as environment variables."""
    env = {}
    for a in assignments:
        name, value = a.split("=", 1)
        try:
            env[name] = " ".join(shlex.split(value))
        except ValueError:
            env[name] = value.strip()
    return env


def _module_id(source_text: str, stem: str) -> str:
    """A module id in nvcc's format (_<hash>_<len>_<file>_<hash>), unique per content."""
    h = hashlib.sha256(source_text.encode()).hexdigest()
    name = f"{stem}_cu"
    return f"_{h[:8]}_{len(name)}_{name}_{h[8:16]}"


class _ChainFailed(Exception):
    pass


_SHELL_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+-]+")


def compile_cuda(runner: _Runner, cu_file: str, obj_file: str, cuda_cflags: Sequence[str], *, toolchain: Toolchain,
                 parallel: bool, host_opt_level: str | None, phases: list[Phase]) -> tuple[bool, str]:
    """Compile one .cu into an object. Returns (ok, compiler output of the failing step or all warnings).
    cu_file lies in a directory of ours (the module id is written next to it); obj_file in the runner's cwd."""
    runner = runner.group()
    nvcc = toolchain.nvcc
    base = [nvcc, *cuda_cflags, "-c", cu_file, "-o", obj_file]
    plan = None
    if parallel:
        dry = runner.run([nvcc, "-dryrun", *base[1:]], "nvcc -dryrun", phases)
        if dry["exit_code"] == 0:
            cmds = [ln[3:].strip() for ln in dry["stderr"].decode("utf-8", "replace").splitlines()
                    if ln.startswith("#$ ")]
            plan = _classify(cmds)
    src_dir = os.path.dirname(os.path.abspath(cu_file))
    stem = os.path.splitext(os.path.basename(cu_file))[0]
    # The module id goes next to the source (a directory of ours; candidate file names never start with a dot),
    # never where nvcc's dry run put it: that is the sandbox uid's directory.
    module_id_path = os.path.join(src_dir, f".{stem}.module_id")
    if plan is not None:
        old_arg, new_arg = f'"{plan.module_id_file}"', f'"{module_id_path}"'
        if not _SHELL_SAFE_PATH.fullmatch(module_id_path) or not any(old_arg in c for _, c in plan.host):
            plan = None  # not the dry run we know: plain nvcc
        else:
            plan.host = [(n, c.replace(old_arg, new_arg)) for n, c in plan.host]
            plan.device = [(n, c.replace(old_arg, new_arg)) for n, c in plan.device]
    if plan is None:
        argv = base if not host_opt_level else base + ["-Xcompiler", host_opt_level]
        res = runner.run(argv, "nvcc", phases)
        return res["exit_code"] == 0 and not res["timed_out"], _text(res)

    with open(cu_file) as f:
        cu_text = f.read()
    write_private(src_dir, os.path.basename(module_id_path), _module_id(cu_text + " ".join(cuda_cflags), stem))

    outputs: dict[str, str] = {}
    env = _assignments_env(plan.assignments)

    def chain(steps: list[tuple[str, str]], label: str) -> None:
        for name, cmd in steps:
            res = runner.run(_script(cmd), name, phases, extra_env=env)
            outputs[label] = outputs.get(label, "") + _text(res)
            if res["exit_code"] != 0 or res["timed_out"]:
                raise _ChainFailed(label)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        device_future = pool.submit(chain, plan.device, "device")
        host_error = None
        try:
            chain(plan.host, "host")
        except _ChainFailed:
            host_error = True
            runner.cancel()  # nvcc stops at the host front end's errors: so do we
        device_error = None
        try:
            device_future.result()
        except _ChainFailed:
            device_error = True
    # nvcc's order: host preprocess, cudafe++, then the device chain. Report what nvcc would have reported.
    if host_error:
        return False, outputs.get("host", "")
    if device_error:
        return False, outputs.get("host", "") + outputs.get("device", "")
    final_cmd = plan.final[0][1]
    if host_opt_level:
        final_cmd += f" {shlex.quote(host_opt_level)}"
    res = runner.run(_script(final_cmd), "host compile", phases, extra_env=env)
    log = outputs.get("host", "") + outputs.get("device", "") + _text(res)
    return res["exit_code"] == 0 and not res["timed_out"], log


# --- directories of one build ----------------------------------------------------------------------------------------
def write_private(directory: str, name: str, text: str) -> str:
    """Write `text` to directory/name, a directory of ours that no one else can write to; never through a link.
    Returns the path."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"bad file name {name!r}")
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o644)
        f.write(text)
    return path


def _make_private_dir(path: str) -> str:
    os.mkdir(path, 0o755)
    os.chmod(path, 0o755)  # readable by the sandbox uid, writable by us alone (whatever the umask)
    return path


@dataclasses.dataclass
class _BuildDirs:
    """The directories of one build (see the module doc): src (ours, read-only for the sandbox), out (the sandbox
    uid's: the compilers' cwd), product (ours: outputs copied out of `out`). `owner`: the uid whose files `out`
    may hold, set once the sandbox session exists."""
    root: str
    src: str
    out: str
    product: str
    owner: int = -1

    @classmethod
    def create(cls, root: str) -> _BuildDirs:
        """Fresh sub-dirs of `root` (a new directory of ours, or one we create)."""
        os.makedirs(root, exist_ok=True)
        st = os.lstat(root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"build dir {root} is not a directory of ours")
        os.chmod(root, 0o755)
        return cls(root, _make_private_dir(os.path.join(root, "src")), os.path.join(root, "out"),
                   _make_private_dir(os.path.join(root, "product")))

    def confine(self, session: sb.SandboxSession) -> None:
        """Set `owner`, and make `src` readable by this build's sandbox uid alone (its group): other candidates'
        processes see the compilers' command lines in /proc, which name files in it."""
        self.owner = session.uid if session.uid is not None else os.geteuid()
        if session.uid is not None:
            os.chown(self.src, os.geteuid(), session.uid)
            os.chmod(self.src, 0o750)

    def take(self, name: str, max_bytes: int | None) -> str:
        """Copy out/<name>, written by the sandbox uid, to product/<name> (checked: a regular file with one link,
        owned by that uid, at most max_bytes); returns the copy. Raises UnsafeFile or OSError."""
        dst = os.path.join(self.product, name)
        if os.path.lexists(dst):
            os.unlink(dst)
        return copy_untrusted(self.out, name, dst, owner=self.owner, max_bytes=max_bytes or _MAX_PRODUCT_BYTES)


_MAX_PRODUCT_BYTES = 4 << 30


# --- the precompiled header -----------------------------------------------------------------------------------------
class PchStore:
    """Precompiled torch/extension.h per (toolchain, flags), in its own cache (they are ~800 MB each). Built in the
    background the first time a flag set is seen (that build compiles without it), or synchronously by warm()."""

    def __init__(self, cache: BuildCache, toolchain: Toolchain, work_root: str, limits: sb.SandboxLimits):
        self.cache, self.toolchain, self.work_root, self.limits = cache, toolchain, work_root, limits
        self._building: set[str] = set()
        self._lock = threading.Lock()
        self.failures: dict[str, str] = {}

    def key(self, pch_flags: Sequence[str]) -> str:
        blob = json.dumps({"flags": list(pch_flags), "toolchain": self.toolchain.ident(), "pch": 1}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def lookup(self, pch_flags: Sequence[str]) -> str | None:
        """Directory holding PCH_HEADER and its .gch, if built."""
        entry = self.cache.lookup(self.key(pch_flags), required=(PCH_HEADER + ".gch",))
        return entry.path if entry else None

    def ensure(self, pch_flags: Sequence[str], *, wait: bool) -> str | None:
        path = self.lookup(pch_flags)
        if path or self.toolchain.headers_use_extension_name:
            return path
        key = self.key(pch_flags)
        with self._lock:
            if key in self.failures:
                return None
            if key in self._building and not wait:
                return None
            start = key not in self._building
            self._building.add(key)
        if not wait:
            if start:
                threading.Thread(target=self._build, args=(list(pch_flags), key), daemon=True,
                                 name="cuda_eval-pch").start()
            return None
        if start:
            self._build(list(pch_flags), key)
        else:
            while True:
                with self._lock:
                    if key not in self._building:
                        break
                time.sleep(0.2)
        return self.lookup(pch_flags)

    def _build(self, pch_flags: list[str], key: str) -> None:
        try:
            os.makedirs(self.work_root, exist_ok=True)
            work = tempfile.mkdtemp(prefix="pch-", dir=self.work_root)
            try:
                dirs = _BuildDirs.create(work)
                header = write_private(dirs.src, PCH_HEADER, "#include <torch/extension.h>\n")
                with sb.SandboxSession(dirs.out) as session:
                    dirs.confine(session)
                    limits = dataclasses.replace(self.limits, wall_timeout_s=900, file_size_bytes=4 << 30)
                    res = session.run([self.toolchain.cxx, *pch_flags, "-x", "c++-header", header, "-o",
                                       PCH_HEADER + ".gch"], limits)
                    gch = None
                    if res["exit_code"] == 0:
                        try:
                            gch = dirs.take(PCH_HEADER + ".gch", limits.file_size_bytes)
                        except (OSError, UnsafeFile) as e:
                            res = {**res, "exit_code": -1, "stdout": b"", "stderr": str(e).encode()}
                if gch is None:
                    with self._lock:
                        self.failures[key] = _text(res)[-2000:]
                    return
                self.cache.publish(key, {PCH_HEADER: header, PCH_HEADER + ".gch": gch},
                                   {"flags": pch_flags, "build_s": res["wall_s"]}, move=True)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        finally:
            with self._lock:
                self._building.discard(key)


def pch_flags(cflags: Sequence[str]) -> list[str]:
    """The main.cpp flags a PCH is built with: all but the extension name (defined in main.cpp after the PCH)."""
    return [f for f in cflags if not f.startswith("-DTORCH_EXTENSION_NAME=")]


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
            dirs = _BuildDirs.create(build_dir)
            with sb.SandboxSession(dirs.out) as session:
                dirs.confine(session)
                runner = _Runner(session, self.config.limits, deadline, dirs.out)
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
    def _build_inline(self, spec: ExtensionSpec, dirs: _BuildDirs, runner: _Runner, result: BuildResult) -> None:
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
            logs["main"] = _text(res)
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
            if light:
                write_private(dirs.src, LIGHT_HEADER, light_text)
            key = self._object_key("cuda.o", text + (light_text or ""), flags["cuda_cflags"],
                                   cfg.host_opt_level or "")
            cached = self._from_object_cache(key, "cuda.cuda.o", dirs, phases)
            if cached:
                objects["cuda"] = cached
                return True, ""
            obj = os.path.join(dirs.out, "cuda.cuda.o")
            ok, log = compile_cuda(runner, write_private(dirs.src, "cuda.cu", text), obj, flags["cuda_cflags"],
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
                raw = _text(res)
        self._finish(result, raw or "\n".join(logs.values()), dirs, runner)

    def _compile_glue(self, plan: GluePlan, cflags: Sequence[str], pch_dir: str | None, dirs: _BuildDirs,
                      runner: _Runner, objects: dict[str, str], phases: list[Phase]) -> str | None:
        """main.cpp as glue unit + binding object (cached by its text and flags) into `objects`; None if both
        built, else why not (then nothing of the glue build is used)."""
        tc = self.toolchain
        write_private(dirs.src, GLUE_PRELUDE, _GLUE_PRELUDE_TEXT)
        glue_obj = os.path.join(dirs.out, "main.o")
        res = runner.run([tc.cxx, *cflags, "-c", write_private(dirs.src, "main.cpp", plan.glue_text), "-o", glue_obj],
                         "g++ main.cpp (glue)", phases)
        if res["exit_code"] != 0 or res["timed_out"]:
            return "the glue unit did not compile: " + (clean_log(_text(res), build_dir=[dirs.src, dirs.out],
                                                                  toolchain=tc, max_errors=1, max_chars=300)
                                                        or "no output")
        flags = pch_flags(cflags)  # the binding names no extension: TORCH_EXTENSION_NAME is not its business
        key = self._object_key(BINDING_OBJECT, plan.binding_text, flags)
        cached = self._from_object_cache(key, BINDING_OBJECT, dirs, phases)
        if not cached:
            obj = os.path.join(dirs.out, BINDING_OBJECT)
            if pch_dir:
                text = plan.binding_text.replace("#include <torch/extension.h>", f'#include "{PCH_HEADER}"', 1)
                argv = [tc.cxx, f"-I{pch_dir}", "-Winvalid-pch", *flags]
            else:
                text, argv = plan.binding_text, [tc.cxx, *flags]
            src = write_private(dirs.src, "kj_binding.cpp", text)
            res = runner.run([*argv, "-c", src, "-o", obj], "binding" + (" (pch)" if pch_dir else ""), phases)
            if res["exit_code"] != 0 or res["timed_out"]:
                return "the binding unit did not compile"
            self._to_object_cache(key, BINDING_OBJECT, dirs)
            cached = obj
        objects["main"], objects["binding"] = glue_obj, cached
        return None

    def _undefined_after_light(self, runner: _Runner, objects: Mapping[str, str], phases: list[Phase]) -> str | None:
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
        for ln in _text(res).splitlines():
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
    def _build_files(self, spec: ExtensionSpec, dirs: _BuildDirs, runner: _Runner, result: BuildResult) -> None:
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
                ok, log = res["exit_code"] == 0 and not res["timed_out"], _text(res)
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
                raw = _text(res)
        self._finish(result, raw, dirs, runner)

    # helpers
    def _take_product(self, name: str, dirs: _BuildDirs, result: BuildResult) -> None:
        """The linked file, copied out of the sandbox's directory: result.so_path is the copy."""
        try:
            result.so_path = dirs.take(name, self.config.limits.file_size_bytes)
            result.ok = True
        except (OSError, UnsafeFile) as e:
            result.ok, result.so_path, result.error_kind = False, None, "sandbox_killed"
            result.log = f"the build's output could not be read safely: {e}"

    def _finish(self, result: BuildResult, raw: str, dirs: _BuildDirs, runner: _Runner) -> None:
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

    def _from_object_cache(self, key: str, name: str, dirs: _BuildDirs, phases: list[Phase]) -> str | None:
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
            copy_untrusted(entry.path, name, dst, owner=os.geteuid(), max_bytes=_MAX_PRODUCT_BYTES)
        except (OSError, UnsafeFile):
            return None  # evicted meanwhile, or not ours: build it
        phases.append(Phase(f"{name} (cached)", 0.0, True))
        return dst

    def _to_object_cache(self, key: str, name: str, dirs: _BuildDirs) -> None:
        """Publish out/<name> (copied out of the sandbox's directory first) under `key`."""
        if self.config.object_cache and self.cache:
            try:
                copy = dirs.take(name, self.config.limits.file_size_bytes)
                self.cache.publish(key, {name: copy}, {"kind": "object"}, move=True)
            except (OSError, ValueError):
                pass  # the cache is an optimisation: never fail a build for it


# --- stage 2: builds reached only at run time ------------------------------------------------------------------------
class RuntimeBuilder:
    """builder(spec) -> so_path for candidate.install_prebuilt in the GPU worker: a hit in the compile stage's cache
    (`cache_dir` as in CompileConfig; read only), else our build in a fresh dir under `work_dir` (never written into
    the cache: sandboxed processes only read it). Raises BuildError with the cleaned log if the build fails.

        install_prebuilt(modules, builder=RuntimeBuilder(cache_dir, work_dir, arch="sm_90"))
    """

    def __init__(self, cache_dir: str | None, work_dir: str, *, arch: str = "auto", timeout_s: float = 300.0,
                 toolchain: Toolchain | None = None,
                 config: BuildConfig = BuildConfig(use_pch=False, object_cache=False)):
        from cuda_eval import toolchain as tcmod
        self.cache_dir, self.work_dir, self.timeout_s, self.config = cache_dir, work_dir, timeout_s, config
        self.toolchain = toolchain or tcmod.detect(arch, cache_dir=cache_dir)
        self.builds: list[BuildResult] = []

    def __call__(self, spec: ExtensionSpec) -> str:
        key = spec.content_hash(self.toolchain.ident())
        if self.cache_dir:
            so = os.path.join(self.cache_dir, "builds", "entries", key[:2], key, f"{spec.name}.so")
            if os.path.exists(so):
                return so
        os.makedirs(self.work_dir, exist_ok=True)
        builder = Builder(self.toolchain, None, config=self.config, work_root=self.work_dir)
        build_dir = tempfile.mkdtemp(prefix=f"rt-{spec.name}-", dir=self.work_dir)
        result = builder.build(spec, build_dir, self.timeout_s)
        self.builds.append(result)
        if not result.ok:
            raise BuildError(result)
        return result.so_path
