"""The source files of one extension, as load_inline writes them (main.cpp, cuda.cu), plus `#line` markers so that
diagnostics name the candidate's strings ("cuda_sources[0]:12"); and the light header that can stand in for
<torch/types.h> in cuda.cu when the sources need nothing more (builder.py verifies it and falls back).
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence

from cuda_eval.compile.toolchain import Toolchain
from cuda_eval.protocol.extension_spec import ExtensionSpec

PCH_HEADER = "kj_torch_extension.h"
LIGHT_HEADER = "kj_light_torch.h"
# Where the light build finds its lean operator headers (`lean_op_headers`): a directory searched before torch's.
LEAN_DIR = "kj_lean"
# Sources that need more than the light header gives (python bindings, the C++ frontend, autograd, operator
# registration, ATen internals, from_blob & co. from ATen/Functions.h): straight to the exact build.
_NOT_LIGHT = re.compile(r"PYBIND11|pybind11|\bpy::|torch::(nn|autograd|jit|optim|data|serialize|python|Library|"
                        r"library|cuda)\b|TORCH_LIBRARY|at::native|"
                        r"#\s*include\s*[<\"]torch/(?!extension\.h|types\.h)|\bfrom_blob\b|NoGradGuard|"
                        r"InferenceMode|\bIValue\b|globalContext|manual_seed")
TORCH_INCLUDE = re.compile(r"^([ \t]*#[ \t]*include[ \t]*)<torch/(extension|types)\.h>", re.M)
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


# Every generated ATen/ops/<op>.h includes ATen/Context.h and ATen/DeviceGuard.h, which nothing in its own
# definitions uses; with them, a unit with one operator header parses ~230k lines, without them ~150k (as
# ATen/core/Tensor.h alone), in each of nvcc's three front ends. Sources that might name what those two declare keep
# them (a guess either way only costs time: the light build is verified, with the exact build as its fallback).
_LEAN_DROPPED = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<ATen/(Context|DeviceGuard)\.h>[ \t]*$", re.M)
_LEAN_KEEPS_ALL = re.compile(r"Guard|device_of|Context|\bhas[A-Z]\w*|Allocator|[Dd]eterministic|\binit\b")
_LIGHT_OP_INCLUDE = re.compile(r"^#include <ATen/ops/(\w+)\.h>$", re.M)


def line_marker(label: str) -> str:
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
        parts += [line_marker(f"cpp_sources[{i}]"), src]
    if spec.functions is not None:
        parts.append(line_marker("load_inline bindings"))
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
            src = TORCH_INCLUDE.sub(lambda m: f'{m.group(1)}"{LIGHT_HEADER}"', src)
        parts += [line_marker(f"cuda_sources[{i}]"), src]
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


def lean_op_headers(sources: Sequence[str], light_text: str, toolchain: Toolchain) -> dict[str, str]:
    """{path under LEAN_DIR: text}: the ATen/ops/<op>.h headers that `light_text` includes (and empty_like.h, which
    ATen/TensorOperators.h includes) as installed, less their includes of ATen/Context.h and ATen/DeviceGuard.h
    (`_LEAN_DROPPED`); empty if the sources might use those, or if a header is not where the toolchain says."""
    if _LEAN_KEEPS_ALL.search("\n".join(sources)):
        return {}
    out = {}
    for op in sorted(set(_LIGHT_OP_INCLUDE.findall(light_text)) | {"empty_like"}):
        rel = f"ATen/ops/{op}.h"
        text = _installed_header(toolchain.torch_include, rel)
        if text is None:
            return {}
        out[rel] = _LEAN_DROPPED.sub("", text)
    return out


@functools.lru_cache(maxsize=512)
def _installed_header(include_dirs: tuple[str, ...], rel: str) -> str | None:
    for d in include_dirs:
        try:
            with open(os.path.join(d, rel)) as f:
                return f.read()
        except OSError:
            continue
    return None
