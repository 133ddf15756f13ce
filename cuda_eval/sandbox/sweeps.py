"""What a sandbox uid may leave behind and how it is found and removed: the world-writable directories (found once
per process) and its files there, its SysV IPC objects and POSIX message queues, its processes."""
from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import threading

_lock = threading.Lock()


# World-writable places always swept; world_writable_dirs() adds the ones found on this machine.
WORLD_WRITABLE_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")


# Where world_writable_dirs() looks (and how deep): /run/lock, /var/lock, /dev/mqueue, /var/crash, /var/lib/php/...
_SCAN_ROOTS: tuple[tuple[str, int], ...] = (("/", 2), ("/var/lib", 2), ("/var/spool", 2), ("/var/cache", 2),
                                            ("/usr/local", 2))
_SCAN_SKIP = ("/proc", "/sys")


# How deep the sweep follows world-writable dirs that the uid does not own (it removes whole trees it owns).
_SWEEP_DEPTH = 8
_ww_dirs: list[tuple[str, ...]] = []


def world_writable_dirs() -> tuple[str, ...]:
    """Directories any uid may create entries in (o+w, sticky or not), found once per process: WORLD_WRITABLE_DIRS
    plus what a bounded scan of _SCAN_ROOTS finds (/run/lock, /var/crash, ...), symlinks resolved."""
    with _lock:
        if _ww_dirs:
            return _ww_dirs[0]
    found = [os.path.realpath(d) for d in WORLD_WRITABLE_DIRS if os.path.isdir(d)]
    for root, depth in _SCAN_ROOTS:
        level = [root]
        for i in range(depth + 1):
            nxt = []
            for d in level:
                try:
                    st = os.lstat(d)
                except OSError:
                    continue
                if not stat.S_ISDIR(st.st_mode) or d in _SCAN_SKIP:
                    continue
                if st.st_mode & stat.S_IWOTH:
                    found.append(d)
                if i < depth:
                    try:
                        nxt += [e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
                    except OSError:
                        pass
            level = nxt
    dirs = tuple(dict.fromkeys(found))
    with _lock:
        _ww_dirs[:] = [dirs]
    return dirs


def _open_dir(name: str, dir_fd: int | None) -> int | None:
    """An fd for the directory `name` (relative to dir_fd) that refuses symlinks: a concurrent sandbox swapping a dir
    for a link cannot send a sweep or a quota scan elsewhere."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None


def _sweep_world_writable(uid: int) -> None:
    """Remove what `uid` left in the world-writable dirs: entries it owns (whole trees), also inside world-writable
    subdirs that others own (a dir another sandbox made 0777)."""
    for d in world_writable_dirs():
        fd = _open_dir(d, None)
        if fd is not None:
            try:
                _sweep_dir(fd, uid, 0)
            finally:
                os.close(fd)


def _sweep_dir(dir_fd: int, uid: int, depth: int) -> None:
    try:
        names = [e.name for e in os.scandir(dir_fd)]
    except OSError:
        return
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid:
            if not stat.S_ISDIR(st.st_mode):
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except OSError:
                    pass
                continue
            try:
                shutil.rmtree(name, dir_fd=dir_fd)
            except (OSError, RecursionError):
                # Python's rmtree recurses (and holds an fd per level): a deep tree needs rm, which does not.
                subprocess.run(["rm", "-rf", "--one-file-system", "--", f"/proc/self/fd/{dir_fd}/{name}"],
                               pass_fds=(dir_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and depth < _SWEEP_DEPTH:
            sub = _open_dir(name, dir_fd)
            if sub is not None:
                try:
                    _sweep_dir(sub, uid, depth + 1)
                finally:
                    os.close(sub)


_libc: list = []


def _sysv_ipc(kind: str, uid: int) -> list[dict[str, int]]:
    """Rows of /proc/sysvipc/<kind> (shm, sem, msg) created by or owned by `uid`."""
    try:
        with open(f"/proc/sysvipc/{kind}") as f:
            header = f.readline().split()
            rows = [dict(zip(header, map(int, line.split()))) for line in f if line.strip()]
    except (OSError, ValueError):
        return []
    return [r for r in rows if uid in (r.get("uid"), r.get("cuid"))]


def _remove_sysv_ipc(uid: int) -> None:
    """SysV shared memory, semaphores and message queues outlive their creator (and hold memory): remove the uid's."""
    rows = {kind: _sysv_ipc(kind, uid) for kind in ("shm", "sem", "msg")}
    if not any(rows.values()):
        return
    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    libc, ipc_rmid = _libc[0], 0
    for r in rows["shm"]:
        libc.shmctl(r["shmid"], ipc_rmid, None)
    for r in rows["sem"]:
        libc.semctl(r["semid"], 0, ipc_rmid)
    for r in rows["msg"]:
        libc.msgctl(r["msqid"], ipc_rmid, None)


def _mqueue_mounts() -> list[str]:
    """Mount points of the POSIX message queue filesystem of our IPC namespace (/dev/mqueue where mounted)."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["mqueue"]:
                    out.append(left.split()[4])
    except (OSError, IndexError):
        pass
    return list(dict.fromkeys(out))


def _remove_mqueues(uid: int) -> None:
    """POSIX message queues outlive their creator like SysV IPC: where the uid had no IPC namespace of its own and
    one was made before RLIMIT_MSGQUEUE stopped it (or by another route), remove the uid's where they are visible."""
    for d in _mqueue_mounts():
        fd = _open_dir(d, None)
        if fd is None:
            continue
        try:
            for e in os.scandir(fd):
                try:
                    if os.stat(e.name, dir_fd=fd, follow_symlinks=False).st_uid == uid:
                        os.unlink(e.name, dir_fd=fd)
                except OSError:
                    pass
        finally:
            os.close(fd)


def _uid_pids(uid: int) -> list[int]:
    out = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                if e.stat(follow_symlinks=False).st_uid == uid:
                    out.append(int(e.name))
            except OSError:
                pass
    return out


def _session_pids(leaders: set[int]) -> list[int]:
    """Our-uid processes whose session is one of `leaders` (each sandboxed process leads a session of its own)."""
    out = []
    me = os.getuid()
    for pid in _uid_pids(me):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            if int(fields[3]) in leaders:
                out.append(pid)
        except (OSError, ValueError, IndexError):
            pass
    return out
