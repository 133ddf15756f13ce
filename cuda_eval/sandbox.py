"""Python face of the native sandboxed runner (cuda_eval._native.run / spawn).

What a sandboxed process gets:
- its own session and process group, rlimits (`SandboxLimits`), a wall-clock timeout after which the whole group is
  killed, stdout/stderr captured up to a byte cap, stdin from a pipe (closed at once by run() unless given);
- an environment built from an allow-list (`DEFAULT_ENV_ALLOW`) plus HOME/TMPDIR = its work dir, the directory that
  holds this package on PYTHONPATH, and whatever the caller adds (`extra_env`);
- when we run as root (the GPU machine, CI): a dedicated unprivileged uid/gid leased for the process' lifetime
  (`uid_base + slot`, no /etc/passwd entry needed; leases are flock'ed files, so concurrent evaluators on one machine
  never share a uid). RLIMIT_NPROC is then enforced (it is not for root: a fork bomb would take the machine down),
  the uid cannot write anywhere but its work dir and the world-writable dirs (`world_writable_dirs()`: /tmp,
  /var/tmp, /dev/shm, /run/lock, ... found at first use; swept of its files when its lease ends), "kill every process
  of this uid" also ends setsid'ed escapees, and it gets an empty network namespace (no network, not even loopback)
  when the kernel lets us create one. What the uid cannot read (an interpreter under /root, a clone in a private
  folder with its .venv) is staged for it (sandbox_runtime.py). Fail closed: if a dedicated uid still cannot be used,
  or CUDA_EVAL_SANDBOX_IDENTITY=same is asked for, nothing runs (`SandboxUnavailable`); candidates never run as root;
- when we are not root: our own uid, RLIMIT_NPROC = our current task count + `limits.processes`. The boundary is then
  weaker: the candidate can read and write whatever we can, signal our processes, reach the network, and processes it
  setsid's away from its group are not swept;
- a disk quota per session (`SandboxLimits.disk_bytes`): a watchdog thread adds up the session's work dir, the uid's
  files in the world-writable dirs, files its processes hold open after deleting them and its SysV shared memory,
  and kills the session's processes when the total passes the quota (the result then has disk_quota_exceeded=True).

Results are dicts with the keys of the native runner (exit_code, signal, timed_out, wall_s, cpu_s, peak_rss_bytes,
stdout, stderr, stdout_truncated, stderr_truncated) plus `uid` (None = ours), `workdir` and `disk_quota_exceeded`.
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import logging
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cuda_eval import _native
from cuda_eval import sandbox_runtime
from cuda_eval.sandbox_runtime import RuntimeView, runtime_view, why_unreadable

log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """Sandboxed processes cannot be started safely here (we are root and no dedicated sandbox uid can be used, or
    running candidates as root was asked for). The message says what is wrong and how to fix it."""


# Environment variables passed through from our environment when set (everything else is dropped).
DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_HOME", "CUDA_PATH", "CUDA_MODULE_LOADING", "LD_LIBRARY_PATH",
    "VIRTUAL_ENV", "CONDA_PREFIX",
)
# World-writable places always swept; world_writable_dirs() adds the ones found on this machine.
WORLD_WRITABLE_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")
# Where world_writable_dirs() looks (and how deep): /run/lock, /var/lock, /dev/mqueue, /var/crash, /var/lib/php/...
_SCAN_ROOTS: tuple[tuple[str, int], ...] = (("/", 2), ("/var/lib", 2), ("/var/spool", 2), ("/var/cache", 2),
                                            ("/usr/local", 2))
_SCAN_SKIP = ("/proc", "/sys")
# How deep the sweep follows world-writable dirs that the uid does not own (it removes whole trees it owns).
_SWEEP_DEPTH = 8
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed process. None = inherit ours (disk_bytes: None = no quota)."""
    address_space_bytes: int | None = 16 << 30  # RLIMIT_AS: a 100 GB allocation fails instead of swapping the host
    cpu_seconds: int | None = 600               # RLIMIT_CPU: CPU time of each process (SIGXCPU, then SIGKILL)
    open_files: int | None = 1024               # RLIMIT_NOFILE
    file_size_bytes: int | None = 1 << 30       # RLIMIT_FSIZE: largest file it may write
    processes: int | None = 512                 # RLIMIT_NPROC: tasks (threads count!) of its uid
    wall_timeout_s: float = 120.0               # the whole process group is killed after this
    output_cap_bytes: int = 1 << 20             # per stream; the rest is read and dropped
    data_bytes: int | None = None               # RLIMIT_DATA: an alternative memory cap that CUDA tolerates
    disk_bytes: int | None = 8 << 30            # all files of the session (work dir + its files in the temp dirs)
    nice: int = 0                               # CPU priority (0..19): compiles run at 10, so that the host threads
                                                # of a GPU job keep their cores (docs/EVALUATOR.md, "Timing")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None and v < 0:
                raise ValueError(f"SandboxLimits.{f.name} must be >= 0 or None, got {v}")
        if self.wall_timeout_s <= 0:
            raise ValueError(f"SandboxLimits.wall_timeout_s must be > 0, got {self.wall_timeout_s}")

    def rlimits(self, *, processes: int | None = None) -> dict[str, int | None]:
        return {"address_space_bytes": self.address_space_bytes, "data_bytes": self.data_bytes,
                "cpu_seconds": self.cpu_seconds, "open_files": self.open_files,
                "file_size_bytes": self.file_size_bytes,
                "processes": self.processes if processes is None else processes}


# --- identities -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class IdentityConfig:
    """How sandboxed processes get their uid. `mode`: "auto" (a dedicated uid when root, else ours), "dedicated" (a
    dedicated uid, or SandboxUnavailable when not root), "same" (ours; refused as root: candidates would be root)."""
    mode: str = os.environ.get("CUDA_EVAL_SANDBOX_IDENTITY", "auto")
    uid_base: int = int(os.environ.get("CUDA_EVAL_SANDBOX_UID_BASE", "60000"))
    slots: int = int(os.environ.get("CUDA_EVAL_SANDBOX_UID_SLOTS", "1000"))
    lock_dir: str = os.environ.get("CUDA_EVAL_SANDBOX_LOCK_DIR", "/tmp/cuda_eval_sandbox_uids")


IDENTITY = IdentityConfig()
_identity_lock = threading.Lock()
_probe_result: list = []  # [None (ok) or why not], once per process: all slot uids see the same permissions
_netns_result: list = []  # [None (a network namespace works) or why not], once per process


class _Lease:
    """One leased uid/gid: an flock on <lock_dir>/<uid>.lock held while a sandboxed process uses the uid."""

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
    """Everything a uid may leave behind: its processes, its files in the world-writable dirs, its SysV IPC."""
    _native.kill_uid(uid)
    _sweep_world_writable(uid)
    _remove_sysv_ipc(uid)


def _own_private_dir(path: str) -> None:
    """Create `path` (0700) or accept it only if it is ours and nobody else can write to it: a lock dir that a
    sandboxed process created first would let it break the leases."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SandboxUnavailable(f"{path} must be a directory owned by uid {os.geteuid()} and writable only by it "
                                 "(it holds the sandbox uid leases); remove it or set CUDA_EVAL_SANDBOX_LOCK_DIR")


def _lease_uid() -> _Lease:
    cfg = IDENTITY
    _own_private_dir(cfg.lock_dir)
    start = random.randrange(cfg.slots)
    for _ in range(2):
        for i in range(cfg.slots):
            uid = cfg.uid_base + (start + i) % cfg.slots
            fd = os.open(os.path.join(cfg.lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue
                raise
            # A previous owner may have crashed and left processes or files behind.
            try:
                _clean_uid(uid)
            except BaseException:
                os.close(fd)
                raise
            return _Lease(uid, fd)
        time.sleep(0.05)
    raise RuntimeError(f"all {cfg.slots} sandbox uids ({cfg.uid_base}..) are in use; raise "
                       "CUDA_EVAL_SANDBOX_UID_SLOTS")


_PROBE = """\
import importlib.util, os, sys
bad = []
for arg in sys.argv[1:]:
    name, _, expected = arg.partition('=')
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not os.access(spec.origin, os.R_OK):
        bad.append(name + ' is not importable')
        continue
    where = os.path.realpath(os.path.dirname(spec.origin))
    if where != os.path.realpath(expected):
        bad.append(f'{name} resolves to {where}, not {expected}')
    elif name == 'torch':
        lib = os.path.join(where, 'lib')
        if os.path.isdir(lib) and not all(os.access(os.path.join(lib, f), os.R_OK) for f in os.listdir(lib)):
            bad.append('torch/lib is not readable')
import cuda_eval._native
sys.stdout.write('; '.join(bad))
"""


def _expected_modules(view: RuntimeView) -> list[str]:
    """name=directory the sandbox must import it from: this package (or its staged copy) and torch if we have it."""
    import importlib.util
    out = [f"cuda_eval={view.map_path(sandbox_runtime.PACKAGE_DIR)}"]
    spec = importlib.util.find_spec("torch")  # finds, does not import
    if spec is not None and spec.origin:
        out.append(f"torch={view.map_path(os.path.dirname(spec.origin))}")
    return out


def _probe_uid(uid: int, view: RuntimeView) -> str | None:
    """None if `uid` can run the (staged) interpreter and import this package (with its native module) and torch
    from where we expect; else why not."""
    with _identity_lock:
        if _probe_result:
            return _probe_result[0]
    env = _base_env("/", DEFAULT_ENV_ALLOW, {}, view)
    try:
        res = _native.run([view.python, "-c", _PROBE, *_expected_modules(view)], env=env, cwd="/", timeout_s=120,
                          limits={}, output_cap_bytes=1 << 16, uid=uid, gid=uid)
        if res["exit_code"] != 0:
            why = f"{view.python} failed as uid {uid}: " + res["stderr"].decode(errors="replace").strip()[-600:]
        elif res["stdout"].strip():
            why = f"as uid {uid}: {res['stdout'].decode(errors='replace')}"
        else:
            why = None
    except RuntimeError as e:
        why = f"cannot run {view.python} as uid {uid}: {e}"
    with _identity_lock:
        _probe_result[:] = [why]
    return why


def _probe_netns(uid: int) -> str | None:
    """None if a sandboxed process can get a network namespace of its own (needs CAP_SYS_ADMIN); else why not."""
    with _identity_lock:
        if _netns_result:
            return _netns_result[0]
    try:
        res = _native.run(["true"], env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout_s=30, limits={},
                          output_cap_bytes=4096, uid=uid, gid=uid, new_netns=True)
        why = None if res["exit_code"] == 0 else f"`true` in a new network namespace exited with {res['exit_code']}"
    except RuntimeError as e:
        why = str(e)
    with _identity_lock:
        first = not _netns_result
        _netns_result[:] = [why]
    if why and first:
        log.warning("sandboxed processes keep the host's network: a network namespace cannot be created (%s)", why)
    return why


def _unavailable(why: str) -> SandboxUnavailable:
    """The error for a root evaluator whose dedicated sandbox uid cannot be used: what is wrong, how to fix it."""
    import importlib.util
    paths = [os.path.realpath(sys.executable), sys.prefix, sandbox_runtime.PACKAGE_DIR]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        paths.append(os.path.dirname(spec.origin))
    unreadable = [w for w in dict.fromkeys(why_unreadable(p) for p in paths) if w]
    return SandboxUnavailable(
        f"refusing to run sandboxed candidates: we are root and a dedicated sandbox uid cannot be used: {why}. "
        + (f"Not readable by other users (so staged into {sandbox_runtime.RUNTIME_DIR}): {'; '.join(unreadable)}. "
           if unreadable else "")
        + "Fix one of: set CUDA_EVAL_SANDBOX_RUNTIME_DIR to a directory every user can reach (o+x on each "
        "ancestor) on a filesystem mounted without noexec, where we can write; or make the paths above readable "
        "by other users (chmod o+rx on the directories named); or run the evaluator as an unprivileged user "
        "(weaker isolation). Candidates are never run as root.")


def _acquire_identity() -> _Lease | None:
    """A dedicated uid lease, or None (run as ourselves: only when we are not root), following IDENTITY.mode."""
    mode = IDENTITY.mode
    if mode not in ("auto", "dedicated", "same"):
        raise ValueError(f"CUDA_EVAL_SANDBOX_IDENTITY must be auto|dedicated|same, got {mode!r}")
    if os.geteuid() != 0:
        if mode == "dedicated":
            raise SandboxUnavailable("CUDA_EVAL_SANDBOX_IDENTITY=dedicated needs root (to switch to the sandbox "
                                     "uids); unset it to run candidates as our own uid")
        return None
    if mode == "same":
        raise SandboxUnavailable("CUDA_EVAL_SANDBOX_IDENTITY=same is refused as root: candidates would run as "
                                 "root. Unset it (dedicated sandbox uids) or run the evaluator as an unprivileged "
                                 "user")
    lease = _lease_uid()
    try:
        lease.view = runtime_view()
        why = _probe_uid(lease.uid, lease.view)
    except (OSError, RuntimeError) as e:
        why = f"the runtime could not be staged for it: {e}"
    except BaseException:
        lease.release()
        raise
    if why is None:
        return lease
    lease.release()
    raise _unavailable(why)


def identity_mode() -> str:
    """"dedicated" if sandboxed processes run under leased uids, "same" (ours) when we are not root. Raises
    SandboxUnavailable as root when no dedicated uid can be used (nothing would run)."""
    lease = _acquire_identity()
    if lease is None:
        return "same"
    lease.release()
    return "dedicated"


def isolation() -> dict[str, Any]:
    """What sandboxed processes get here, for logs and docs: identity ("dedicated" | "same"), uid range, network
    ("isolated": an empty namespace | "shared": the host's), why the network is shared, what was staged for the
    uid, the swept world-writable dirs and the default disk quota. Raises SandboxUnavailable like identity_mode()."""
    lease = _acquire_identity()
    try:
        if lease is None:
            net_why = "not root: a network namespace needs CAP_SYS_ADMIN"
        else:
            net_why = _probe_netns(lease.uid)
        cfg = IDENTITY
        return {"identity": "same" if lease is None else "dedicated",
                "uid_range": None if lease is None else [cfg.uid_base, cfg.uid_base + cfg.slots - 1],
                "network": "shared" if net_why else "isolated", "network_note": net_why,
                "staged": [] if lease is None else list(lease.view.staged),
                "world_writable_dirs": list(world_writable_dirs()),
                "disk_quota_bytes": SandboxLimits().disk_bytes}
    finally:
        if lease is not None:
            lease.release()


# --- world-writable dirs: discovery, sweep -------------------------------------------------------------------------
_ww_dirs: list[tuple[str, ...]] = []


def world_writable_dirs() -> tuple[str, ...]:
    """Directories any uid may create entries in (o+w, sticky or not), found once per process: WORLD_WRITABLE_DIRS
    plus what a bounded scan of _SCAN_ROOTS finds (/run/lock, /var/crash, ...), symlinks resolved."""
    with _identity_lock:
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
    with _identity_lock:
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


# --- disk quota -----------------------------------------------------------------------------------------------
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


# --- environment and work dir ---------------------------------------------------------------------------------
def _base_env(workdir: str, env_allow: Iterable[str], extra_env: Mapping[str, str],
              view: RuntimeView | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in env_allow if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # The interpreter's directory first, so that "python" in the sandbox is the one running us (or its staged copy).
    py_dir = os.path.dirname(sys.executable if view is None else view.python)
    if py_dir not in env["PATH"].split(os.pathsep):
        env["PATH"] = py_dir + os.pathsep + env["PATH"]
    # Sandbox uids have no passwd entry: getpass.getuser() (torch._dynamo's import calls it for its cache dir)
    # raises KeyError unless USER/LOGNAME name someone; and torch's caches belong in the confined work dir.
    env.update(HOME=workdir, TMPDIR=workdir, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               LANG=env.get("LANG", "C.UTF-8"), USER="cuda_eval_sandbox", LOGNAME="cuda_eval_sandbox",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(workdir, ".torchinductor"))
    pythonpath = [PACKAGE_PARENT]
    for k, v in extra_env.items():
        if k == "PYTHONPATH":
            pythonpath = [p for p in v.split(os.pathsep) if p] + pythonpath
        else:
            env[k] = str(v)
    if view is not None:
        pythonpath = [view.map_path(p) for p in pythonpath]
        for k, v in view.env:
            if k == "PYTHONPATH":
                pythonpath.insert(0, v)
            else:
                env[k] = v + (os.pathsep + env[k] if env.get(k) else "")
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pythonpath))
    return env


def _count_own_tasks(uid: int) -> int:
    """Tasks (threads) of `uid`: what RLIMIT_NPROC counts."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                text = f.read()
        except OSError:
            continue
        uid_line = threads = None
        for line in text.splitlines():
            if line.startswith("Uid:"):
                uid_line = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        if uid_line == uid and threads:
            total += threads
    return total


def prepare_workdir(workdir: str, lease: _Lease | None) -> None:
    """Create `workdir` if needed and hand it (and its top-level entries) to the sandbox uid."""
    os.makedirs(workdir, exist_ok=True)
    if lease is None:
        return
    os.chown(workdir, lease.uid, lease.gid)
    os.chmod(workdir, 0o700)
    for entry in os.scandir(workdir):
        os.chown(entry.path, lease.uid, lease.gid, follow_symlinks=False)
    # The uid must be able to reach the dir: every ancestor needs o+x.
    parent = os.path.dirname(os.path.abspath(workdir))
    while parent and parent != "/":
        mode = os.stat(parent).st_mode
        if not mode & stat.S_IXOTH:
            raise PermissionError(f"sandbox uid {lease.uid} cannot reach {workdir}: {parent} lacks o+x "
                                  "(use a work root like /tmp)")
        parent = os.path.dirname(parent)


def _our_python_names() -> set[str]:
    v = sys.version_info
    return {sys.executable, os.path.realpath(sys.executable), "python", "python3", f"python{v.major}.{v.minor}"}


def _map_in(arg: str, view: RuntimeView) -> str:
    """Rewrite real paths that the sandbox uid cannot read (anywhere inside one argument, e.g. -I<path>)."""
    for real, staged in view.path_map:
        if real in arg:
            arg = arg.replace(real, staged)
    return arg


class SessionProcess:
    """A process started by SandboxSession.spawn: the native process plus the session's bookkeeping (its result
    dict also has uid, workdir and disk_quota_exceeded)."""

    def __init__(self, process, session: SandboxSession, disk_bytes: int | None):
        self._process, self._session, self.disk_bytes = process, session, disk_bytes
        self.quota_killed = False
        self._result: dict | None = None

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.alive

    def write_stdin(self, data: bytes, timeout_s: float = 30.0) -> None:
        self._process.write_stdin(data, timeout_s)

    def close_stdin(self) -> None:
        self._process.close_stdin()

    def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        if self._result is None:
            res = dict(self._process.wait(timeout_s))
            self._session._forget(self)
            res.update(uid=self._session.uid, workdir=self._session.workdir, disk_quota_exceeded=self.quota_killed)
            self._result = res
        return self._result

    def poll(self) -> dict[str, Any] | None:
        return self.wait(0.0) if self._result is not None or not self._process.alive else None

    def kill(self) -> None:
        if self._result is None:
            self._process.kill()


class SandboxSession:
    """One sandbox identity (leased uid, or ours) and work dir for one or more processes, possibly concurrent (the
    phases of one build). Processes are swept by uid only when the session closes, so concurrent ones do not kill
    each other; each process' own group is still killed when it ends or times out. The disk quota (the smallest
    `disk_bytes` of the running processes' limits) covers the whole session."""

    _closed = False

    def __init__(self, workdir: str, *, env_allow: Iterable[str] = DEFAULT_ENV_ALLOW,
                 extra_env: Mapping[str, str] | None = None):
        self.workdir = os.path.abspath(workdir)
        self._env_allow, self._extra_env = tuple(env_allow), dict(extra_env or {})
        self._lock = threading.Lock()
        self._active: dict[int, SessionProcess] = {}
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()
        self.disk_quota_exceeded = False
        self.disk_note = ""
        self._lease = _acquire_identity()
        self._new_netns = self._lease is not None and _probe_netns(self._lease.uid) is None
        try:
            prepare_workdir(self.workdir, self._lease)
        except BaseException:
            self.close()
            raise

    @property
    def uid(self) -> int | None:
        return None if self._lease is None else self._lease.uid

    @property
    def view(self) -> RuntimeView | None:
        return None if self._lease is None else self._lease.view

    @property
    def network_isolated(self) -> bool:
        return self._new_netns

    def map_path(self, path: str) -> str:
        """A real path as the sandboxed processes must name it (staged copies for unreadable ones). run/spawn
        apply this to every argument themselves: callers keep real paths (e.g. in cache keys)."""
        return path if self.view is None else _map_in(path, self.view)

    def _kwargs(self, argv: Sequence[str], limits: SandboxLimits, cwd: str | None,
                extra_env: Mapping[str, str] | None):
        if not argv:
            raise ValueError("argv must not be empty")
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
        if self._closed:
            raise RuntimeError("the sandbox session is closed")
        view = self.view
        env = _base_env(self.workdir, self._env_allow, {**self._extra_env, **(extra_env or {})}, view)
        argv = list(argv)
        if view is not None:
            # The sandbox uid may not be able to run our interpreter or read our paths: use the staged copies.
            if argv[0] in _our_python_names():
                argv[0] = view.python
            argv = [_map_in(a, view) for a in argv]
        processes = limits.processes
        if self._lease is None and processes is not None and os.geteuid() != 0:
            processes = _count_own_tasks(os.getuid()) + processes
        return argv, dict(env=env, cwd=os.path.abspath(cwd or self.workdir),
                          limits=limits.rlimits(processes=processes), output_cap_bytes=limits.output_cap_bytes,
                          uid=self.uid, gid=self.uid, sweep_uid=False, new_netns=self._new_netns,
                          nice=min(19, limits.nice))

    def run(self, argv: Sequence[str], limits: SandboxLimits, *, stdin: bytes | None = None, cwd: str | None = None,
            extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Run one process to completion (GIL released while waiting). See run_sandboxed."""
        # this thread waits for the process, so it may die with it
        proc = self.spawn(argv, limits, cwd=cwd, extra_env=extra_env, die_with_parent_thread=True)
        if stdin:
            try:
                proc.write_stdin(stdin, limits.wall_timeout_s)
            except RuntimeError:  # it stopped reading or exited: its result says why
                pass
        proc.close_stdin()
        return proc.wait(None)

    def spawn(self, argv: Sequence[str], limits: SandboxLimits, *, stdin: bytes | None = None,
              cwd: str | None = None, extra_env: Mapping[str, str] | None = None,
              die_with_parent_thread: bool = False, pass_fds: Sequence[int] = ()) -> SessionProcess:
        """Start one process and return at once (stdin is a pipe). The lifetime cap and the waits are enforced by
        this process, so a child whose parent is killed would run on unwatched: die_with_parent_thread=True has the
        kernel kill it when the calling thread ends (the whole process dying included). Only for a caller whose
        thread outlives the child (it waits for it, or kills it, before it ends). pass_fds: our descriptors, handed
        over as the child's fds 3, 4, ... in order (every other descriptor is closed in the child)."""
        argv, kwargs = self._kwargs(argv, limits, cwd, extra_env)
        native = _native.spawn(argv, timeout_s=limits.wall_timeout_s, stdin=stdin,
                               die_with_parent_thread=die_with_parent_thread, pass_fds=list(pass_fds), **kwargs)
        proc = SessionProcess(native, self, limits.disk_bytes)
        with self._lock:
            self._active[id(proc)] = proc
            if limits.disk_bytes is not None and self._watch is None and not self._closed:
                self._watch = threading.Thread(target=self._watch_disk, daemon=True, name="cuda_eval-disk-quota")
                self._watch.start()
        return proc

    def _forget(self, proc: SessionProcess) -> None:
        with self._lock:
            self._active.pop(id(proc), None)

    # --- the disk quota watchdog -----------------------------------------------------------------------------
    def _watch_disk(self) -> None:
        polls, proc_bytes = 0, 0
        while not self._stop.is_set():
            with self._lock:
                quotas = [p.disk_bytes for p in self._active.values() if p.disk_bytes is not None]
                if not quotas or self._closed:
                    self._watch = None
                    return
            t0 = time.monotonic()
            usage = _DiskUsage(min(quotas))
            try:
                if polls % _PROC_EVERY == 0:
                    usage.open_deleted(self._pids())
                    if self._lease is not None:
                        usage.sysv_shm(self._lease.uid)
                    proc_bytes = usage.total
                else:
                    usage.total = proc_bytes
                usage.tree(self.workdir)
                if self._lease is not None:
                    for d in world_writable_dirs():
                        if not usage.over:
                            usage.owned_in(d, self._lease.uid)
            except Exception:  # a scan must never take the evaluator down; the next poll tries again
                log.exception("disk quota scan of %s failed", self.workdir)
            polls += 1
            if usage.over:
                self._quota_kill(usage)
            # Bound our own cost: a huge tree is scanned less often.
            self._stop.wait(max(_DISK_POLL_S, 2 * (time.monotonic() - t0)))

    def _pids(self) -> list[int]:
        if self._lease is not None:
            return _uid_pids(self._lease.uid)
        with self._lock:
            leaders = {p.pid for p in self._active.values()}
        return _session_pids(leaders)

    def _quota_kill(self, usage: _DiskUsage) -> None:
        with self._lock:
            if self._closed:  # the uid may be someone else's by now
                return
            procs = list(self._active.values())
            self.disk_quota_exceeded = True
            self.disk_note = usage.note or f"{usage.total} bytes > {usage.limit}"
            for p in procs:
                p.quota_killed = True
            if self._lease is not None:
                _native.kill_uid(self._lease.uid)
            for p in procs:
                p.kill()

    def close(self) -> None:
        """Kill every process left under the session's uid and sweep its files from the world-writable dirs."""
        with self._lock:
            self._closed = True
            watch = self._watch
        self._stop.set()
        if watch is not None and watch is not threading.current_thread():
            watch.join()
        if self._lease is not None:
            lease, self._lease = self._lease, None
            lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_sandboxed(argv: Sequence[str], workdir: str, limits: SandboxLimits,
                  env_allow: Iterable[str] = DEFAULT_ENV_ALLOW, extra_env: Mapping[str, str] | None = None,
                  stdin: bytes | None = None) -> dict[str, Any]:
    """Run `argv` in `workdir` (created if missing) under `limits`; blocks (GIL released) until it ends or
    limits.wall_timeout_s passes. Never raises for anything the program does; raises for bad arguments or when the
    program cannot be started at all (not found, not executable by the sandbox uid; SandboxUnavailable)."""
    with SandboxSession(workdir, env_allow=env_allow, extra_env=extra_env) as session:
        return session.run(argv, limits, stdin=stdin)


class SandboxedProcess:
    """A running sandboxed process (see spawn_sandboxed). The uid lease ends when wait() returns or on
    kill() + wait()."""

    def __init__(self, process: SessionProcess, session: SandboxSession):
        self._process, self._session, self.workdir = process, session, session.workdir
        self._uid = session.uid
        self._result: dict | None = None

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.alive

    @property
    def uid(self) -> int | None:
        return self._uid

    def write_stdin(self, data: bytes, timeout_s: float = 30.0) -> None:
        self._process.write_stdin(data, timeout_s)

    def close_stdin(self) -> None:
        self._process.close_stdin()

    def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the exit; at timeout_s (None: no per-wait limit) kill the group and report timed_out."""
        if self._result is None:
            res = dict(self._process.wait(timeout_s))
            self._session.close()  # the uid sweep: escaped (setsid'ed) descendants die here
            res.update(uid=self._uid, workdir=self.workdir)
            self._result = res
        return self._result

    def poll(self) -> dict[str, Any] | None:
        return self.wait(0.0) if self._result is not None or not self._process.alive else None

    def kill(self) -> None:
        if self._result is None:  # after wait() the uid may belong to another sandbox already
            self._process.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._result is None:
            self.kill()
            self.wait(10.0)


def spawn_sandboxed(argv: Sequence[str], workdir: str, limits: SandboxLimits,
                    env_allow: Iterable[str] = DEFAULT_ENV_ALLOW, extra_env: Mapping[str, str] | None = None,
                    stdin: bytes | None = None, die_with_parent_thread: bool = False,
                    pass_fds: Sequence[int] = ()) -> SandboxedProcess:
    """Start `argv` sandboxed and return at once; stdin is a pipe (write_stdin / close_stdin).
    limits.wall_timeout_s caps the whole lifetime; wait(timeout_s) adds a per-wait limit; die_with_parent_thread
    and pass_fds: see SandboxSession.spawn."""
    session = SandboxSession(workdir, env_allow=env_allow, extra_env=extra_env)
    try:
        process = session.spawn(argv, limits, stdin=stdin, die_with_parent_thread=die_with_parent_thread,
                                pass_fds=pass_fds)
    except BaseException:
        session.close()
        raise
    return SandboxedProcess(process, session)


def describe(res: Mapping[str, Any], limits: SandboxLimits | None = None) -> str:
    """One line saying how a sandboxed process ended (for logs and verdicts)."""
    if res.get("disk_quota_exceeded"):
        what = "killed: over the disk quota" + (f" ({limits.disk_bytes / 2**30:g} GiB)"
                                                if limits and limits.disk_bytes is not None else "")
    elif res.get("timed_out"):
        what = "timed out" + (f" after {limits.wall_timeout_s:g} s" if limits else "") + " and was killed"
    elif res.get("signal"):
        sig = res["signal"]
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        what = f"killed by {name}"
        if name == "SIGXCPU" or (name == "SIGKILL" and limits and limits.cpu_seconds
                                 and res.get("cpu_s", 0) >= limits.cpu_seconds):
            what += " (CPU time limit)"
    else:
        what = f"exited with code {res.get('exit_code')}"
    return f"{what} (wall {res.get('wall_s', 0):.1f} s, cpu {res.get('cpu_s', 0):.1f} s, " \
           f"peak RSS {res.get('peak_rss_bytes', 0) / 2**20:.0f} MiB)"
