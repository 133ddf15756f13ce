"""The precompiled header of torch/extension.h for main.cpp: one per (toolchain, flag set), ~800 MB each, in a cache
of its own; built in the background the first time a flag set is seen (that build compiles without it). The same for
the glue unit's prelude (ATen/core/Tensor.h, ~150 MB): a header is named by its file name and text.
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

    def key(self, pch_flags: Sequence[str], header: tuple[str, str] | None = None) -> str:
        blob = {"flags": list(pch_flags), "toolchain": self.toolchain.ident(), "pch": 1}
        if header is not None:
            blob["header"] = list(header)
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()

    def lookup(self, pch_flags: Sequence[str], header: tuple[str, str] | None = None) -> str | None:
        """Directory holding the header (PCH_HEADER unless `header` = (file name, text)) and its .gch, if built."""
        name = header[0] if header else PCH_HEADER
        entry = self.cache.lookup(self.key(pch_flags, header), required=(name, name + ".gch"))
        return entry.path if entry else None

    def ensure(self, pch_flags: Sequence[str], *, wait: bool, header: tuple[str, str] | None = None) -> str | None:
        path = self.lookup(pch_flags, header)
        if path or self.toolchain.headers_use_extension_name:
            return path
        key = self.key(pch_flags, header)
        with self._lock:
            if key in self.failures:
                return None
            if key in self._building and not wait:
                return None
            start = key not in self._building
            self._building.add(key)
        if not wait:
            if start:
                threading.Thread(target=self._build, args=(list(pch_flags), key, header), daemon=True,
                                 name="cuda_eval-pch").start()
            return None
        if start:
            self._build(list(pch_flags), key, header)
        else:
            while True:
                with self._lock:
                    if key not in self._building:
                        break
                time.sleep(0.2)
        return self.lookup(pch_flags, header)

    def _build(self, pch_flags: list[str], key: str, header: tuple[str, str] | None) -> None:
        try:
            os.makedirs(self.work_root, exist_ok=True)
            work = tempfile.mkdtemp(prefix="pch-", dir=self.work_root)
            try:
                dirs = BuildDirs.create(work)
                name, text = header or (PCH_HEADER, "#include <torch/extension.h>\n")
                path = write_private(dirs.src, name, text)
                with sb.SandboxSession(dirs.out) as session:
                    dirs.confine(session)
                    limits = dataclasses.replace(self.limits, wall_timeout_s=900, file_size_bytes=4 << 30)
                    res = session.run([self.toolchain.cxx, *pch_flags, "-x", "c++-header", path, "-o",
                                       name + ".gch"], limits)
                    gch = None
                    if res["exit_code"] == 0:
                        try:
                            gch = dirs.take(name + ".gch", limits.file_size_bytes)
                        except (OSError, UnsafeFile) as e:
                            res = {**res, "exit_code": -1, "stdout": b"", "stderr": str(e).encode()}
                if gch is None:
                    with self._lock:
                        self.failures[key] = output_text(res)[-2000:]
                    return
                self.cache.publish(key, {name: path, name + ".gch": gch},
                                   {"flags": pch_flags, "build_s": res["wall_s"]}, move=True)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        finally:
            with self._lock:
                self._building.discard(key)


def pch_flags(cflags: Sequence[str]) -> list[str]:
    """The main.cpp flags a PCH is built with: all but the extension name (defined in main.cpp after the PCH)."""
    return [f for f in cflags if not f.startswith("-DTORCH_EXTENSION_NAME=")]
