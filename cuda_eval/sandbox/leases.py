"""Dedicated sandbox uids as root: a lease is an flock'ed file in one root-owned directory for the machine
(LEASE_DIR), so concurrent evaluators never share a uid; a uid with an account in the user database, or (the first
time since boot) with someone else's process, file or IPC object, is skipped; a lease's end sweeps what its uid left."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import random
import stat
import time

from cuda_eval import _native
from cuda_eval.sandbox import safe_dirs
from cuda_eval.sandbox.config import IDENTITY, SandboxUnavailable
from cuda_eval.sandbox.runtime import RuntimeView
from cuda_eval.sandbox.sweeps import (_SWEEP_DEPTH, _mqueue_mounts, _open_dir, _remove_mqueues, _remove_sysv_ipc,
                                      _sweep_world_writable, _sysv_ipc, _uid_pids, world_writable_dirs)

log = logging.getLogger(__name__)


# Machine-wide: every evaluator on this host leases its sandbox uids here, whatever else it is configured with
# (/run is root's and cleared at boot; a lease file that is not empty records "leased by cuda_eval since boot").
LEASE_DIR = "/run/cuda_eval/sandbox_uids"
_ACCOUNT_TTL_S = 300.0        # how long a user-database answer is reused
_accounts: dict[int, tuple[float, str | None]] = {}  # uid -> (when looked up, account/group using it or None)
_skip_noted: set[int] = set()


class _Lease:
    """One leased uid/gid: an flock on LEASE_DIR/<uid>.lock held while a sandboxed process uses the uid."""

    def __init__(self, uid: int, fd: int):
        self.uid, self.gid, self._fd = uid, uid, fd
        self.view: RuntimeView | None = None

    def release(self) -> None:
        if self._fd >= 0:
            try:
                _clean_uid(self.uid)
            finally:
                os.close(self._fd)  # closing drops the flock
                self._fd = -1

    def __del__(self):
        if self._fd >= 0:
            try:
                self.release()
            except Exception:  # interpreter shutdown
                pass


def _clean_uid(uid: int) -> None:
    """Everything a uid may leave behind: its processes, its files in the world-writable dirs, its SysV IPC and
    POSIX message queues (where it had no IPC namespace of its own)."""
    _native.kill_uid(uid)
    _sweep_world_writable(uid)
    _remove_sysv_ipc(uid)
    _remove_mqueues(uid)


def _own_private_dir(path: str) -> None:
    """Create `path` (0700) or accept it only if it and every directory above it are safe (safe_dirs): a lease dir
    that a sandboxed process created first would let it break the leases."""
    try:
        safe_dirs.ensure_dir(path, 0o700, what="the sandbox uid lease dir",
                             fix="Remove it or chown it to root (it holds the leases of the sandbox uids)")
    except OSError as e:
        raise SandboxUnavailable(str(e)) from None


def _account_of(uid: int) -> str | None:
    """The user or group that owns `uid` in the system's user database (NSS: files, LDAP, sssd, systemd...), or
    None. A sandbox uid with an account could be someone's: its processes would be killed and its files deleted."""
    now = time.monotonic()
    hit = _accounts.get(uid)
    if hit is not None and now - hit[0] < _ACCOUNT_TTL_S:
        return hit[1]
    import grp
    import pwd
    why = None
    try:
        why = f"user {pwd.getpwuid(uid).pw_name!r}"
    except KeyError:
        try:
            why = f"group {grp.getgrgid(uid).gr_name!r}"  # the sandbox gid is the uid: it would get that group's access
        except KeyError:
            pass
    _accounts[uid] = (now, why)
    return why


def _foreign_use(uid: int) -> str | None:
    """What else uses `uid` (a process, a file in the swept places, an IPC object), or None. Asked of a uid not
    leased by cuda_eval since boot: whatever it finds belongs to someone else and must not be killed or deleted."""
    pids = _uid_pids(uid)
    if pids:
        return f"process {pids[0]} runs as it"
    for kind in ("shm", "sem", "msg"):
        if _sysv_ipc(kind, uid):
            return f"it owns SysV IPC objects ({kind})"
    for d in _mqueue_mounts():
        found = _first_owned(d, uid, 0)
        if found:
            return f"it owns the message queue {found}"
    for d in world_writable_dirs():
        found = _first_owned(d, uid, 0)
        if found:
            return f"it owns {found}"
    return None


def _first_owned(path: str, uid: int, depth: int) -> str | None:
    """The first entry owned by `uid` under `path` (following only world-writable subdirs, like the sweep)."""
    fd = _open_dir(path, None)
    if fd is None:
        return None
    try:
        names = [e.name for e in os.scandir(fd)]
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid == uid:
                return os.path.join(path, name)
            if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and depth < _SWEEP_DEPTH:
                found = _first_owned(os.path.join(path, name), uid, depth + 1)
                if found:
                    return found
    except OSError:
        pass
    finally:
        os.close(fd)
    return None


_LEASED_MARK = b"leased by cuda_eval\n"


def _lease_uid() -> _Lease:
    """A uid of IDENTITY's range that no other evaluator on this machine holds (flock in LEASE_DIR) and that nobody
    else uses: no account or group in the user database; and, the first time it is leased since boot, no process,
    file or IPC object of it (later leases find only what a crashed evaluator of ours left behind, and clean it)."""
    cfg = IDENTITY
    _own_private_dir(LEASE_DIR)
    start = random.randrange(cfg.slots)
    busy, foreign = 0, {}
    for _ in range(2):
        busy, foreign = 0, {}
        for i in range(cfg.slots):
            uid = cfg.uid_base + (start + i) % cfg.slots
            why = _account_of(uid)
            if why:
                foreign[uid] = why
                continue
            fd = os.open(os.path.join(LEASE_DIR, f"{uid}.lock"),
                         os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    busy += 1
                    continue
                raise
            try:
                if os.fstat(fd).st_size:
                    _clean_uid(uid)  # a previous lease of ours may have crashed and left processes or files
                else:
                    why = _foreign_use(uid)
                    if why:
                        os.close(fd)
                        foreign[uid] = why
                        if uid not in _skip_noted:
                            _skip_noted.add(uid)
                            log.warning("sandbox uid %d is skipped: %s (not ours: it is neither killed nor swept)",
                                        uid, why)
                        continue
                    os.pwrite(fd, _LEASED_MARK, 0)
            except BaseException:
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                raise
            return _Lease(uid, fd)
        time.sleep(0.05)
    last = cfg.uid_base + cfg.slots - 1
    examples = "; ".join(f"{u}: {w}" for u, w in list(foreign.items())[:3])
    raise SandboxUnavailable(
        f"no sandbox uid is free in {cfg.uid_base}-{last}: {busy} leased by running evaluators, {len(foreign)} used "
        f"by someone else{' (' + examples + ')' if examples else ''}. Widen or move the range "
        "(EvalConfig.sandbox_uids) to uids that no account, process or file uses")
