"""On-disk cache of reference timings, so that each task's PyTorch reference is timed once per (GPU, torch version,
input dtypes, timing protocol) instead of once per candidate.

Layout: `<dir>/<task hash[:2]>/<task hash>.json` = {key: timing stats}. The key is built by the worker (it alone
knows the GPU name, torch version, input dtypes and the protocol) and is opaque here. Writers merge under an
exclusive lock and replace the file atomically, so concurrent evaluators and readers never see a torn file.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading

from cuda_eval.sandbox import safe_dirs


def task_hash(task_source: str) -> str:
    """Content hash of a task program, insensitive to line endings and trailing whitespace."""
    normalised = "\n".join(line.rstrip() for line in task_source.replace("\r\n", "\n").split("\n")).strip()
    return hashlib.sha256(normalised.encode()).hexdigest()


class ReferenceTimingCache:
    def __init__(self, directory: str | None):
        """`directory=None` keeps the cache in memory only (this process)."""
        self.directory = os.path.expanduser(directory) if directory else None
        if self.directory:  # the reference time enters every speedup: only a directory nobody else can write
            safe_dirs.ensure_dir(self.directory, 0o700, what="the reference-timing cache",
                                 fix=safe_dirs.fix_hint("EvalConfig.ref_timing_cache_dir"))
        self._memory: dict[str, dict[str, dict]] = {}
        self._lock = threading.Lock()

    def _path(self, digest: str) -> str:
        return os.path.join(self.directory, digest[:2], f"{digest}.json")

    def entries(self, digest: str) -> dict[str, dict]:
        """All cached timings of one task (key -> stats)."""
        with self._lock:
            found = dict(self._memory.get(digest, {}))
        if self.directory:
            try:
                with open(self._path(digest)) as f:
                    on_disk = json.load(f)
                if isinstance(on_disk, dict):   # a damaged entry is dropped, not passed on to the judge
                    found = {**{k: v for k, v in on_disk.items() if isinstance(k, str) and isinstance(v, dict)},
                             **found}
            except (OSError, ValueError):
                pass
        return found

    def store(self, digest: str, key: str, timing: dict) -> None:
        with self._lock:
            self._memory.setdefault(digest, {})[key] = timing
        if not self.directory:
            return
        path = self._path(digest)
        safe_dirs.ensure_dir(os.path.dirname(path), 0o700, what="the reference-timing cache")
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current: dict = {}
            try:
                with open(path) as f:
                    current = json.load(f)
            except (OSError, ValueError):
                pass
            current[key] = timing
            tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
            with open(tmp, "w") as f:
                json.dump(current, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
