"""Content-addressed on-disk cache of build products (extension .so files, object files, precompiled headers).

Layout: <root>/entries/<key[:2]>/<key>/ holds the entry's files and meta.json. An entry appears atomically: it is
assembled in <root>/tmp/ and renamed into place (a concurrent publisher of the same key loses the rename and drops
its copy; both copies are identical by construction). Readers take no lock: an entry directory either exists
complete or not at all. Recency for LRU is the entry directory's mtime, touched on every hit (works on noatime
mounts). Eviction (oldest first, down to 90% of max_bytes) runs under a non-blocking flock so that one process does
it at a time; an entry is first renamed into <root>/trash/ (it disappears atomically) and then deleted, so a reader
that already opened a file keeps a valid file. Entries used within `min_age_s` are never evicted: a compile result
handed to a GPU worker stays loadable until that worker imports it.

Files published here are ours (0644/0755): a file from a sandbox uid's directory is copied through a checked
descriptor (`open_untrusted`), never renamed in, so no inode a sandbox uid owns or holds open enters the cache.
Sandboxed processes read entries by path (the GPU workers load .so files), but `entries/` and its prefix dirs are
0711: an entry can be opened only by whoever knows its key. `private=True` (the record store: candidate sources)
makes the whole cache 0700.
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

from cuda_eval.sandbox import safe_dirs


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    key: str
    path: str                # the entry directory
    meta: dict

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)


class BuildCache:
    """A directory of content-addressed entries with a size bound. Safe for many processes at once."""

    def __init__(self, root: str, max_bytes: int, *, min_age_s: float = 3600.0, evict_interval_s: float = 5.0,
                 private: bool = False):
        if max_bytes <= 0:
            raise ValueError(f"cache max_bytes must be > 0, got {max_bytes}")
        self.root = os.path.abspath(os.path.expanduser(root))
        self.max_bytes = int(max_bytes)
        self.min_age_s = float(min_age_s)
        self.evict_interval_s = float(evict_interval_s)
        self._last_evict = 0.0
        self.private = private
        # Sandboxed GPU workers (another uid) must reach entries whose key they were given, and nothing more:
        # entries/ and its prefix dirs are traversable, not listable; staging and trash are ours alone. Every one
        # ours (safe_dirs): one that someone else made first, or a link, is refused, never chmod'ed or renamed into.
        entries = os.path.join(self.root, "entries")
        modes = {self.root: 0o700 if private else 0o755, entries: 0o711, os.path.join(self.root, "tmp"): 0o700,
                 os.path.join(self.root, "trash"): 0o700}
        for d, mode in modes.items():
            safe_dirs.ensure_dir(d, mode, what="the build cache", fix=safe_dirs.fix_hint(
                "CompileConfig.cache_dir / $CUDA_EVAL_CACHE_DIR"))
        for e in os.scandir(entries):
            if e.is_dir(follow_symlinks=False):
                safe_dirs.ensure_dir(e.path, 0o711, what="a build cache prefix dir")

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
        """Insert `files` ({name in entry: source path}) under `key`. move=True renames a source when that is safe
        (ours, in a directory only we can write to, same filesystem), else it is copied. A source must be a
        regular file with a single link (ValueError otherwise: it may come from a sandbox's directory). Returns
        the entry (an existing one if another process won the race)."""
        final = self.entry_dir(key)
        for name in files:
            if not name or "/" in name or name == "meta.json" or name.startswith("."):
                raise ValueError(f"bad cache file name: {name!r}")
        tmp = tempfile.mkdtemp(prefix=f"{key[:16]}-", dir=os.path.join(self.root, "tmp"))
        try:
            for name, src in files.items():
                _take(src, os.path.join(tmp, name), move=move)
            full_meta = dict(meta or {})
            full_meta.setdefault("created", time.time())
            full_meta["files"] = sorted(files)
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump(full_meta, f, sort_keys=True)
            os.chmod(os.path.join(tmp, "meta.json"), 0o644)
            os.chmod(tmp, 0o755)
            safe_dirs.ensure_dir(os.path.dirname(final), 0o711, what="a build cache prefix dir")
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


class UnsafeFile(ValueError):
    """A file that may have been planted by a sandbox uid is not what it must be (a link, a FIFO, too big...)."""


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC


def _open_checked(path: str, *, dir_fd: int | None = None, owner: int | None, max_bytes: int | None) -> int:
    """An fd on `path` if it is a regular file with a single link (owned by `owner`, at most max_bytes, when
    given); never follows a symlink in the last component, never blocks on a FIFO or takes a controlling tty."""
    try:
        fd = os.open(path, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFile(f"refusing {path}: not a regular file with a single link (a symbolic link)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise UnsafeFile(f"refusing {path}: not a regular file with a single link")
        if owner is not None and st.st_uid != owner:
            raise UnsafeFile(f"refusing {path}: owned by uid {st.st_uid}, not {owner}")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFile(f"refusing {path}: {st.st_size} bytes (limit {max_bytes})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_untrusted(directory: str, name: str, *, owner: int, max_bytes: int) -> int:
    """A read-only fd on `directory`/`name`, a file a sandbox uid may have written or replaced: UnsafeFile unless
    it is a regular file with a single link, owned by `owner` (the uid the sandbox ran as) and at most
    `max_bytes`. FileNotFoundError if it is missing. The caller closes the fd."""
    if not name or "/" in name or name in (".", ".."):
        raise UnsafeFile(f"bad file name {name!r}")
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return _open_checked(name, dir_fd=dfd, owner=owner, max_bytes=max_bytes)
    finally:
        os.close(dfd)


def read_untrusted(directory: str, name: str, *, owner: int, max_bytes: int) -> bytes:
    """The bytes of a file checked as by open_untrusted (at most max_bytes of them)."""
    fd = open_untrusted(directory, name, owner=owner, max_bytes=max_bytes)
    try:
        data = _read_capped(fd, max_bytes)
    finally:
        os.close(fd)
    return data


def copy_untrusted(directory: str, name: str, dst: str, *, owner: int, max_bytes: int) -> str:
    """Copy a file checked as by open_untrusted into a new file `dst` of ours (created exclusively; 0755 if the
    source was executable, else 0644). Returns dst."""
    fd = open_untrusted(directory, name, owner=owner, max_bytes=max_bytes)
    try:
        _copy_fd(fd, dst, max_bytes, 0o755 if os.fstat(fd).st_mode & 0o111 else 0o644)
    finally:
        os.close(fd)
    return dst


def _read_capped(fd: int, max_bytes: int | None) -> bytes:
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:  # it grew after the size check
            raise UnsafeFile(f"file grew beyond {max_bytes} bytes while being read")
        chunks.append(chunk)


def _copy_fd(fd: int, dst: str, max_bytes: int | None, mode: int = 0o644) -> None:
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(out, mode)  # whatever the umask
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise UnsafeFile(f"file grew beyond {max_bytes} bytes while being copied")
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
    except BaseException:
        os.close(out)
        os.unlink(dst)
        raise
    os.close(out)


def _private_dir(path: str) -> bool:
    """Only we can add, remove or rename entries of `path` (so a file checked there stays the file renamed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _take(src: str, dst: str, *, move: bool) -> None:
    """Put the file `src` at `dst` (in our staging dir): renamed if move and it is ours in a private directory,
    else copied from a checked descriptor; ours and 0644/0755 either way."""
    fd = _open_checked(src, owner=None, max_bytes=None)
    try:
        st = os.fstat(fd)
        moved = False
        if move and st.st_uid == os.geteuid() and _private_dir(os.path.dirname(os.path.abspath(src))):
            try:
                os.rename(src, dst)
                moved = True
            except OSError:  # another filesystem
                moved = False
            if moved:
                got = os.lstat(dst)
                if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):  # cannot happen in a private dir
                    os.unlink(dst)
                    raise UnsafeFile(f"refusing {src}: it changed while being published")
        if not moved:
            _copy_fd(fd, dst, None, 0o755 if st.st_mode & 0o111 else 0o644)
    finally:
        os.close(fd)
    _own(dst)


def _own(path: str) -> None:
    """Make a published file ours and read-only for others."""
    if os.geteuid() == 0:
        os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, 0o755 if os.access(path, os.X_OK) or path.endswith(".so") else 0o644)
