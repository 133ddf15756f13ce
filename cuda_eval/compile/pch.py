"""The precompiled header of torch/extension.h for main.cpp: one per (toolchain, flag set), ~800 MB each, in a cache
of its own; built in the background the first time a flag set is seen (that build compiles without it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence

from cuda_eval.compile.build_dirs import BuildDirs, write_private
from cuda_eval.compile.cache import BuildCache, UnsafeFile
from cuda_eval.compile.nvcc import output_text
from cuda_eval.compile.sources import PCH_HEADER
from cuda_eval.compile.toolchain import Toolchain
from cuda_eval.sandbox import runner as sb


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
                dirs = BuildDirs.create(work)
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
                        self.failures[key] = output_text(res)[-2000:]
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
