"""The disk quota of a sandbox session: what its processes hold (its work dir, its uid's files in the world-writable
dirs, files held open after deleting them, SysV shared memory), counted by a watchdog in runner.SandboxSession."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from cuda_eval.sandbox.sweeps import _SWEEP_DEPTH, _open_dir, _sysv_ipc


DEFAULT_DISK_BYTES = 8 << 30   # SandboxLimits.disk_bytes: all files of a session
_ENTRY_BYTES = 4096   # what one file or directory costs at least (an inode, a block): a million empty files count
_MAX_TREE_DEPTH = 64  # deeper trees count as over the quota (the scan holds an fd per level)
_DISK_POLL_S = 0.25
_PROC_EVERY = 4       # open-deleted files and SysV shm are counted every 4th poll (a /proc walk costs more)


# Files of ours that sandboxed processes hold open without owning them (a job's output buffer, a sealed memfd the
# pool sized and granted): not counted against their disk quota. Keys are (st_dev, st_ino).
_QUOTA_EXEMPT: set[tuple[int, int]] = set()


def exempt_from_disk_quota(fd: int) -> tuple[int, int]:
    """Leave the file open as `fd` out of every session's disk quota until `end_disk_quota_exemption(key)`. Only for
    files the caller made and bounded itself (sealed against growing): a candidate cannot grow what it is handed."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    _QUOTA_EXEMPT.add(key)
    return key


def end_disk_quota_exemption(key: tuple[int, int]) -> None:
    _QUOTA_EXEMPT.discard(key)


class _DiskUsage:
    """Bytes held by one sandbox session, counted until `limit` is passed (then the count stops early)."""

    def __init__(self, limit: int):
        self.limit, self.total, self.note = limit, 0, ""
        self._seen: set[tuple[int, int]] = set()

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def add(self, st: os.stat_result) -> None:
        key = (st.st_dev, st.st_ino)
        if key not in self._seen:  # hard links count once
            self._seen.add(key)
            self.total += st.st_blocks * 512 + _ENTRY_BYTES

    def tree(self, path: str) -> None:
        fd = _open_dir(path, None)
        if fd is not None:
            try:
                self._walk(fd, None, 0)
            finally:
                os.close(fd)

    def owned_in(self, path: str, uid: int) -> None:
        fd = _open_dir(path, None)
        if fd is not None:
            try:
                self._walk(fd, uid, 0)
            finally:
                os.close(fd)

    def _walk(self, dir_fd: int, owner: int | None, depth: int) -> None:
        """Everything under dir_fd (owner None), or only `owner`'s entries (whole trees) and, recursively, what it
        put into world-writable subdirs of others."""
        try:
            names = [e.name for e in os.scandir(dir_fd)]
        except OSError:
            return
        for name in names:
            if self.over:
                return
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            mine = owner is None or st.st_uid == owner
            if mine:
                self.add(st)
            if not stat.S_ISDIR(st.st_mode):
                continue
            if not mine and not (st.st_mode & stat.S_IWOTH and depth < _SWEEP_DEPTH):
                continue
            if depth >= _MAX_TREE_DEPTH:
                self.total, self.note = self.limit + 1, f"a directory tree deeper than {_MAX_TREE_DEPTH} levels"
                return
            sub = _open_dir(name, dir_fd)
            if sub is not None:
                try:
                    self._walk(sub, None if mine else owner, depth + 1)
                finally:
                    os.close(sub)

    def open_deleted(self, pids: Iterable[int]) -> None:
        """Files the processes still hold open after unlinking them (or memfds): invisible to a tree walk."""
        for pid in pids:
            try:
                fds = list(os.scandir(f"/proc/{pid}/fd"))
            except OSError:
                continue
            for e in fds:
                try:
                    st = os.stat(e.path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 0 and (st.st_dev, st.st_ino) not in _QUOTA_EXEMPT:
                    self.add(st)

    def sysv_shm(self, uid: int) -> None:
        for r in _sysv_ipc("shm", uid):
            self.total += r.get("rss", r.get("size", 0)) + r.get("swap", 0)
