"""Running one process sandboxed: its limits (`SandboxLimits`), a session (one identity and work dir for one or more
processes, with their disk quota), the process (`SandboxedProcess`), and the one-call forms `run_sandboxed` /
`spawn_sandboxed`; `describe` says how a process ended. What every sandboxed process gets and who it runs as is
described in cuda_eval/sandbox/__init__.py; the parts live beside this file (config, identity, leases, probes,
environment, sweeps, quota).

Results are dicts with the keys of the native runner (exit_code, signal, timed_out, wall_s, cpu_s, peak_rss_bytes,
stdout, stderr, stdout_truncated, stderr_truncated) plus `uid` (None = ours), `workdir` and `disk_quota_exceeded`.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cuda_eval import _native
from cuda_eval.sandbox import cgroups
from cuda_eval.sandbox.config import OOM_SCORE_ADJ, SHM_BYTES
from cuda_eval.sandbox.environment import (DEFAULT_ENV_ALLOW, _base_env, _count_own_tasks, map_in, _our_python_names,
                                           prepare_workdir)
from cuda_eval.sandbox.identity import _acquire_identity, _inside_sandbox, _unprivileged_mode
from cuda_eval.sandbox.probes import _probe_namespace, _probe_netns
from cuda_eval.sandbox.quota import _DISK_POLL_S, _PROC_EVERY, DEFAULT_DISK_BYTES, _DiskUsage
from cuda_eval.sandbox.runtime import RuntimeView
from cuda_eval.sandbox.sweeps import _session_pids, _uid_pids, world_writable_dirs

log = logging.getLogger(__name__)


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
    disk_bytes: int | None = DEFAULT_DISK_BYTES  # all files of the session (work dir + its files in the temp dirs)
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


class SandboxedProcess:
    """A running sandboxed process: the native process plus its session's bookkeeping. Started by
    SandboxSession.spawn (the session outlives it) or spawn_sandboxed (a session of its own, closed when wait()
    returns: the uid sweep ends setsid'ed escapees, and the uid lease ends). Its result dict also has uid, workdir
    and disk_quota_exceeded. kill() after wait() is a no-op: the uid may be someone else's by then."""

    def __init__(self, process, session: SandboxSession, disk_bytes: int | None, *, owns_session: bool = False):
        self._process, self._session, self.disk_bytes = process, session, disk_bytes
        self.workdir, self._uid, self._owns_session = session.workdir, session.uid, owns_session
        self.cgroup: cgroups.Cgroup | None = None
        self.quota_killed = False
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
            self._session._forget(self)
            res.update(uid=self._uid, workdir=self.workdir, disk_quota_exceeded=self.quota_killed)
            if self._owns_session:
                self._session.close()
            self._result = res
        return self._result

    def poll(self) -> dict[str, Any] | None:
        return self.wait(0.0) if self._result is not None or not self._process.alive else None

    def kill(self) -> None:
        if self._result is None:
            self._process.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._result is None:
            self.kill()
            self.wait(10.0)


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
        self._active: dict[int, SandboxedProcess] = {}
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
        return path if self.view is None else map_in(path, self.view)

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
            argv = [map_in(a, view) for a in argv]
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
              die_with_parent_thread: bool = False, pass_fds: Sequence[int] = (),
              owns_session: bool = False) -> SandboxedProcess:
        """Start one process and return at once (stdin is a pipe). The lifetime cap and the waits are enforced by
        this process, so a child whose parent is killed would run on unwatched: die_with_parent_thread=True has the
        kernel kill it when the calling thread ends (the whole process dying included). Only for a caller whose
        thread outlives the child (it waits for it, or kills it, before it ends). pass_fds: our descriptors, handed
        over as the child's fds 3, 4, ... in order (every other descriptor is closed in the child). owns_session: the
        process closes this session when it has been waited for (spawn_sandboxed's one-process session)."""
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
        proc = SandboxedProcess(native, self, limits.disk_bytes, owns_session=owns_session)
        proc.cgroup = cg
        with self._lock:
            self._active[id(proc)] = proc
            if limits.disk_bytes is not None and self._watch is None and not self._closed:
                self._watch = threading.Thread(target=self._watch_disk, daemon=True, name="cuda_eval-disk-quota")
                self._watch.start()
        return proc

    def _forget(self, proc: SandboxedProcess) -> None:
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


def spawn_sandboxed(argv: Sequence[str], workdir: str, limits: SandboxLimits,
                    env_allow: Iterable[str] = DEFAULT_ENV_ALLOW, extra_env: Mapping[str, str] | None = None,
                    stdin: bytes | None = None, die_with_parent_thread: bool = False,
                    pass_fds: Sequence[int] = ()) -> SandboxedProcess:
    """Start `argv` sandboxed and return at once; stdin is a pipe (write_stdin / close_stdin).
    limits.wall_timeout_s caps the whole lifetime; wait(timeout_s) adds a per-wait limit; die_with_parent_thread
    and pass_fds: see SandboxSession.spawn."""
    session = SandboxSession(workdir, env_allow=env_allow, extra_env=extra_env)
    try:
        return session.spawn(argv, limits, stdin=stdin, die_with_parent_thread=die_with_parent_thread,
                             pass_fds=pass_fds, owns_session=True)
    except BaseException:
        session.close()
        raise


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
