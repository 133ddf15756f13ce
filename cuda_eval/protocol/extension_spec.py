"""What a program asks to build, as plain data, and how it travels between processes.

- `ExtensionSpec`: everything a `load_inline` / `load` call passes that affects the build, hashable; made by
  `spec_from_load_inline` / `spec_from_load` from the call's arguments (in the recorder and the worker, where the
  candidate calls them; in the trainer's process, from the program's text: static/static_record.py).
- record.json: the recorder (worker/record.py, a sandboxed process running the candidate) writes the specs there;
  the compile pool reads it back through `ExtensionSpec.from_dict`, which checks every field: the file is the
  candidate's.
- `BuiltModule`: a built extension, what the compile stage hands to the candidate's worker.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
from collections.abc import Mapping
from typing import Any

# The record stage's files, in the recorder's work dir: the task and the program in, the recorded specs out.
CANDIDATE_FILE = "candidate.py"
TASK_FILE = "task.py"
RECORD_FILE = "record.json"


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
    # The kernel symbols of its device code, read from the built file by the compile stage (protocol/kernel_symbols):
    # the candidate's kernels, known by what its build produced; None when they could not be read.
    kernels: list | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
