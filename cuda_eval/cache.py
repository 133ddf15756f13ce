"""Content-addressed on-disk cache of build products (extension .so files, object files, precompiled headers).

Layout: <root>/entries/<key[:2]>/<key>/ holds the entry's files and meta.json. An entry appears atomically: it is
assembled in <root>/tmp/ and renamed into place (a concurrent publisher of the same key loses the rename and drops
its copy; both copies are identical by construction). Readers take no lock: an entry directory either exists
complete or not at all. Recency for LRU is the entry directory's mtime, touched on every hit (works on noatime
mounts). Eviction (oldest first, down to 90% of max_bytes) runs under a non-blocking flock so that one process does
it at a time; an entry is first renamed into <root>/trash/ (it disappears atomically) and then deleted, so a reader
that already opened a file keeps a valid file. Entries used within `min_age_s` are never evicted: a compile result
handed to a GPU worker stays loadable until that worker imports it.

Files published here are re-owned by us (0644/0755), so a sandbox uid that produced them cannot alter them later.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    key: str
    path: str                # the entry directory
    meta: dict

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)


class BuildCache:
    """A directory of content-addressed entries with a size bound. Safe for many processes at once."""

    def __init__(self, root: str, max_bytes: int, *, min_age_s: float = 3600.0, evict_interval_s: float = 5.0):
        if max_bytes <= 0:
            raise ValueError(f"cache max_bytes must be > 0, got {max_bytes}")
        self.root = os.path.abspath(os.path.expanduser(root))
        self.max_bytes = int(max_bytes)
        self.min_age_s = float(min_age_s)
        self.evict_interval_s = float(evict_interval_s)
        self._last_evict = 0.0
        for sub in ("entries", "tmp", "trash"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        # Sandboxed GPU workers (another uid) must reach the entries; nothing here is writable by them.
        for d in (self.root, os.path.join(self.root, "entries")):
            try:
                os.chmod(d, 0o755)
            except PermissionError:  # a cache dir created by someone else: leave its mode alone
                pass

    # --- reading --------------------------------------------------------------------------------------------------
    def entry_dir(self, key: str) -> str:
        _check_key(key)
        return os.path.join(self.root, "entries", key[:2], key)

    def lookup(self, key: str, required: tuple[str, ...] = ()) -> CacheEntry | None:
        """The entry for `key` (its required files present) or None. A hit refreshes its LRU time."""
        path = self.entry_dir(key)
        try:
            with open(os.path.join(path, "meta.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        if not all(os.path.exists(os.path.join(path, name)) for name in required):
            return None
        try:
            os.utime(path)
        except OSError:  # evicted between the read and now, or a read-only cache: still a valid hit
            pass
        return CacheEntry(key, path, meta)

    # --- writing --------------------------------------------------------------------------------------------------
    def publish(self, key: str, files: Mapping[str, str], meta: Mapping | None = None, *,
                move: bool = False) -> CacheEntry:
        """Insert `files` ({name in entry: source path}) under `key`. move=True renames sources when possible
        (same filesystem), else copies. Returns the entry (an existing one if another process won the race)."""
        final = self.entry_dir(key)
        for name in files:
            if not name or "/" in name or name == "meta.json" or name.startswith("."):
                raise ValueError(f"bad cache file name: {name!r}")
        tmp = tempfile.mkdtemp(prefix=f"{key[:16]}-", dir=os.path.join(self.root, "tmp"))
        try:
            for name, src in files.items():
                _check_source(src)
                dst = os.path.join(tmp, name)
                moved = False
                if move:
                    try:
                        os.rename(src, dst)
                        moved = True
                    except OSError:
                        moved = False
                if not moved:
                    shutil.copyfile(src, dst)
                _own(dst)
            full_meta = dict(meta or {})
            full_meta.setdefault("created", time.time())
            full_meta["files"] = sorted(files)
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump(full_meta, f, sort_keys=True)
            os.chmod(os.path.join(tmp, "meta.json"), 0o644)
            os.chmod(tmp, 0o755)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.chmod(os.path.dirname(final), 0o755)
            try:
                os.rename(tmp, final)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # lost the race: the other copy is identical
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.maybe_evict()
        entry = self.lookup(key)
        if entry is None:
            raise OSError(f"cache entry {key} vanished right after publishing it (cache far too small?)")
        return entry

    # --- size bound -----------------------------------------------------------------------------------------------
    def size_bytes(self) -> int:
        return sum(size for _, _, size in self._entries())

    def _entries(self):
        """(mtime, path, size) of every entry."""
        out = []
        entries_root = os.path.join(self.root, "entries")
        for shard in os.scandir(entries_root):
            if not shard.is_dir():
                continue
            for e in os.scandir(shard.path):
                try:
                    mtime = e.stat().st_mtime
                    size = sum(f.stat().st_size for f in os.scandir(e.path) if f.is_file())
                except OSError:
                    continue
                out.append((mtime, e.path, size))
        return out

    def maybe_evict(self, force: bool = False) -> int:
        """Evict least recently used entries if over max_bytes. Returns bytes freed (0 if another process is
        evicting or it was checked less than evict_interval_s ago)."""
        now = time.monotonic()
        if not force and now - self._last_evict < self.evict_interval_s:
            return 0
        self._last_evict = now
        lock_path = os.path.join(self.root, ".evict.lock")
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return 0
            entries = self._entries()
            total = sum(size for _, _, size in entries)
            if total <= self.max_bytes:
                return 0
            target = int(self.max_bytes * 0.9)
            freed = 0
            wall_now = time.time()
            for mtime, path, size in sorted(entries):
                if total - freed <= target:
                    break
                if wall_now - mtime < self.min_age_s:
                    continue
                trash = os.path.join(self.root, "trash", uuid.uuid4().hex)
                try:
                    os.rename(path, trash)
                except OSError:
                    continue
                shutil.rmtree(trash, ignore_errors=True)
                freed += size
            self._clean_tmp()
            return freed

    def _clean_tmp(self, older_than_s: float = 3600.0) -> None:
        """Remove staging dirs left by crashed publishers."""
        cutoff = time.time() - older_than_s
        for sub in ("tmp", "trash"):
            for e in os.scandir(os.path.join(self.root, sub)):
                try:
                    if e.stat().st_mtime < cutoff:
                        shutil.rmtree(e.path, ignore_errors=True)
                except OSError:
                    pass


def _check_key(key: str) -> None:
    if len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"cache keys are lowercase hex digests, got {key!r}")


def _check_source(path: str) -> None:
    """Sources may come from a sandboxed build dir: accept only plain files with one link, so that a symlink or a
    hard link planted there cannot make us copy or re-own something else."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        raise ValueError(f"refusing to cache {path}: not a regular file with a single link")


def _own(path: str) -> None:
    """Make a published file ours and read-only for others (it may come from a sandbox uid's build dir)."""
    if os.geteuid() == 0:
        os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, 0o755 if os.access(path, os.X_OK) or path.endswith(".so") else 0o644)
