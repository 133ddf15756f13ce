"""Python face of the native sandboxed runner (cuda_eval._native.run / spawn).

What every sandboxed process gets:
- its own session and process group, rlimits (`SandboxLimits`), a wall-clock timeout after which the whole group is
  killed, stdout/stderr captured up to a byte cap, stdin from a pipe (closed at once by run() unless given);
- an environment built from an allow-list (`DEFAULT_ENV_ALLOW`) plus HOME/TMPDIR = its work dir, the directory that
  holds this package on PYTHONPATH, and whatever the caller adds (`extra_env`);
- oom_score_adj 1000 (under host memory pressure the kernel kills it before the trainer) and, where the machine
  offers one, a memory cgroup of its own bounded like one of its processes (cgroups.py);
- a disk quota per session (`SandboxLimits.disk_bytes`): a watchdog thread adds up the session's work dir, the uid's
  files in the world-writable dirs, files its processes hold open after deleting them and its SysV shared memory,
  and kills the session's processes when the total passes the quota (the result then has disk_quota_exceeded=True).

Its identity (IdentityConfig, set by `configure()`; `isolation()` reports what is in force):
- as root ("dedicated"): a dedicated unprivileged uid/gid leased for the process' lifetime (a configurable range,
  60000-60999 by default, no /etc/passwd entry needed). Leases are flock'ed files in one root-owned directory for the
  whole machine (LEASE_DIR), so concurrent evaluators never share a uid, and a uid is leased only if the system's
  user database has no user or group with it and, the first time since boot, no process, file or IPC object uses
  it. RLIMIT_NPROC then holds (not for root: a fork bomb would take the machine down), the uid cannot write
  anywhere but its work dir and the world-writable dirs (`world_writable_dirs()`: /tmp, /var/tmp, /dev/shm,
  /run/lock, ... found at first use; swept of its files when its lease ends), "kill every process of this uid" also
  ends setsid'ed escapees, it gets an empty network namespace (no network, not even loopback) and an IPC namespace of
  its own (its SysV IPC and POSIX message queues die with it) when the kernel lets us create them (else message
  queues are refused to it and its IPC objects swept). What the uid cannot read (an interpreter under /root, a clone
  in a private folder with its .venv) is staged for it (sandbox/runtime.py). Fail closed: if a dedicated uid cannot be
  used, nothing runs (`SandboxUnavailable`); candidates never run as root;
- not root ("namespaces", where the kernel gives unprivileged processes user namespaces): our own uid, in new user,
  mount, PID, network and IPC namespaces: every mount read-only except its work dir, a /proc that shows its own
  processes only (ours, the trainer's included, can be neither seen nor signalled), a private /dev/shm, no network.
  It is PID 1 of its namespace, so everything it starts dies with it. It can still read what our uid can read;
- not root, without user namespaces: refused (`SandboxUnavailable`, saying what isolation would be lost) unless the
  user opts in (`allow_unsandboxed`, CUDA_EVAL_ALLOW_UNSANDBOXED=1): then our own uid, RLIMIT_NPROC = our current
  task count + `limits.processes`, and the candidate can read and write whatever we can, signal our processes, reach
  the network, and processes it setsid's away from its group are not swept. Sandboxes started from inside a
  sandboxed process (a worker's run-time build) run as that process, confined by the outer sandbox.

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
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cuda_eval import _native
from cuda_eval.sandbox import cgroups, runtime as sandbox_runtime, safe_dirs
from cuda_eval.sandbox.runtime import RuntimeView, runtime_view, why_unreadable

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
PACKAGE_PARENT = os.path.dirname(sandbox_runtime.PACKAGE_DIR)   # what holds cuda_eval/: on the sandbox's PYTHONPATH


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
DEFAULT_UID_RANGE = (60000, 60999)
# Machine-wide: every evaluator on this host leases its sandbox uids here, whatever else it is configured with
# (/run is root's and cleared at boot; a lease file that is not empty records "leased by cuda_eval since boot").
LEASE_DIR = "/run/cuda_eval/sandbox_uids"
OOM_SCORE_ADJ = 1000          # sandboxed processes are the OOM killer's first pick, never the trainer
SHM_BYTES = 1 << 30           # the private /dev/shm of a process isolated by namespaces (tmpfs: host RAM)
# Set in every sandboxed process' environment: sandboxes started from inside one (a worker's run-time build) run as
# that process' own identity, confined by the outer sandbox.
INSIDE_SANDBOX_ENV = "CUDA_EVAL_INSIDE_SANDBOX"
_ACCOUNT_TTL_S = 300.0        # how long a user-database answer is reused


@dataclasses.dataclass
class IdentityConfig:
    """How sandboxed processes are isolated (process-wide; `configure()` sets it, the Evaluator from EvalConfig).
    `mode`: "auto" (root: "dedicated"; otherwise "namespaces" where the kernel allows it, else refuse unless
    allow_unsandboxed), "dedicated" (a leased uid; needs root), "namespaces" (user, mount, PID, network and IPC
    namespaces; no root needed), "same" (our own uid, no isolation: an explicit opt-in; refused as root).
    uid_base/slots: the range of dedicated uids. allow_unsandboxed: without root and without namespaces, run
    candidates as our own uid (with a warning) instead of refusing."""
    mode: str = os.environ.get("CUDA_EVAL_SANDBOX_IDENTITY", "auto")
    uid_base: int = DEFAULT_UID_RANGE[0]
    slots: int = DEFAULT_UID_RANGE[1] - DEFAULT_UID_RANGE[0] + 1
    allow_unsandboxed: bool = os.environ.get("CUDA_EVAL_ALLOW_UNSANDBOXED", "") == "1"


IDENTITY = IdentityConfig()
_identity_lock = threading.Lock()
_probe_result: list = []  # [None (ok) or why not], once per process: all slot uids see the same permissions
_ns_results: dict[str, str | None] = {}  # "net" / "ipc" / "user": None (works) or why not, once per process
_accounts: dict[int, tuple[float, str | None]] = {}  # uid -> (when looked up, account/group using it or None)
_skip_noted: set[int] = set()


def parse_uid_range(text: str) -> tuple[int, int]:
    """"60000-60999" -> (60000, 60999): the inclusive range of dedicated sandbox uids. ValueError if malformed."""
    first, sep, last = str(text).strip().partition("-")
    try:
        lo, hi = int(first), int(last)
    except ValueError:
        raise ValueError(f"sandbox uid range {text!r}: expected FIRST-LAST, e.g. 60000-60999") from None
    if not sep or lo < 1 or hi < lo or hi >= (1 << 31) - 1:
        raise ValueError(f"sandbox uid range {text!r}: expected FIRST-LAST with 1 <= FIRST <= LAST < 2**31-1")
    if hi - lo >= 1 << 20:
        raise ValueError(f"sandbox uid range {text!r}: at most {1 << 20} uids")
    if lo <= 65534 <= hi or lo <= 65535 <= hi:
        raise ValueError(f"sandbox uid range {text!r} contains 65534/65535 (nobody, the 16-bit -1)")
    return lo, hi


def configure(*, uid_range: str | tuple[int, int] | None = None, allow_unsandboxed: bool | None = None,
              mode: str | None = None) -> None:
    """Set how this process sandboxes candidates (see IdentityConfig). Called by the Evaluator with its config;
    validated here."""
    if uid_range is not None:
        lo, hi = parse_uid_range(uid_range if isinstance(uid_range, str) else f"{uid_range[0]}-{uid_range[1]}")
        IDENTITY.uid_base, IDENTITY.slots = lo, hi - lo + 1
    if allow_unsandboxed is not None:
        IDENTITY.allow_unsandboxed = bool(allow_unsandboxed)
    if mode is not None:
        if mode not in _MODES:
            raise ValueError(f"sandbox identity mode must be one of {_MODES}, got {mode!r}")
        IDENTITY.mode = mode


_MODES = ("auto", "dedicated", "namespaces", "same")


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


_NS_WHAT = {"net": "a network namespace", "ipc": "an IPC namespace",
            "user": "user, mount, PID, network and IPC namespaces"}


def _probe_namespace(kind: str, uid: int | None) -> str | None:
    """None if a sandboxed process can get `kind` namespaces ("net", "ipc": need CAP_SYS_ADMIN, run as `uid`;
    "user": the unprivileged set, as ourselves); else why not. Once per process."""
    with _identity_lock:
        if kind in _ns_results:
            return _ns_results[kind]
    kwargs: dict[str, Any] = {"uid": uid, "gid": uid}
    scratch = None
    if kind == "net":
        kwargs["new_netns"] = True
    elif kind == "ipc":
        kwargs["new_ipcns"] = True
    else:
        scratch = tempfile.mkdtemp(prefix="cuda_eval_nsprobe_")
        kwargs = {"userns": True, "writable_dir": scratch}
    try:
        res = _native.run(["true"], env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout_s=30, limits={},
                          output_cap_bytes=4096, **kwargs)
        why = None if res["exit_code"] == 0 else f"`true` in {_NS_WHAT[kind]} exited with {res['exit_code']}"
    except RuntimeError as e:
        why = str(e)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    with _identity_lock:
        first = kind not in _ns_results
        _ns_results[kind] = why
    if why and first and kind == "net":
        log.warning("sandboxed processes keep the host's network: a network namespace cannot be created (%s)", why)
    if why and first and kind == "ipc":
        log.warning("sandboxed processes share the host's IPC namespace: one cannot be created (%s); POSIX message "
                    "queues are then refused to them (RLIMIT_MSGQUEUE 0) and their SysV IPC swept", why)
    return why


def _probe_netns(uid: int) -> str | None:
    return _probe_namespace("net", uid)


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


# What a candidate can do when it runs as our own uid with no namespace (docs/EVALUATOR.md, "Sandbox").
UNSANDBOXED_LOSSES = ("it can read, change and delete every file our uid can (checkpoints, keys, the caches)",
                      "it can signal, ptrace and read the memory of our processes (the trainer included)",
                      "it can reach the network",
                      "processes it detaches from its group outlive it, and its temp files are not swept")


def _unprivileged_mode() -> str:
    """"namespaces" or "same" for a process that is not root, following IDENTITY; SandboxUnavailable where neither
    is allowed."""
    mode = IDENTITY.mode
    if mode not in _MODES:
        raise ValueError(f"CUDA_EVAL_SANDBOX_IDENTITY must be one of {'|'.join(_MODES)}, got {mode!r}")
    if _inside_sandbox():
        return "same"  # the outer sandbox (a leased uid or namespaces of its own) confines what this one starts
    if mode == "dedicated":
        raise SandboxUnavailable("CUDA_EVAL_SANDBOX_IDENTITY=dedicated needs root (to switch to the sandbox uids); "
                                 "unset it to isolate candidates with user namespaces instead")
    if mode == "same":
        _note_unsandboxed("CUDA_EVAL_SANDBOX_IDENTITY=same")
        return "same"
    why = _probe_namespace("user", None)
    if why is None:
        return "namespaces"
    if mode == "namespaces":
        raise SandboxUnavailable(f"user namespaces cannot be used here: {why}")
    if IDENTITY.allow_unsandboxed:
        _note_unsandboxed(f"allow_unsandboxed (user namespaces do not work here: {why})")
        return "same"
    raise SandboxUnavailable(
        f"refusing to run candidates: we are not root and this kernel does not give an unprivileged process user "
        f"namespaces ({why}). Unsandboxed, a candidate runs as our own uid: " + "; ".join(UNSANDBOXED_LOSSES)
        + ". Fix one of: allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
        "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04+); run the evaluator as root (dedicated "
        "sandbox uids); or accept the risk with EvalConfig(allow_unsandboxed=True) (CUDA_EVAL_ALLOW_UNSANDBOXED=1)")


def _inside_sandbox() -> bool:
    """True in a process started by a sandbox: the marker in its environment, and a uid that only a sandbox gives
    (one without an account: the leased uids have none) or a user namespace (the non-root sandbox's). A user who
    exported the marker by mistake still gets a sandbox."""
    if os.environ.get(INSIDE_SANDBOX_ENV) != "1":
        return False
    try:
        with open("/proc/self/uid_map") as f:
            if f.read().split() != ["0", "0", "4294967295"]:
                return True
    except OSError:
        pass
    return _account_of(os.getuid()) is None


_unsandboxed_noted: list[bool] = []


def _note_unsandboxed(reason: str) -> None:
    with _identity_lock:
        if _unsandboxed_noted:
            return
        _unsandboxed_noted.append(True)
    log.warning("candidates run UNSANDBOXED as uid %d (%s): %s", os.getuid(), reason, "; ".join(UNSANDBOXED_LOSSES))


def _acquire_identity() -> _Lease | None:
    """A dedicated uid lease as root, None otherwise (then _unprivileged_mode() says how), following IDENTITY."""
    mode = IDENTITY.mode
    if mode not in _MODES:
        raise ValueError(f"CUDA_EVAL_SANDBOX_IDENTITY must be one of {'|'.join(_MODES)}, got {mode!r}")
    if os.geteuid() != 0:
        return None
    if mode in ("same", "namespaces"):
        raise SandboxUnavailable(f"CUDA_EVAL_SANDBOX_IDENTITY={mode} is refused as root: candidates would run as "
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
    """"dedicated" (leased uids, as root), "namespaces" (not root: user namespaces) or "same" (not root, our own uid:
    only inside a sandbox or when opted in). Raises SandboxUnavailable when candidates cannot be run safely and
    nobody opted in (nothing would run)."""
    lease = _acquire_identity()
    if lease is None:
        return _unprivileged_mode()
    lease.release()
    return "dedicated"


def isolation() -> dict[str, Any]:
    """What sandboxed processes get here, for logs and docs: identity ("dedicated" | "namespaces" | "same"), uid
    range, network ("isolated": an empty namespace | "shared": the host's) and why, ipc ("isolated" | "swept": no
    namespace, message queues refused and SysV IPC swept | "shared"), pid and filesystem isolation, the memory
    cgroup (None and why where there is none), oom_score_adj, what was staged for the uid, the swept world-writable
    dirs, the default disk quota and `lost`: what a candidate can do here that the full sandbox prevents. Raises
    SandboxUnavailable like identity_mode()."""
    lease = _acquire_identity()
    try:
        mode = "dedicated" if lease is not None else _unprivileged_mode()
        if mode == "dedicated":
            net_why = _probe_netns(lease.uid)
            ipc_why = _probe_namespace("ipc", lease.uid)
        elif mode == "namespaces":
            net_why = ipc_why = None
        else:
            net_why = ipc_why = "our own uid, no namespaces"
        cfg = IDENTITY
        lost = []
        if mode == "same":
            lost += list(UNSANDBOXED_LOSSES)
        elif net_why:
            lost.append("it can reach the network")
        if mode == "namespaces":
            lost.append("it can read (not write) every file our uid can")
        cg_why = cgroups.available()
        return {"identity": mode,
                "uid_range": None if lease is None else [cfg.uid_base, cfg.uid_base + cfg.slots - 1],
                "network": "shared" if net_why else "isolated", "network_note": net_why,
                "ipc": "isolated" if not ipc_why else ("swept" if mode == "dedicated" else "shared"),
                "ipc_note": ipc_why,
                "pid": "isolated" if mode == "namespaces" else ("uid" if mode == "dedicated" else "shared"),
                "filesystem": {"dedicated": "writes only to its work dir and the swept temp dirs",
                               "namespaces": "read-only except its work dir",
                               "same": "everything our uid can"}[mode],
                "memory_cgroup": cgroups.describe(), "memory_cgroup_note": cg_why,
                "oom_score_adj": OOM_SCORE_ADJ,
                "staged": [] if lease is None else list(lease.view.staged),
                "world_writable_dirs": list(world_writable_dirs()),
                "disk_quota_bytes": SandboxLimits().disk_bytes,
                "lost": lost}
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
               TORCHINDUCTOR_CACHE_DIR=os.path.join(workdir, ".torchinductor"), **{INSIDE_SANDBOX_ENV: "1"})
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
        self.cgroup: cgroups.Cgroup | None = None
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
        self._cgroups: list[cgroups.Cgroup] = []
        self._lease = _acquire_identity()
        try:
            self.mode = "dedicated" if self._lease is not None else _unprivileged_mode()
            dedicated = self._lease is not None
            self._new_netns = dedicated and _probe_netns(self._lease.uid) is None
            self._new_ipcns = dedicated and _probe_namespace("ipc", self._lease.uid) is None
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
        return self._new_netns or self.mode == "namespaces"

    @property
    def ipc_isolated(self) -> bool:
        return self._new_ipcns or self.mode == "namespaces"

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
        if self.mode == "same" and processes is not None and os.geteuid() != 0:
            # RLIMIT_NPROC counts every task of our uid (a user namespace starts its own count at 0)
            processes = _count_own_tasks(os.getuid()) + processes
        rlimits = limits.rlimits(processes=processes)
        if not self.ipc_isolated:
            rlimits["msgqueue_bytes"] = 0  # no IPC namespace to take its message queues away with it
        namespaces = self.mode == "namespaces"
        shm = SHM_BYTES if limits.disk_bytes is None else min(SHM_BYTES, limits.disk_bytes)
        return argv, dict(env=env, cwd=os.path.abspath(cwd or self.workdir), limits=rlimits,
                          output_cap_bytes=limits.output_cap_bytes, uid=self.uid, gid=self.uid, sweep_uid=False,
                          new_netns=self._new_netns, new_ipcns=self._new_ipcns, nice=min(19, limits.nice),
                          oom_score_adj=OOM_SCORE_ADJ, userns=namespaces,
                          writable_dir=self.workdir if namespaces else "", shm_bytes=shm)

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
        # Its process group's memory cgroup (where the machine offers them), bounded like one of its processes;
        # inside a sandbox, the outer one's cgroup already holds it.
        cg = None if self.mode == "same" and _inside_sandbox() else \
            cgroups.create(limits.data_bytes or limits.address_space_bytes)
        if cg is not None:
            with self._lock:
                self._cgroups.append(cg)
            kwargs["cgroup_procs"] = cg.procs
        native = _native.spawn(argv, timeout_s=limits.wall_timeout_s, stdin=stdin,
                               die_with_parent_thread=die_with_parent_thread, pass_fds=list(pass_fds), **kwargs)
        proc = SessionProcess(native, self, limits.disk_bytes)
        proc.cgroup = cg
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
        with self._lock:
            groups, self._cgroups = self._cgroups, []
        for cg in groups:  # empty by now: the group and (dedicated) the uid were killed
            cg.remove()

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
