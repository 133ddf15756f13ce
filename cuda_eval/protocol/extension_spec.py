"""A candidate program: extraction from a model response, and interception of its extension builds.

- `extract_code(response)`: the program inside an LLM response (never raises).
- `ExtensionSpec`: everything a `load_inline` / `load` call passes that affects the build, hashable.
- `record_extensions(sink)`: stage 1 (compile workers). load_inline/load only record their spec and return a module
  whose functions raise if called, so that a candidate can be executed on a CPU-only machine to learn its sources.
- `install_prebuilt(modules, builder=...)`: stage 2 (GPU worker). load_inline/load return the prebuilt module whose
  spec matches; a build never seen in stage 1 (e.g. reached only inside forward) goes through `builder` (our build +
  the cache), never through torch's ninja build.

Extraction rule (documented in docs/ARCHITECTURE.md): fenced blocks are ```python / ```py / ```python3 / ``` (no
language) ... ```; only complete (closed) blocks count. Kevin-style answers put the final program after the
reasoning, so blocks after the last `</think>` are preferred; if there are none there, any block in the response is
considered (a model that forgets to close its think section still gets graded). Among the considered blocks the LAST
one that defines `class ModelNew` wins.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cuda_eval import pysource

# --- extraction -----------------------------------------------------------------------------------------------
_FENCE_OPEN = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+.\-]*)[^\n`]*$")
_PYTHON_LANGS = {"", "python", "py", "python3", "py3"}
_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Extraction:
    code: str | None
    error: str | None   # None when code was found

    @property
    def ok(self) -> bool:
        return self.code is not None


@dataclasses.dataclass(frozen=True)
class _Block:
    start: int           # character offset of the opening fence line
    lang: str
    code: str
    closed: bool


def _fenced_blocks(text: str) -> list[_Block]:
    blocks = []
    lines = text.splitlines(keepends=True)
    offset = 0
    i = 0
    offsets = []
    for line in lines:
        offsets.append(offset)
        offset += len(line)
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i].rstrip("\r\n"))
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        body = []
        j = i + 1
        closed = False
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped and stripped[0] == fence[0] and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed = True
                break
            body.append(lines[j])
            j += 1
        blocks.append(_Block(offsets[i], lang, "".join(body), closed))
        i = j + 1
    return blocks


def extract_code(response: str) -> Extraction:
    """The candidate program in `response`, or a format error saying what is missing. Never raises."""
    try:
        return _extract(response)
    except Exception as e:  # noqa: BLE001 - a format verdict, whatever the input
        return Extraction(None, f"could not parse the response ({type(e).__name__})")


def _extract(response: Any) -> Extraction:
    if not isinstance(response, str):
        return Extraction(None, f"the response is not text ({type(response).__name__})")
    if not response.strip():
        return Extraction(None, "empty response")
    blocks = [b for b in _fenced_blocks(response) if b.lang in _PYTHON_LANGS]
    if not blocks:
        return Extraction(None, "no ```python code block in the response")
    complete = [b for b in blocks if b.closed]
    if not complete:
        return Extraction(None, "the ```python code block is not closed (response truncated?)")
    think_end = response.rfind("</think>")
    after = [b for b in complete if b.start > think_end] if think_end >= 0 else complete
    for pool in (after, complete):
        with_model = [b for b in pool if _MODEL_NEW.search(b.code)]
        if with_model:
            code = with_model[-1].code
            return Extraction(code if code.endswith("\n") else code + "\n", None)
    return Extraction(None, "the code block does not define class ModelNew")


# --- extension specs ------------------------------------------------------------------------------------------
class ExtensionCallError(RuntimeError):
    """A recorded (not built) extension function was called: expected in the compile stage, where nothing runs."""


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)):
        if not all(isinstance(v, str) for v in value):
            raise TypeError(f"{what} must be a string or a list of strings")
        return tuple(value)
    raise TypeError(f"{what} must be a string or a list of strings, got {type(value).__name__}")


_STRING_TUPLES = ("cpp_sources", "cuda_sources", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                  "extra_include_paths")
_SAFE_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


def safe_file_name(name: str) -> bool:
    """A name our build may create in its own directory: no path, no leading dot or dash."""
    return isinstance(name, str) and _SAFE_FILE_NAME.fullmatch(name) is not None


@dataclasses.dataclass(frozen=True)
class ExtensionSpec:
    """What a load_inline / load call asks to build (every argument that changes the product; not the build
    directory, verbosity, keep_intermediates or torch's own use_pch)."""
    name: str
    cpp_sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    functions: tuple[tuple[str, str], ...] | None = None  # (name, docstring); None: no generated bindings
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_paths: tuple[str, ...] = ()
    with_cuda: bool | None = None
    with_pytorch_error_handling: bool = True
    is_python_module: bool = True
    is_standalone: bool = False
    no_implicit_headers: bool = False
    kind: str = "inline"                                   # "inline" (load_inline) | "files" (load)
    source_files: tuple[tuple[str, str], ...] = ()         # kind="files": (file name, content), sources then headers
    n_sources: int = 0                                     # kind="files": how many of source_files are sources

    def __post_init__(self):
        # Specs also come back from a file the candidate's process wrote (record.json): check every field's type.
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
            raise ValueError(f"extension name must be a valid identifier, got {self.name!r}")
        if self.kind not in ("inline", "files"):
            raise ValueError(f"kind must be 'inline' or 'files', got {self.kind!r}")
        for field in _STRING_TUPLES:
            value = getattr(self, field)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"{field} must be a tuple of strings")
        if self.functions is not None and not (isinstance(self.functions, tuple) and all(
                isinstance(f, tuple) and len(f) == 2 and all(isinstance(x, str) for x in f) for f in self.functions)):
            raise TypeError("functions must be None or a tuple of (name, docstring) pairs")
        if self.with_cuda is not None and not isinstance(self.with_cuda, bool):
            raise TypeError("with_cuda must be None or a bool")
        for field in ("with_pytorch_error_handling", "is_python_module", "is_standalone", "no_implicit_headers"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be a bool")
        if not isinstance(self.source_files, tuple) or not all(isinstance(f, tuple) and len(f) == 2 and all(
                isinstance(x, str) for x in f) for f in self.source_files):
            raise TypeError("source_files must be a tuple of (file name, content) pairs")
        for file_name, _ in self.source_files:
            if not safe_file_name(file_name):
                raise ValueError(f"source file name {file_name!r} is not a plain file name")
        if type(self.n_sources) is not int or not 0 <= self.n_sources <= len(self.source_files):
            raise ValueError(f"n_sources must be an int within 0..{len(self.source_files)}")

    @property
    def uses_cuda(self) -> bool:
        if self.with_cuda is not None:
            return bool(self.with_cuda)
        if self.kind == "files":
            return any(n.endswith((".cu", ".cuh")) for n, _ in self.source_files[:self.n_sources])
        return bool(self.cuda_sources)

    # plain data
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["functions"] = None if self.functions is None else [list(f) for f in self.functions]
        d["source_files"] = [list(f) for f in self.source_files]
        for k in ("cpp_sources", "cuda_sources", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                  "extra_include_paths"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> ExtensionSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown ExtensionSpec fields: {sorted(unknown)}")
        kw = dict(d)
        for k in ("cpp_sources", "cuda_sources", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                  "extra_include_paths"):
            if k in kw:
                kw[k] = tuple(kw[k])
        if kw.get("functions") is not None:
            kw["functions"] = tuple((str(a), str(b)) for a, b in kw["functions"])
        if "source_files" in kw:
            kw["source_files"] = tuple((str(a), str(b)) for a, b in kw["source_files"])
        return cls(**kw)

    def key(self) -> str:
        """Identity of the request alone (what the candidate asked for)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def content_hash(self, toolchain: Mapping) -> str:
        """Address of the built product: the request plus everything of the toolchain that changes the binary
        (torch/nvcc/compiler versions, target arch, Python ABI, our build recipe version)."""
        blob = json.dumps({"spec": self.key(), "toolchain": dict(toolchain)}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _functions(value: Any) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)):
        if not all(isinstance(v, str) for v in value):
            raise TypeError("functions must be a list of names or a dict of name -> docstring")
        return tuple((v, v) for v in value)
    if isinstance(value, dict):
        return tuple((str(k), str(v)) for k, v in value.items())
    raise ValueError(f"Expected 'functions' to be a list or dict, but was {type(value)}")


# Mirrors of torch.utils.cpp_extension's signatures (torch 2.11-2.13), so that positional calls bind the same way.
def _load_inline_signature(name, cpp_sources, cuda_sources=None, sycl_sources=None, functions=None,
                           extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None, extra_ldflags=None,
                           extra_include_paths=None, build_directory=None, verbose=False, with_cuda=None,
                           with_sycl=None, is_python_module=True, with_pytorch_error_handling=True,
                           keep_intermediates=True, use_pch=False, no_implicit_headers=False):
    pass


def _load_signature(name, sources, extra_cflags=None, extra_cuda_cflags=None, extra_sycl_cflags=None,
                    extra_ldflags=None, extra_include_paths=None, build_directory=None, verbose=False,
                    with_cuda=None, with_sycl=None, is_python_module=True, is_standalone=False,
                    keep_intermediates=True):
    pass


def _optional_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


_HEADER_EXTS = (".h", ".hpp", ".hh", ".cuh", ".inl", ".inc")
_MAX_SIBLING_HEADER_BYTES = 1 << 20


def spec_from_load_inline(*args, **kwargs) -> ExtensionSpec:
    """The spec of a load_inline(...) call (raises TypeError/ValueError for arguments torch would reject)."""
    a = inspect.signature(_load_inline_signature).bind(*args, **kwargs).arguments
    if a.get("sycl_sources") or a.get("with_sycl"):
        raise ValueError("SYCL sources are not supported by this evaluator")
    return ExtensionSpec(
        name=a["name"], cpp_sources=_strings(a["cpp_sources"], "cpp_sources"),
        cuda_sources=_strings(a.get("cuda_sources"), "cuda_sources"), functions=_functions(a.get("functions")),
        extra_cflags=_strings(a.get("extra_cflags"), "extra_cflags"),
        extra_cuda_cflags=_strings(a.get("extra_cuda_cflags"), "extra_cuda_cflags"),
        extra_ldflags=_strings(a.get("extra_ldflags"), "extra_ldflags"),
        extra_include_paths=_strings(a.get("extra_include_paths"), "extra_include_paths"),
        with_cuda=_optional_bool(a.get("with_cuda")),
        with_pytorch_error_handling=bool(a.get("with_pytorch_error_handling", True)),
        is_python_module=bool(a.get("is_python_module", True)),
        no_implicit_headers=bool(a.get("no_implicit_headers", False)), kind="inline")


def spec_from_load(*args, **kwargs) -> ExtensionSpec:
    """The spec of a load(name, sources=[files], ...) call: the files (and headers next to them) are read now."""
    a = inspect.signature(_load_signature).bind(*args, **kwargs).arguments
    if a.get("with_sycl"):
        raise ValueError("SYCL sources are not supported by this evaluator")
    sources = _strings(a["sources"], "sources")
    files: list[tuple[str, str]] = []
    seen = set()
    for path in sources:
        base = os.path.basename(path)
        if not safe_file_name(base):
            raise ValueError(f"source file name {base!r}: use letters, digits and _.+- (the evaluator copies it)")
        if base in seen:
            raise ValueError(f"two sources named {base}: the evaluator builds them in one directory")
        seen.add(base)
        with open(path, encoding="utf-8", errors="replace") as f:
            files.append((base, f.read()))
    n_sources = len(files)
    # Headers next to the sources (#include "kernel.cuh"), since the build happens elsewhere.
    for d in dict.fromkeys(os.path.dirname(os.path.abspath(p)) for p in sources):
        for entry in sorted(os.scandir(d), key=lambda e: e.name):
            if entry.name.endswith(_HEADER_EXTS) and entry.name not in seen and safe_file_name(entry.name) \
                    and entry.is_file() and entry.stat().st_size <= _MAX_SIBLING_HEADER_BYTES:
                seen.add(entry.name)
                with open(entry.path, encoding="utf-8", errors="replace") as f:
                    files.append((entry.name, f.read()))
    return ExtensionSpec(
        name=a["name"], extra_cflags=_strings(a.get("extra_cflags"), "extra_cflags"),
        extra_cuda_cflags=_strings(a.get("extra_cuda_cflags"), "extra_cuda_cflags"),
        extra_ldflags=_strings(a.get("extra_ldflags"), "extra_ldflags"),
        extra_include_paths=_strings(a.get("extra_include_paths"), "extra_include_paths"),
        with_cuda=_optional_bool(a.get("with_cuda")), is_python_module=bool(a.get("is_python_module", True)),
        is_standalone=bool(a.get("is_standalone", False)), kind="files", source_files=tuple(files),
        n_sources=n_sources)


# --- stage 1: record --------------------------------------------------------------------------------------------
class RecordedExtension:
    """What load_inline returns in the compile stage: any function of it raises ExtensionCallError."""

    def __init__(self, spec: ExtensionSpec):
        object.__setattr__(self, "_spec", spec)

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        spec = object.__getattribute__(self, "_spec")

        def not_built(*args, **kwargs):
            raise ExtensionCallError(f"extension {spec.name!r} is only recorded in the compile stage; "
                                     f"{attr}() runs in the GPU stage")
        not_built.__name__ = attr
        return not_built

    def __repr__(self) -> str:
        return f"<recorded extension {object.__getattribute__(self, '_spec').name!r}>"


_patch_lock = threading.RLock()


class _Patch:
    """Replaces torch.utils.cpp_extension.load_inline / load while active (a context manager; uninstall())."""

    def __init__(self, load_inline: Callable, load: Callable):
        import torch.utils.cpp_extension as cpp_extension
        self._module = cpp_extension
        with _patch_lock:
            self._saved = (cpp_extension.load_inline, cpp_extension.load)
            cpp_extension.load_inline = load_inline
            cpp_extension.load = load
        self.active = True

    def uninstall(self) -> None:
        with _patch_lock:
            if self.active:
                self._module.load_inline, self._module.load = self._saved
                self.active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.uninstall()


def record_extensions(sink: list) -> _Patch:
    """Stage 1: every load_inline/load call appends its ExtensionSpec to `sink` and returns a RecordedExtension
    (or, for is_python_module=False, a path string, as torch does)."""

    def record(spec: ExtensionSpec):
        sink.append(spec)
        if not spec.is_python_module:
            return f"<recorded:{spec.name}>.so"
        return RecordedExtension(spec)

    def load_inline(*args, **kwargs):
        return record(spec_from_load_inline(*args, **kwargs))

    def load(*args, **kwargs):
        return record(spec_from_load(*args, **kwargs))

    load_inline.__wrapped_by__ = load.__wrapped_by__ = "cuda_eval.candidate.record_extensions"
    return _Patch(load_inline, load)


# --- stage 2: prebuilt ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BuiltModule:
    """A built extension: what the compile stage hands to the GPU stage (plain data)."""
    name: str
    so_path: str
    spec_hash: str              # cache address (spec + toolchain)
    cache_hit: bool = False
    spec_key: str = ""          # ExtensionSpec.key(): how stage 2 recognises the load_inline call
    header_mode: str = ""       # "light" | "exact" | "light_failed_exact" | "cpp" (how the .cu was compiled)
    build_s: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def import_extension(name: str, so_path: str, is_python_module: bool = True):
    """Load a built extension the way torch's load_inline does (module from file; or a TORCH_LIBRARY .so). torch is
    imported first: the .so needs libc10/libtorch by soname, which only the loaded torch provides."""
    import torch
    if not is_python_module:
        torch.ops.load_library(so_path)
        return so_path
    spec = importlib.util.spec_from_file_location(name, so_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load extension {name} from {so_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_prebuilt(modules: Mapping[str, str] | Sequence[BuiltModule | Mapping], *,
                     builder: Callable[[ExtensionSpec], str] | None = None) -> _Patch:
    """Stage 2: load_inline/load return the prebuilt module of the matching spec.

    modules: {spec_key: so_path} or BuiltModule objects (or their dicts). builder(spec) -> so_path builds a spec
    never seen in stage 1 (raise to fail the call, as a failed build would); without a builder such a call raises.
    Returns the active patch (uninstall() / context manager)."""
    table: dict[str, str] = {}
    if isinstance(modules, Mapping):
        table.update({str(k): str(v) for k, v in modules.items()})
    else:
        for m in modules:
            if isinstance(m, Mapping):
                m = BuiltModule(**{k: v for k, v in m.items() if k in {f.name for f in dataclasses.fields(BuiltModule)}})
            if not m.spec_key:
                raise ValueError(f"BuiltModule {m.name} has no spec_key: it did not come from the compile stage")
            table[m.spec_key] = m.so_path
    loaded: dict[str, Any] = {}

    def provide(spec: ExtensionSpec):
        key = spec.key()
        if key in loaded:
            return loaded[key]
        so_path = table.get(key)
        if so_path is None:
            if builder is None:
                raise RuntimeError(f"extension {spec.name!r} was not built in the compile stage (a build reached only "
                                   "at run time) and no run-time builder is configured")
            so_path = builder(spec)
            table[key] = so_path
        module = import_extension(spec.name, so_path, spec.is_python_module)
        loaded[key] = module
        return module

    def load_inline(*args, **kwargs):
        return provide(spec_from_load_inline(*args, **kwargs))

    def load(*args, **kwargs):
        return provide(spec_from_load(*args, **kwargs))

    return _Patch(load_inline, load)


# --- static speculation --------------------------------------------------------------------------------------------
class _NotStatic(Exception):
    pass


def _static_value(node, env: dict):
    """The value of a literal-ish expression: constants, names bound to such values, lists/tuples/dicts of them,
    + of strings/lists, and implicit string concatenation. Anything else raises _NotStatic."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _NotStatic(node.id)
    if isinstance(node, ast.List):
        return [_static_value(e, env) for e in node.elts]
    if isinstance(node, ast.Tuple):       # a tuple stays one: ("-O3",) + ["-g"] raises in Python, so it must here
        return tuple(_static_value(e, env) for e in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_static_value(k, env): _static_value(v, env) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _static_value(node.left, env), _static_value(node.right, env)
        if type(left) is type(right) and isinstance(left, (str, list, tuple)):
            return left + right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _static_value(node.operand, env)
        if type(value) in (int, float):
            return -value if isinstance(node.op, ast.USub) else value
    raise _NotStatic(type(node).__name__)


def speculate_specs(code: str) -> list[ExtensionSpec]:
    """The extensions a program will most likely build, read statically (without running it): module-level
    `x = load_inline(...)` calls whose arguments are literals or module-level constants. Used to start building
    while the program is still being recorded; the recorded specs remain the truth. Never raises; [] if unsure."""
    try:
        tree = pysource.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, SystemError):
        return []
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree)):
        return []
    env: dict = {}
    specs: list[ExtensionSpec] = []
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
        if isinstance(value, ast.Call):
            fn = value.func
            fname = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if fname == "load_inline":
                try:
                    args = [_static_value(a, env) for a in value.args]
                    kwargs = {k.arg: _static_value(k.value, env) for k in value.keywords if k.arg}
                    if any(k.arg is None for k in value.keywords):
                        raise _NotStatic("**kwargs")
                    specs.append(spec_from_load_inline(*args, **kwargs))
                except Exception:  # noqa: BLE001 - not statically knowable: the recording will tell
                    pass
                continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                env[stmt.targets[0].id] = _static_value(stmt.value, env)
            except _NotStatic:
                env.pop(stmt.targets[0].id, None)
    return specs


# --- static record ---------------------------------------------------------------------------------------------
# The reading answers only for programs whose import runs nothing of their own before their builds: these imports,
# literal assignments, plain functions and nn.Module classes, and the loader calls. Anything else is recorded.
_LOADER = "torch.utils.cpp_extension.load_inline"
_TORCH_MODULES = frozenset({"torch", "torch.nn", "torch.nn.functional", "torch.utils", "torch.utils.cpp_extension"})
_TORCH_FROM = frozenset({("torch.utils.cpp_extension", "load_inline"), ("torch.utils", "cpp_extension"),
                         ("torch", "nn"), ("torch", "Tensor"), ("torch.nn", "functional"), ("torch.nn", "Module")})
_STDLIB_PLAIN = frozenset({"math", "typing", "functools", "itertools", "collections", "dataclasses", "numbers",
                           "abc", "os"})
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})
# Names through which a program can reach its module's namespace, a frame or the loader unseen.
_OPAQUE_NAMES = frozenset({"exec", "eval", "compile", "getattr", "setattr", "delattr", "globals", "locals", "vars",
                           "__import__", "__builtins__", "builtins", "importlib", "sys", "inspect", "__dict__",
                           "__class__", "__globals__", "__code__", "__getattribute__", "__setattr__", "f_globals",
                           "f_locals", "f_back", "__subclasses__", "__mro__", "__bases__", "__base__"})
# Attributes that lead to the loader: outside a call read as one, the program reaches it some other way.
_LOADER_ATTRIBUTES = frozenset({"cpp_extension", "load_inline"})
_MAX_DOTTED = 64


def _dotted(node) -> str | None:
    """"a.b.c" for a chain of attributes on a name (iteratively: a 500-deep chain must not recurse), else None."""
    parts = []
    while isinstance(node, ast.Attribute) and len(parts) < _MAX_DOTTED:
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _no_call(node) -> bool:
    return not any(isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom))
                   for n in ast.walk(node))


class _Reading:
    """One program's static reading (static_record_specs). Every check returns False / raises _NotStatic to
    decline."""

    def __init__(self, tree):
        self.tree = tree
        self.modules: dict[str, str] = {}   # identifier -> what it names: "torch.nn", "torch.utils.cpp_extension...
        self.env: dict = {}                 # module-level names bound to literal values, at the current statement
        self.specs: list[ExtensionSpec] = []
        self.loader_funcs: list = []         # the func node of every loader call read

    def resolve(self, node) -> str | None:
        """The torch path an expression names (`nn.Module` -> "torch.nn.Module"), or None."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in self.modules:
            return None
        return self.modules[head] + ("." + rest if rest else "")

    def plain_import(self, stmt) -> bool:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name in _TORCH_MODULES:
                    name = alias.asname or alias.name.split(".")[0]
                    target = alias.name if alias.asname else "torch"
                    self.modules[name] = target
                elif alias.name in _STDLIB_PLAIN or (alias.name == "numpy"
                                                     and importlib.util.find_spec("numpy") is not None):
                    pass
                else:
                    return False
            return True
        if stmt.level or not stmt.module:
            return False
        for alias in stmt.names:
            if (stmt.module, alias.name) in _TORCH_FROM:
                self.modules[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
            elif stmt.module in _STDLIB_PLAIN and alias.name != "*" and \
                    hasattr(importlib.import_module(stmt.module), alias.name):
                pass
            else:
                return False                # unknown module, a name it lacks, `*`, __future__ (must come first)
        return True

    def plain_def(self, stmt, in_class: bool) -> bool:
        """A def whose creation runs nothing of the program's: plain decorators, literal defaults, annotations
        without calls; in a class, no special method but __init__ (no __init_subclass__, __class_getitem__,
        __set_name__, __new__ ... that Python would call at import)."""
        a = stmt.args
        if in_class and stmt.name.startswith("__") and stmt.name.endswith("__") and stmt.name != "__init__":
            return False
        if not all(isinstance(d, ast.Name) and d.id in _PLAIN_DECORATORS for d in stmt.decorator_list):
            return False
        for default in [*a.defaults, *(d for d in a.kw_defaults if d is not None)]:
            _static_value(default, self.env)
        annotations = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                       if x is not None and x.annotation is not None] + ([stmt.returns] if stmt.returns else [])
        return all(_no_call(n) for n in annotations)

    def plain_class(self, stmt) -> bool:
        """A class of nn.Module (or of nothing), no keywords, no decorators, a body of plain defs and literal
        assignments: creating it runs no code of the program's."""
        if stmt.keywords or stmt.decorator_list:
            return False
        if not all(self.resolve(b) == "torch.nn.Module" for b in stmt.bases):
            return False
        for s in stmt.body:
            if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
                continue
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.plain_def(s, in_class=True):
                continue
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                    and not s.targets[0].id.startswith("__"):
                _static_value(s.value, self.env)
                continue
            return False
        return True

    def loader_call(self, value) -> bool:
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if isinstance(func, ast.Name):
            is_loader = self.modules.get(func.id) == _LOADER
        else:
            is_loader = self.resolve(func) == _LOADER
        if not is_loader:
            return False
        if any(k.arg is None for k in value.keywords) or any(isinstance(a, ast.Starred) for a in value.args):
            raise _NotStatic("*args or **kwargs")
        args = [_static_value(a, self.env) for a in value.args]
        kwargs = {k.arg: _static_value(k.value, self.env) for k in value.keywords}
        self.specs.append(spec_from_load_inline(*args, **kwargs))
        self.loader_funcs.append(func)
        return True

    def statement(self, stmt) -> bool:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            return True
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return self.plain_import(stmt)
        if isinstance(stmt, ast.Expr):
            return self.loader_call(stmt.value)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if not self.loader_call(stmt.value):
                self.env[name] = _static_value(stmt.value, self.env)     # raises if it is not a literal value
            return True
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return stmt.name not in self.modules and self.plain_def(stmt, in_class=False)
        if isinstance(stmt, ast.ClassDef):
            return stmt.name not in self.modules and self.plain_class(stmt)
        return False

    def read(self) -> list[ExtensionSpec] | None:
        if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in self.tree.body):
            return None
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id in _OPAQUE_NAMES:
                return None
            if isinstance(node, ast.Attribute) and node.attr in _OPAQUE_NAMES:
                return None
        for stmt in self.tree.body:
            if not self.statement(stmt):
                return None
        if not self.specs:
            return None
        # The loader reached nowhere but in the calls read.
        in_calls = {id(node) for f in self.loader_funcs for node in (*_links(f), _base_name(f))}
        for node in ast.walk(self.tree):
            if id(node) in in_calls:
                continue
            if isinstance(node, ast.Name) and self.modules.get(node.id, "").startswith("torch.utils"):
                return None
            if isinstance(node, ast.Attribute) and node.attr in _LOADER_ATTRIBUTES:
                return None
        return list({s.key(): s for s in self.specs}.values())


def _base_name(node):
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _links(chain):
    """The attribute nodes of a chain a.b.c (none for a bare name)."""
    while isinstance(chain, ast.Attribute):
        yield chain
        chain = chain.value


def static_record_specs(code: str) -> list[ExtensionSpec] | None:
    """The extensions a program builds, read from its source without running it, when that reading is complete:
    the specs the recording (cuda_eval.record) would give, in its order, or None when the program must be recorded.

    Complete means that importing the program runs nothing of its own before or between its builds, and that its
    builds are plain to see: it compiles (ast and compile(), so every syntax error the interpreter reports is the
    recording's to report); it defines ModelNew; every statement at module level is an import of torch (torch, nn,
    functional, cpp_extension, load_inline) or of a few plain standard modules (names that exist), an assignment
    of a literal value (constants, lists, tuples, dicts, `+`, names bound so before), a def with plain decorators,
    literal defaults and call-free annotations, a class of nn.Module without keywords, decorators or special
    methods but __init__ whose body is such defs and literal assignments, a docstring, or a call of torch's
    load_inline with literal arguments; no import anywhere else; torch's names never rebound at module level; the
    loader and cpp_extension reached nowhere but in those calls; nothing that can reach a namespace or a frame
    (exec, getattr, globals, sys, inspect, __dict__, f_globals ... : _OPAQUE_NAMES). Anything else returns None.
    A build the reading missed would still be built when the program asks for it at run time (install_prebuilt's
    run-time builder), and a program only ever gets modules built from the specs it passes. Never raises."""
    try:
        tree = pysource.parse(code)
        with pysource.lock():
            compile(tree, "<candidate>", "exec", dont_inherit=True)
        return _Reading(tree).read()
    except Exception:  # noqa: BLE001 - a syntax error, _NotStatic, arguments load_inline itself would refuse,
        return None    # a RecursionError on absurd nesting: the recording tells
