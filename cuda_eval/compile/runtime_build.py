"""A build reached only at run time (a load_inline call the recorder never saw, e.g. inside forward), run for the
candidate's worker as a process of its own: `python -m cuda_eval.compile.runtime_build`, a request as JSON on stdin
(spec, toolchain, cache_dir, work_dir, timeout_s), the answer as JSON on stdout ({"so_path": ...} or {"error": the
message, "build": the result's summary}). The worker starts it (worker/runtime_build.py) and imports none of this:
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

# No precompiled header and no object cache: both live in the cache, which a sandboxed process only reads.
RUNTIME_CONFIG = BuildConfig(use_pch=False, object_cache=False)


def build(spec: ExtensionSpec, toolchain: Toolchain, cache_dir: str | None, work_dir: str, timeout_s: float) -> dict:
    """{"so_path": path} (a cache hit or our build), or {"error": message, "build": summary} for a failed build."""
    key = spec.content_hash(toolchain.ident())
    if cache_dir:
        so = os.path.join(cache_dir, "builds", "entries", key[:2], key, f"{spec.name}.so")
        if os.path.exists(so):
            return {"so_path": so, "build": None}
    os.makedirs(work_dir, exist_ok=True)
    builder = Builder(toolchain, None, config=RUNTIME_CONFIG, work_root=work_dir)
    result = builder.build(spec, tempfile.mkdtemp(prefix=f"rt-{spec.name}-", dir=work_dir), timeout_s)
    summary = {"ok": result.ok, "error_kind": result.error_kind, "header_mode": result.header_mode,
               "build_s": result.build_s}
    if not result.ok:
        return {"error": str(BuildError(result)), "build": summary}
    return {"so_path": result.so_path, "build": summary}


def main() -> int:
    request = json.loads(sys.stdin.read())
    answer = build(ExtensionSpec.from_dict(request["spec"]), Toolchain.from_dict(request["toolchain"]),
                   request["cache_dir"], request["work_dir"], float(request["timeout_s"]))
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
