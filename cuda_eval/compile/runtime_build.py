"""A build reached only at run time (a load_inline call the recorder never saw, e.g. inside forward), run for the
candidate's worker as a process of its own: `python -m cuda_eval.compile.runtime_build`, a request as JSON on stdin
(spec, toolchain, cache_dir, work_dir, timeout_s, path_map), the answer as JSON on stdout ({"so_path": ...} or
{"error": the message, "build": the result's summary}). The worker starts it (worker/runtime_build.py) and imports none of this:
the build's orchestration and the sandbox stay on the trusted side of the code, and the process runs inside the
worker's sandbox, so its compilers run as that sandbox's uid (sandbox/identity.py: a sandbox started from inside one).

The compile stage's cache answers when it holds the product (read only); else our Builder builds in a fresh dir
under `work_dir` (never written into the cache: sandboxed processes only read it). The product serves that worker
alone.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from cuda_eval.compile.builder import BuildConfig, Builder, BuildError
from cuda_eval.compile.toolchain import Toolchain
from cuda_eval.protocol.extension_spec import ExtensionSpec
from cuda_eval.sandbox.environment import map_in
from cuda_eval.sandbox.runtime import RuntimeView

# No precompiled header and no object cache: both live in the cache, which a sandboxed process only reads.
RUNTIME_CONFIG = BuildConfig(use_pch=False, object_cache=False)


def staged(toolchain: Toolchain, path_map) -> Toolchain:
    """The toolchain with every path (compilers, include dirs, flags) as this sandbox uid reaches it: the real
    prefixes of `path_map` replaced by their staged copies, as the sandbox maps a process' arguments."""
    if not path_map:
        return toolchain
    view = RuntimeView(python=sys.executable, path_map=tuple(sorted(map(tuple, path_map), key=lambda e: -len(e[0]))))

    def mapped(value):
        if isinstance(value, str):
            return map_in(value, view)
        if isinstance(value, (list, tuple)):
            return [mapped(v) for v in value]
        if isinstance(value, dict):
            return {k: mapped(v) for k, v in value.items()}
        return value
    return Toolchain.from_dict(mapped(toolchain.to_dict()))


def build(spec: ExtensionSpec, toolchain: Toolchain, cache_dir: str | None, work_dir: str, timeout_s: float,
          path_map=()) -> dict:
    """{"so_path": path} (a cache hit or our build), or {"error": message, "build": summary} for a failed build.
    The cache key is the compile stage's (real paths); the build uses the staged ones."""
    key = spec.content_hash(toolchain.ident())
    if cache_dir:
        so = os.path.join(cache_dir, "builds", "entries", key[:2], key, f"{spec.name}.so")
        if os.path.exists(so):
            return {"so_path": so, "build": None}
    os.makedirs(work_dir, exist_ok=True)
    builder = Builder(staged(toolchain, path_map), None, config=RUNTIME_CONFIG, work_root=work_dir)
    result = builder.build(spec, tempfile.mkdtemp(prefix=f"rt-{spec.name}-", dir=work_dir), timeout_s)
    summary = {"ok": result.ok, "error_kind": result.error_kind, "header_mode": result.header_mode,
               "build_s": result.build_s}
    if not result.ok:
        return {"error": str(BuildError(result)), "build": summary}
    return {"so_path": result.so_path, "build": summary}


def main() -> int:
    request = json.loads(sys.stdin.read())
    answer = build(ExtensionSpec.from_dict(request["spec"]), Toolchain.from_dict(request["toolchain"]),
                   request["cache_dir"], request["work_dir"], float(request["timeout_s"]), request["path_map"])
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
