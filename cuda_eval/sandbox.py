"""Python face of the native sandboxed runner (cuda_eval._native.run / spawn).

What a sandboxed process gets:
- its own session and process group, rlimits (`SandboxLimits`), a wall-clock timeout after which the whole group is
  killed, stdout/stderr captured up to a byte cap, stdin from /dev/null (run) or a pipe (spawn);
- an environment built from an allow-list (`DEFAULT_ENV_ALLOW`) plus HOME/TMPDIR = its work dir, the directory that
  holds this package on PYTHONPATH, and whatever the caller adds (`extra_env`);
- when we run as root (the GPU machine, CI): a dedicated unprivileged uid/gid leased for the process' lifetime
  (`uid_base + slot`, no /etc/passwd entry needed; leases are flock'ed files, so concurrent evaluators on one machine
  never share a uid). RLIMIT_NPROC is then enforced (it is not for root: a fork bomb would take the machine down),
  the uid cannot write anywhere but its work dir and the world-writable temp dirs (which are swept of its files
  afterwards), and "kill every process of this uid" also ends setsid'ed escapees. Before the first use we check that
  such a uid can read the interpreter, torch and this package (a checkout under /root is not readable); if it cannot,
  we fall back to our own uid with a loud warning (`identity_mode()` says which mode is active);
- when we are not root: our own uid, RLIMIT_NPROC = our current task count + `limits.processes`.

Results are dicts with the keys of the native runner (exit_code, signal, timed_out, wall_s, cpu_s, peak_rss_bytes,
stdout, stderr, stdout_truncated, stderr_truncated) plus `uid` (None = ours) and `workdir`.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import logging
import os
import random
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cuda_eval import _native
from cuda_eval.sandbox_runtime import RuntimeView, runtime_view

log = logging.getLogger(__name__)

# Environment variables passed through from our environment when set (everything else is dropped).
DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_HOME", "CUDA_PATH", "CUDA_MODULE_LOADING", "LD_LIBRARY_PATH",
    "VIRTUAL_ENV", "CONDA_PREFIX",
)
# World-writable places a sandboxed uid could write to; swept of its files after each process.
WORLD_WRITABLE_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed process. None = inherit ours."""
    address_space_bytes: int | None = 16 << 30  # RLIMIT_AS: a 100 GB allocation fails instead of swapping the host
    cpu_seconds: int | None = 600               # RLIMIT_CPU: CPU time of each process (SIGXCPU, then SIGKILL)
    open_files: int | None = 1024               # RLIMIT_NOFILE
    file_size_bytes: int | None = 1 << 30       # RLIMIT_FSIZE: largest file it may write
    processes: int | None = 512                 # RLIMIT_NPROC: tasks (threads count!) of its uid
    wall_timeout_s: float = 120.0               # the whole process group is killed after this
    output_cap_bytes: int = 1 << 20             # per stream; the rest is read and dropped
    data_bytes: int | None = None               # RLIMIT_DATA: an alternative memory cap that CUDA tolerates

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
    """How sandboxed processes get their uid. `mode`: "auto" (dedicated uid when root and it can read what it needs,
    else ours), "dedicated" (dedicated uid or an error), "same" (always ours)."""
    mode: str = os.environ.get("CUDA_EVAL_SANDBOX_IDENTITY", "auto")
    uid_base: int = int(os.environ.get("CUDA_EVAL_SANDBOX_UID_BASE", "60000"))
    slots: int = int(os.environ.get("CUDA_EVAL_SANDBOX_UID_SLOTS", "1000"))
    lock_dir: str = os.environ.get("CUDA_EVAL_SANDBOX_LOCK_DIR", "/tmp/cuda_eval_sandbox_uids")


IDENTITY = IdentityConfig()
_identity_lock = threading.Lock()
_probe_result: list = []  # [None (ok) or why not], once per process: all slot uids see the same permissions


class _Lease:
    """One leased uid/gid: an flock on <lock_dir>/<uid>.lock held while a sandboxed process uses the uid."""

    def __init__(self, uid: int, fd: int):
        self.uid, self.gid, self._fd = uid, uid, fd
        self.view: RuntimeView | None = None

    def release(self) -> None:
        if self._fd >= 0:
            try:
                _native.kill_uid(self.uid)
                _sweep_world_writable(self.uid)
            finally:
                os.close(self._fd)  # closing drops the flock
                self._fd = -1

    def __del__(self):
        if self._fd >= 0:
            try:
                self.release()
            except Exception:  # interpreter shutdown
                pass


def _lease_uid() -> _Lease:
    cfg = IDENTITY
    os.makedirs(cfg.lock_dir, mode=0o700, exist_ok=True)
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
            _native.kill_uid(uid)
            return _Lease(uid, fd)
        time.sleep(0.05)
    raise RuntimeError(f"all {cfg.slots} sandbox uids ({cfg.uid_base}..) are in use; raise "
                       "CUDA_EVAL_SANDBOX_UID_SLOTS")


def _probe_uid(uid: int, view: RuntimeView) -> str | None:
    """None if `uid` can run the (staged) interpreter and import this package and torch from it; else why not."""
    probe = ("import importlib.util, os, sys\n"
             "bad = []\n"
             "for name in ('cuda_eval', 'torch'):\n"
             "    spec = importlib.util.find_spec(name)\n"
             "    if spec is None or not spec.origin or not os.access(spec.origin, os.R_OK):\n"
             "        bad.append(name)\n"
             "    elif name == 'torch':\n"
             "        lib = os.path.join(os.path.dirname(spec.origin), 'lib')\n"
             "        if not all(os.access(os.path.join(lib, f), os.R_OK) for f in os.listdir(lib)):\n"
             "            bad.append('torch/lib')\n"
             "import cuda_eval._native\n"
             "sys.stdout.write(','.join(bad))\n")
    with _identity_lock:
        if _probe_result:
            return _probe_result[0]
    env = _base_env("/", DEFAULT_ENV_ALLOW, {}, view)
    try:
        res = _native.run([view.python, "-c", probe], env=env, cwd="/", timeout_s=60, limits={},
                          output_cap_bytes=4096, uid=uid, gid=uid)
        if res["exit_code"] != 0:
            why = f"the interpreter failed as uid {uid}: " + res["stderr"].decode(errors="replace")[-300:]
        elif res["stdout"].strip():
            why = f"uid {uid} cannot read: {res['stdout'].decode()}"
        else:
            why = None
    except RuntimeError as e:
        why = f"cannot run {view.python} as uid {uid}: {e}"
    with _identity_lock:
        _probe_result[:] = [why]
    return why


_warned_fallback = False


def _acquire_identity() -> _Lease | None:
    """A dedicated uid lease, or None (run as ourselves), following IDENTITY.mode."""
    global _warned_fallback
    mode = IDENTITY.mode
    if mode not in ("auto", "dedicated", "same"):
        raise ValueError(f"CUDA_EVAL_SANDBOX_IDENTITY must be auto|dedicated|same, got {mode!r}")
    if mode == "same":
        return None
    if os.geteuid() != 0:
        if mode == "dedicated":
            raise RuntimeError("a dedicated sandbox uid needs root")
        return None
    lease = _lease_uid()
    try:
        lease.view = runtime_view()
        why = _probe_uid(lease.uid, lease.view)
    except (OSError, RuntimeError) as e:
        why = f"the runtime could not be staged for it: {e}"
    if why is None:
        return lease
    lease.release()
    if mode == "dedicated":
        raise RuntimeError(f"sandbox uid unusable: {why}")
    if not _warned_fallback:
        _warned_fallback = True
        log.warning("SANDBOX WEAKENED: running candidates as root (our own uid) because %s. RLIMIT_NPROC is not "
                    "enforced for root and escaped processes cannot be swept by uid. Make the interpreter, "
                    "site-packages and this checkout world-readable to fix.", why)
    return None


def identity_mode() -> str:
    """"dedicated" if sandboxed processes run under leased uids, else "same" (ours)."""
    lease = _acquire_identity()
    if lease is None:
        return "same"
    lease.release()
    return "dedicated"


def _sweep_world_writable(uid: int) -> None:
    """Remove what `uid` left in the world-writable temp dirs (top-level entries it owns)."""
    for d in WORLD_WRITABLE_DIRS:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid != uid:
                continue
            try:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
            except OSError:
                pass


# --- environment and work dir ---------------------------------------------------------------------------------
def _base_env(workdir: str, env_allow: Iterable[str], extra_env: Mapping[str, str],
              view: RuntimeView | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in env_allow if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # Our interpreter's directory first, so that "python" in the sandbox is the one running us.
    py_dir = os.path.dirname(sys.executable)
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


class SandboxSession:
    """One sandbox identity (leased uid, or ours) and work dir for one or more processes, possibly concurrent (the
    phases of one build). Processes are swept by uid only when the session closes, so concurrent ones do not kill
    each other; each process' own group is still killed when it ends or times out."""

    def __init__(self, workdir: str, *, env_allow: Iterable[str] = DEFAULT_ENV_ALLOW,
                 extra_env: Mapping[str, str] | None = None):
        self.workdir = os.path.abspath(workdir)
        self._env_allow, self._extra_env = tuple(env_allow), dict(extra_env or {})
        self._lease = _acquire_identity()
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
                          uid=self.uid, gid=self.uid, sweep_uid=False)

    _closed = False

    def run(self, argv: Sequence[str], limits: SandboxLimits, *, stdin: bytes | None = None, cwd: str | None = None,
            extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Run one process to completion (GIL released while waiting). See run_sandboxed."""
        argv, kwargs = self._kwargs(argv, limits, cwd, extra_env)
        res = _native.run(argv, timeout_s=limits.wall_timeout_s, stdin=stdin, **kwargs)
        return _finish(res, self._lease, self.workdir)

    def spawn(self, argv: Sequence[str], limits: SandboxLimits, *, stdin: bytes | None = None,
              cwd: str | None = None, extra_env: Mapping[str, str] | None = None,
              die_with_parent_thread: bool = False):
        """Start one process and return at once. The lifetime cap and the waits are enforced by this process, so a
        child whose parent is killed would run on unwatched: die_with_parent_thread=True has the kernel kill it
        when the calling thread ends (the whole process dying included). Only for a caller whose thread outlives
        the child (it waits for it, or kills it, before it ends)."""
        argv, kwargs = self._kwargs(argv, limits, cwd, extra_env)
        return _native.spawn(argv, timeout_s=limits.wall_timeout_s, stdin=stdin,
                             die_with_parent_thread=die_with_parent_thread, **kwargs)

    def close(self) -> None:
        """Kill every process left under the session's uid and sweep its files from the temp dirs."""
        self._closed = True
        if self._lease is not None:
            lease, self._lease = self._lease, None
            lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _finish(res: dict, lease: _Lease | None, workdir: str) -> dict:
    res = dict(res)
    res["uid"] = None if lease is None else lease.uid
    res["workdir"] = workdir
    return res


def run_sandboxed(argv: Sequence[str], workdir: str, limits: SandboxLimits, env_allow: Iterable[str] = DEFAULT_ENV_ALLOW,
                  extra_env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> dict[str, Any]:
    """Run `argv` in `workdir` (created if missing) under `limits`; blocks (GIL released) until it ends or
    limits.wall_timeout_s passes. Never raises for anything the program does; raises for bad arguments or when the
    program cannot be started at all (not found, not executable by the sandbox uid)."""
    with SandboxSession(workdir, env_allow=env_allow, extra_env=extra_env) as session:
        return session.run(argv, limits, stdin=stdin)


class SandboxedProcess:
    """A running sandboxed process (see spawn_sandboxed). The uid lease ends when wait() returns or on kill()+wait()."""

    def __init__(self, process, session: SandboxSession):
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
            res = self._process.wait(timeout_s)
            self._session.close()  # the uid sweep: escaped (setsid'ed) descendants die here
            res = dict(res)
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
                    stdin: bytes | None = None, die_with_parent_thread: bool = False) -> SandboxedProcess:
    """Start `argv` sandboxed and return at once; stdin is a pipe (write_stdin / close_stdin).
    limits.wall_timeout_s caps the whole lifetime; wait(timeout_s) adds a per-wait limit; die_with_parent_thread:
    see SandboxSession.spawn."""
    session = SandboxSession(workdir, env_allow=env_allow, extra_env=extra_env)
    try:
        process = session.spawn(argv, limits, stdin=stdin, die_with_parent_thread=die_with_parent_thread)
    except BaseException:
        session.close()
        raise
    return SandboxedProcess(process, session)


def describe(res: Mapping[str, Any], limits: SandboxLimits | None = None) -> str:
    """One line saying how a sandboxed process ended (for logs and verdicts)."""
    if res.get("timed_out"):
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
