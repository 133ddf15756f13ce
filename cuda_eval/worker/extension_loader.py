"""load_inline / load replaced inside the processes that run a candidate (worker/record.py, the worker).

- `record_extensions(sink)`: stage 1 (the recorder). load_inline/load only record their spec and return a module
  whose functions raise if called, so that a candidate can be executed on a CPU-only machine to learn its sources.
- `install_prebuilt(modules, builder=...)`: stage 2 (the candidate's worker). load_inline/load return the prebuilt
  module whose spec matches; a build never seen in stage 1 (e.g. reached only inside forward) goes through `builder`
  (our build + the cache, worker/runtime_build.py), never through torch's ninja build.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cuda_eval.protocol.extension_spec import BuiltModule, ExtensionSpec, spec_from_load, spec_from_load_inline


class ExtensionCallError(RuntimeError):
    """A recorded (not built) extension function was called: expected in the compile stage, where nothing runs."""


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

    load_inline.__wrapped_by__ = load.__wrapped_by__ = "cuda_eval.worker.extension_loader.record_extensions"
    return _Patch(load_inline, load)


# --- stage 2: prebuilt ------------------------------------------------------------------------------------------
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
