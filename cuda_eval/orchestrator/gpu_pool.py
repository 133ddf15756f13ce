"""Per device: one judge and pre-started candidate workers; one candidate per process; one candidate per GPU at a time.

Each device slot owns a thread, a judge (`python -m cuda_eval.judge`: trusted, long-lived, under a sandbox uid of
its own) and `spares` *spare* workers (`python -m cuda_eval.worker`, one per candidate, each under its own leased
uid) starting or started: they import torch, warm up, initialise CUDA, then say "ready" on their socket. A job goes
to the oldest spare: the slot hands the spare's socket to the judge together with the job (SCM_RIGHTS), a new spare
is started at once, and the slot waits for the judge's verdict. The judge drives the worker step by step and answers
with the verdict on its own socket: nothing the candidate's process writes (files, its socket, its output streams)
is read as a result. Start-up is hidden as long as a job takes longer than start-up / spares. All processes of one
GPU share a lock file (machine-wide, named by the physical GPU, so also across pools): held while one initialises
CUDA and while the judge times, so a spare starting up never disturbs a measurement. Jobs come from one queue shared
by all slots, so the GPUs of a machine drain it together.

Processes run through the sandbox of cuda_eval.sandbox (own session/process group, scrubbed environment, confined
working directory, limits, no network, kill of the whole group at the timeout). Whatever a worker does (segfault,
illegal address, hang, os._exit, garbage on its socket), the slot reports a WorkerOutcome with exit code, signal,
stderr tail and the last phase the judge had reached, and the next job runs on a fresh process.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import fcntl
import itertools
import os
import queue
import re
import shutil
import logging
import socket
import stat
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from cuda_eval.orchestrator import host_memory
from cuda_eval.protocol import channel
from cuda_eval.protocol.channel import ChannelError
from cuda_eval.sandbox import safe_dirs

log = logging.getLogger(__name__)
JUDGE_MARGIN_S = 60.0      # the judge's own work (reference, comparisons) on top of the job's timeout
JUDGE_MAX_JOBS = 500       # a fresh judge after this many jobs (task modules and caches pile up in one process)
UNCHECKED_OUTPUT_BYTES = 256 << 20  # smaller output needs are granted without reading the host's free memory
JUDGE_OWN_MEMORY = 6 << 30        # host memory of a judge process beside a job's outputs (torch, CUDA, CUPTI, task)


@dataclasses.dataclass
class PoolConfig:
    device_type: str = "cuda"               # "cuda": one slot per GPU index in `devices`; "cpu": slots are CPUs
    devices: tuple = (0,)                   # GPU indices (cuda) or slot labels (cpu)
    run_dir: str | None = None              # working directories of workers live here (default: a temp dir)
    python: str = sys.executable
    start_timeout_s: float = 180.0          # a spare must be ready within this (import torch + CUDA init)
    spares: int = 2                         # pre-started workers kept per device
    cpu_threads: int = 1                    # torch intra-op threads in CPU mode (timing is per thread)
    output_cap_bytes: int = 256 << 10       # stdout/stderr kept per worker
    cpu_seconds: int = 3600                 # RLIMIT_CPU of a worker
    open_files: int = 4096
    processes: int = 4096                   # RLIMIT_NPROC (threads count too; torch/CUDA start many)
    address_space_bytes: int | None = None  # None on GPUs: CUDA reserves huge virtual ranges
    data_bytes: int | None = 32 << 30       # RLIMIT_DATA: host memory a process may write; CUDA's reservations
                                            # are not writable mappings, so it does not count them
    file_size_bytes: int = 4 << 30          # RLIMIT_FSIZE of the processes (never bounds a job's output buffer:
                                            # the pool makes that one, see output_memory_bytes)
    disk_bytes: int | None = 8 << 30        # disk quota of each process's sandbox session (the output buffer is
                                            # not counted)
    # Host memory one job's outputs may take: the shared output buffer plus the judge's host copies of the
    # candidate's outputs. None: whatever the host (or its cgroup) has available. A task over it gets the task-level
    # verdict meta.task_too_large, never an internal error.
    output_memory_bytes: int | None = None
    # Host memory an output buffer must leave available (None: host_memory.host_memory_reserve(), the default).
    host_memory_reserve_bytes: int | None = None
    extra_env: dict = dataclasses.field(default_factory=dict)
    # A GPU's timing lock is machine-wide, named by the physical GPU: two evaluators on one GPU (two trainers, or a
    # trainer and launch/eval.py) must not time at the same time either. CPU-mode slots are virtual: per pool.
    device_lock_dir: str = os.environ.get("CUDA_EVAL_DEVICE_LOCK_DIR", "/tmp/cuda_eval_device_locks")


@dataclasses.dataclass
class WorkerOutcome:
    """What happened to one job. `result` is the judge's verdict (None when the worker crashed or timed out, or the
    judge failed)."""
    result: dict | None
    device: str
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    start_failed: bool = False
    wall_s: float = 0.0
    queue_s: float = 0.0
    started_at: float = 0.0                 # wall clock (time.time()) when the job was handed to its worker
    progress: dict | None = None
    stderr_tail: str = ""
    stdout_tail: str = ""
    worker_info: dict | None = None
    judge_failed: bool = False              # the judge died or did not answer (it is restarted)
    peak_rss_bytes: int | None = None       # the worker's peak resident memory (its output buffer pages included)
    lost_message: str = ""                  # why the judge lost the worker (eof, timeout)


@dataclasses.dataclass
class _Worker:
    process: Any
    workdir: str
    started: float
    sock: socket.socket | None = None      # our end of its socket; handed to the judge with the job
    info: dict | None = None
    ready_error: str = ""


@dataclasses.dataclass
class _Judge:
    process: Any
    workdir: str
    sock: socket.socket
    info: dict | None = None
    jobs: int = 0


def default_spawn(argv: list[str], workdir: str, limits: Any, env: dict[str, str], pass_fds: tuple = ()):
    """Start a process through the native sandbox (cuda_eval.sandbox, part 1). It dies with its slot thread: the
    job's timeout is enforced by that thread, so a worker whose evaluator was killed (a run cut by `timeout`) would
    otherwise keep going unwatched, e.g. a hung kernel spinning on the GPU for hours under the next run's timings
    (docs/LOG.md, "an orphaned evaluator worker found and fixed"). Safe because the slot thread starts, waits for and
    discards its own processes."""
    from cuda_eval.sandbox import runner as sandbox
    return sandbox.spawn_sandboxed(argv, workdir, limits, extra_env=env, die_with_parent_thread=True,
                                   pass_fds=tuple(pass_fds))


def default_limits(config: PoolConfig, timeout_s: float):
    from cuda_eval.sandbox import runner as sandbox
    return sandbox.SandboxLimits(address_space_bytes=config.address_space_bytes, cpu_seconds=config.cpu_seconds,
                                 open_files=config.open_files, file_size_bytes=config.file_size_bytes,
                                 processes=config.processes, wall_timeout_s=timeout_s,
                                 output_cap_bytes=config.output_cap_bytes, data_bytes=config.data_bytes,
                                 disk_bytes=config.disk_bytes)


class GpuPool:
    """`submit(payload, timeout_s) -> Future[WorkerOutcome]`; `device_info()`; `close()` (also a context manager).
    `spawn(argv, workdir, limits, env, pass_fds)` and `limits(config, timeout_s)` can be replaced (tests)."""

    def __init__(self, config: PoolConfig, *, spawn: Callable | None = None, limits: Callable | None = None):
        self.config = config
        if spawn is None:  # as root, refuse now (SandboxUnavailable) rather than fail every job later
            from cuda_eval.sandbox.identity import identity_mode
            identity_mode()
        self._spawn = spawn or default_spawn
        self._limits = limits or default_limits
        self._own_run_dir = config.run_dir is None
        if config.run_dir:  # ours alone (safe_dirs): workers' dirs are created and deleted in it as root
            self.run_dir = safe_dirs.ensure_dir(config.run_dir, 0o711, what="the worker run dir",
                                                fix=safe_dirs.fix_hint("EvalConfig.run_dir"))
        else:
            self.run_dir = tempfile.mkdtemp(prefix="cuda_eval_workers_")
        os.chmod(self.run_dir, 0o711)  # sandbox uids reach their own dirs, cannot list the others
        self._run_dir_lock = _claim_run_dir(self.run_dir)
        self._queue: queue.Queue = queue.Queue()
        self._counter = itertools.count()
        self._info: dict | None = None
        self._info_ready = threading.Event()
        self._memory = threading.Condition()        # host memory granted to the jobs' output buffers
        self._granted: dict[int, int] = {}
        self._closed = False
        self._threads = []
        for device in config.devices:
            t = threading.Thread(target=self._slot_loop, args=(str(device),), daemon=True,
                                 name=f"cuda_eval-slot-{device}")
            t.start()
            self._threads.append(t)

    # --- public -------------------------------------------------------------------------------------------------
    def submit(self, payload: dict, timeout_s: float) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("GpuPool is closed")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, payload, float(timeout_s), time.monotonic()))
        return future

    def device_info(self, timeout_s: float | None = None) -> dict | None:
        """Facts of the device (gpu_name, torch_version, ...) from the first judge that finished starting (waits for
        one; None if none started within the timeout)."""
        self._info_ready.wait(timeout_s if timeout_s is not None else self.config.start_timeout_s)
        return self._info

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        os.close(self._run_dir_lock)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- processes ----------------------------------------------------------------------------------------------
    def _workdir(self, kind: str, device: str) -> str:
        workdir = os.path.join(self.run_dir, f"{kind}{device}-{next(self._counter)}")
        os.makedirs(workdir)
        return workdir

    def _env(self, workdir: str, device: str) -> dict[str, str]:
        cfg = self.config
        env = {"OMP_NUM_THREADS": str(max(1, cfg.cpu_threads)),
               "PYTHONDONTWRITEBYTECODE": "1", "TORCH_EXTENSIONS_DIR": os.path.join(workdir, "torch_extensions"),
               "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
        env["CUDA_VISIBLE_DEVICES"] = _physical_device(device) if cfg.device_type == "cuda" else ""
        env.update(cfg.extra_env)
        return env

    def _spawn_with_socket(self, module: str, device: str, workdir: str, extra_args: list[str],
                           intent: bool = False):
        cfg = self.config
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        lock = self._open_lock(device)
        fds = [theirs.fileno(), lock]
        argv = [cfg.python, "-m", module, "--device-type", cfg.device_type, "--cpu-threads", str(cfg.cpu_threads),
                "--channel-fd", "3", "--device-lock-fd", "4", *extra_args]
        if intent:   # the judge's alone: a worker never needs to get past a sharer ahead of its turn
            fds.append(_open_lock(self._lock_file(device) + ".intent"))
            argv += ["--device-intent-fd", "5"]
        # The wall limit here only bounds a process nobody ever hands a job (the slot applies the job's timeout).
        limits = self._limits(cfg, cfg.start_timeout_s + 24 * 3600)
        try:
            process = self._spawn(argv, workdir, limits, self._env(workdir, device), pass_fds=tuple(fds))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            for fd in fds[1:]:
                os.close(fd)
        return process, ours

    def _start(self, device: str) -> _Worker:
        workdir = self._workdir("dev", device)
        process, sock = self._spawn_with_socket(
            "cuda_eval.worker", device, workdir,
            ["--start-timeout", f"{max(1.0, self.config.start_timeout_s - 3.0):.1f}"])
        return _Worker(process, workdir, time.monotonic(), sock)

    def _start_judge(self, device: str) -> _Judge:
        workdir = self._workdir("judge", device)
        process, sock = self._spawn_with_socket("cuda_eval.judge", device, workdir, [], intent=True)
        judge = _Judge(process, workdir, sock)
        try:
            header, _ = channel.recv(sock, deadline=time.monotonic() + self.config.start_timeout_s)
        except ChannelError as e:
            header = {"ok": False, "error": f"no answer ({e})"}
        if not header.get("ok"):
            _discard(judge)
            res = judge.process.wait(10.0)
            raise JudgeFailed(f"the judge process failed to start: {header.get('error', '')}\n"
                              + _text(res.get("stderr"))[-6000:])
        judge.info = header.get("info") or {}
        if self._info is None:
            self._info = judge.info
            self._info_ready.set()
        return judge

    def _lock_file(self, device: str) -> str:
        """The lock file of a device. A GPU's is machine-wide (`device_lock_dir`, named by the physical GPU) when
        that directory is ours and writable by us alone; otherwise (another user's, or one a candidate planted)
        the pool's own. The file is ours, 0600, opened without following links: processes get a descriptor of it
        (pass_fds), never its path, so no candidate can take the lock of a job that is not its own."""
        if self.config.device_type == "cuda" and self.config.device_lock_dir:
            directory = self.config.device_lock_dir
            name = "".join(c if c.isalnum() or c in "-_" else "_" for c in _physical_device(device))
            try:
                os.makedirs(directory, mode=0o755, exist_ok=True)
                st = os.lstat(directory)
                safe = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
            except OSError:
                safe = False
            if not safe:
                log.warning("device lock dir %s is not a directory of ours writable by us alone: locking per pool "
                            "(two evaluators on one GPU may then time at once)", directory)
                directory = self.run_dir
        else:
            directory, name = self.run_dir, device
        path = os.path.join(directory, f"device-{name}.lock")
        os.close(_open_lock(path))
        return path

    def _open_lock(self, device: str) -> int:
        """A new open file description of the device's lock file (flock locks belong to one)."""
        return _open_lock(self._lock_file(device))

    def share(self, device: str) -> "DeviceShare":
        """What a trainer holds while it runs its own work (sampling) on this pool's GPU `device`: see DeviceShare."""
        path = self._lock_file(device)
        return DeviceShare(path, path + ".intent")

    def _await_ready(self, worker: _Worker) -> bool:
        """The worker's "ready" on its socket (untrusted only in form: no candidate code has run in it yet)."""
        try:
            header, _ = channel.recv(worker.sock, deadline=worker.started + self.config.start_timeout_s)
        except ChannelError as e:
            worker.ready_error = f"no ready message ({e})"
            return False
        if header.get("op") != "ready" or not header.get("ok"):
            worker.ready_error = str(header.get("error", "not ready"))[:3000]
            return False
        worker.info = header.get("info") if isinstance(header.get("info"), dict) else {}
        return True

    # --- a device slot ------------------------------------------------------------------------------------------
    def _slot_loop(self, device: str) -> None:
        spares: collections.deque[_Worker] = collections.deque()
        judge: _Judge | None = None
        try:
            self._refill(device, spares)
            try:
                judge = self._start_judge(device)
            except JudgeFailed:
                judge = None  # tried again at the first job, which reports the failure
            while True:
                item = self._queue.get()
                if item is None:
                    break
                future, payload, timeout_s, queued_at = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    if judge is None or not _alive(judge.process) or judge.jobs >= JUDGE_MAX_JOBS:
                        if judge is not None:
                            _discard(judge)
                        judge = None
                        judge = self._start_judge(device)
                    outcome = self._run_job(device, spares, judge, payload, timeout_s, queued_at)
                    judge.jobs += 1
                    if outcome.judge_failed:
                        _discard(judge)
                        judge = None
                except JudgeFailed as e:
                    outcome = WorkerOutcome(result=None, device=device, start_failed=True, stderr_tail=str(e),
                                            queue_s=time.monotonic() - queued_at)
                except BaseException as e:  # a bug or an OS failure here must not hang the caller
                    future.set_exception(e)
                    continue
                future.set_result(outcome)
        finally:
            for worker in spares:
                _discard(worker)
            if judge is not None:
                try:
                    channel.send(judge.sock, {"op": "quit"})
                except ChannelError:
                    pass
                _discard(judge)

    def _refill(self, device: str, spares) -> None:
        while len(spares) < max(1, self.config.spares):
            try:
                spares.append(self._start(device))
            except Exception:  # spawn failures surface at the next job (it retries and reports)
                return

    def _run_job(self, device: str, spares, judge: _Judge, payload: dict, timeout_s: float,
                 queued_at: float) -> WorkerOutcome:
        worker = spares.popleft() if spares else self._start(device)
        failures = []
        while not self._await_ready(worker):
            failures.append(_reap(worker, device))
            if len(failures) >= 2:
                out = failures[-1]
                out.start_failed = True
                out.queue_s = time.monotonic() - queued_at
                self._refill(device, spares)
                return out
            worker = self._start(device)
        queue_s = time.monotonic() - queued_at
        started, started_at = time.monotonic(), time.time()
        try:
            channel.send_fd(judge.sock, {"op": "job", "payload": payload, "timeout_s": timeout_s,
                                         "worker_pid": getattr(worker.process, "pid", None)}, worker.sock.fileno())
        except OSError as e:
            _reap(worker, device)
            return WorkerOutcome(result=None, device=device, start_failed=True, judge_failed=True,
                                 stderr_tail=f"the judge is gone ({e})", queue_s=queue_s)
        worker.sock.close()  # the judge holds its own copy now
        self._refill(device, spares)
        verdict, judge_error, grant = None, "", None
        deadline = time.monotonic() + timeout_s + JUDGE_MARGIN_S
        try:
            while True:
                header, _ = channel.recv(judge.sock, max_header=256 << 20, deadline=deadline)
                if header.get("op") == "output_buffer":   # the judge knows the output's size: it asks us for it
                    if grant is not None:
                        grant.release()
                    grant = self._grant_output_buffer(judge.sock, header, deadline)
                    continue
                verdict = header.get("result") if header.get("op") == "verdict" else None
                if verdict is None:
                    judge_error = f"the judge answered {str(header)[:300]}"
                break
        except (ChannelError, OSError) as e:
            judge_error = f"the judge did not answer ({e})"
        finally:
            if grant is not None:
                grant.release()
        worker.process.kill()
        res = worker.process.wait(10.0)
        outcome = _outcome(worker, device, res)
        outcome.wall_s = time.monotonic() - started
        outcome.started_at = started_at
        outcome.queue_s = queue_s
        shutil.rmtree(worker.workdir, ignore_errors=True)
        if verdict is None:
            outcome.judge_failed, outcome.start_failed = True, True
            judge.process.kill()
            jres = judge.process.wait(10.0)
            outcome.stderr_tail = f"{judge_error}; judge stderr:\n" + _text(jres.get("stderr"))[-6000:]
            return outcome
        lost = verdict.get("lost")
        if lost:
            outcome.progress = {"phase": lost.get("phase"), **({"trial": lost["trial"]}
                                                               if lost.get("trial") is not None else {})}
            outcome.timed_out = lost.get("kind") == "timeout"
            outcome.lost_message = str(lost.get("message", ""))
        else:
            outcome.result = verdict
        return outcome

    # --- output buffers -----------------------------------------------------------------------------------------
    def _grant_output_buffer(self, sock: socket.socket, request: dict, deadline: float) -> "_OutputGrant | None":
        """Answers a judge's {"op": "output_buffer", "bytes", "host_bytes"}: a sealed memfd of `bytes` (channel.
        output_memfd, made here where no candidate's limit applies, left out of the sandboxes' disk quotas), or
        {"ok": False, "error", ...} when the host cannot hold the job's outputs (the judge then gives the task-level
        verdict task_too_large). A request beyond what other jobs' buffers leave waits for them, up to `deadline`."""
        size, host = request.get("bytes"), request.get("host_bytes", 0)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (size, host)):
            channel.send(sock, {"op": "output_buffer", "ok": False, "error": f"malformed request {request!r:.200}"})
            return None
        need = size + host
        try:
            token = self._reserve_host_memory(need, deadline)
        except MemoryError as e:
            channel.send(sock, {"op": "output_buffer", "ok": False, "error": str(e), "needed_bytes": need,
                                "available_bytes": getattr(e, "available", None)})
            return None
        try:
            fd = channel.output_memfd(size)
        except OSError as e:
            self._release_host_memory(token)
            channel.send(sock, {"op": "output_buffer", "ok": False, "needed_bytes": need,
                                "error": f"an output buffer of {size} bytes could not be made ({e})"})
            return None
        from cuda_eval.sandbox.quota import exempt_from_disk_quota
        grant = _OutputGrant(self, token, fd, exempt_from_disk_quota(fd))
        try:
            channel.send_fd(sock, {"op": "output_buffer", "ok": True, "bytes": size}, fd)
        except OSError:
            grant.release()
            raise
        return grant

    def _reserve_host_memory(self, need: int, deadline: float) -> int:
        """A token for `need` bytes of host memory (MemoryError with the reason when the host cannot hold them)."""
        cap = self.config.output_memory_bytes
        if cap is not None and need > cap:
            raise _too_large(f"the job's outputs need {_gib(need)} of host memory, over the evaluator's limit of "
                             f"{_gib(cap)} (output_memory_bytes)", cap)
        # The judge's memory cgroup is charged for the buffer's pages (on a GPU it pins them, the first to touch
        # them) and for its host copies: both within its limit (data_bytes), beside what the process itself takes.
        limit = self.config.data_bytes
        if limit is not None and need > UNCHECKED_OUTPUT_BYTES and need > limit - JUDGE_OWN_MEMORY:
            raise _too_large(f"the job's outputs need {_gib(need)} of host memory in the judge's process, whose limit "
                             f"is {_gib(limit)} (data_bytes; {_gib(JUDGE_OWN_MEMORY)} of it for the process itself)",
                             max(0, limit - JUDGE_OWN_MEMORY))
        with self._memory:
            token = next(self._counter)
            while need > UNCHECKED_OUTPUT_BYTES:
                others = sum(self._granted.values())
                free = host_memory.host_memory_available() - (self.config.host_memory_reserve_bytes
                                                              or host_memory.host_memory_reserve())
                if need <= free - others:
                    break
                if not others:
                    raise _too_large(f"the job's outputs need {_gib(need)} of host memory for the output channel "
                                     f"and the judge's copies; this machine has {_gib(max(0, free))} available",
                                     max(0, free))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _too_large(f"the job's outputs need {_gib(need)} of host memory; other jobs held "
                                     f"{_gib(others)} of {_gib(max(0, free))} until the job's time ran out",
                                     max(0, free - others))
                self._memory.wait(min(left, 1.0))
            self._granted[token] = need
            return token

    def _release_host_memory(self, token: int) -> None:
        with self._memory:
            self._granted.pop(token, None)
            self._memory.notify_all()


@dataclasses.dataclass
class _OutputGrant:
    pool: GpuPool
    token: int
    fd: int
    quota_key: tuple

    def release(self) -> None:
        """Our descriptor closed (the memory goes when the judge and the worker have closed theirs too)."""
        if self.fd < 0:
            return
        from cuda_eval.sandbox.quota import end_disk_quota_exemption
        end_disk_quota_exemption(self.quota_key)
        os.close(self.fd)
        self.fd = -1
        self.pool._release_host_memory(self.token)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _too_large(message: str, available: int | None) -> MemoryError:
    e = MemoryError(message)
    e.available = available
    return e


class RunDirInUse(RuntimeError):
    """Another evaluator's pool is using this run dir."""


_WORKDIR_NAME = re.compile(r"(dev|judge).*-[0-9]+")  # what _workdir names them


def _claim_run_dir(run_dir: str) -> int:
    """An exclusive flock on <run_dir>/.pool.lock for the pool's lifetime (the descriptor): two pools in one run dir
    would create and delete each other's worker dirs. Worker dirs left there by a pool that died are removed."""
    fd = os.open(os.path.join(run_dir, ".pool.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirInUse(f"the run dir {run_dir} is in use by another evaluator (pid {holder}): two evaluators "
                          "cannot share one (each creates and removes its workers' directories there). Give each "
                          "its own EvalConfig.run_dir, or leave it empty for a temporary one") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    for e in os.scandir(run_dir):
        if _WORKDIR_NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
    return fd


class JudgeFailed(RuntimeError):
    """The judge process could not be started (the job is reported as the evaluator's failure)."""


class DeviceShare:
    """Shared use of a GPU next to the evaluator's timing: `with share:` around each device call of other work on
    the same GPU (the JAX sampler of configs/one_gpu.py). Inside, no judge times on it; a judge that wants to time
    waits for the holder to leave, and a holder waits for a timing in progress or wanted (the judge's intent) to
    end. Hold it for one device call at a time (the decode call, a prefill), never a whole generate: timing then
    waits at most one call. Reusable, not re-entrant. The files are the pool's (`GpuPool.share`) or, for a process
    without a pool, the machine-wide ones of a physical GPU (`for_gpu`)."""

    def __init__(self, lock_path: str, intent_path: str):
        self.lock_fd = _open_lock(lock_path)
        self.intent_fd = _open_lock(intent_path)
        self.waited_s = 0.0      # total time spent waiting for timings (what sharing costs the holder)
        self.holds = 0

    @classmethod
    def for_gpu(cls, physical_gpu: str, lock_dir: str | None = None) -> "DeviceShare":
        directory = lock_dir or PoolConfig.device_lock_dir
        os.makedirs(directory, mode=0o755, exist_ok=True)
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in str(physical_gpu))
        path = os.path.join(directory, f"device-{name}.lock")
        return cls(path, path + ".intent")

    def __enter__(self) -> "DeviceShare":
        t0 = time.monotonic()
        fcntl.flock(self.intent_fd, fcntl.LOCK_SH)   # a judge waiting to time goes first
        fcntl.flock(self.intent_fd, fcntl.LOCK_UN)
        fcntl.flock(self.lock_fd, fcntl.LOCK_SH)
        self.waited_s += time.monotonic() - t0
        self.holds += 1
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def close(self) -> None:
        for fd in (self.lock_fd, self.intent_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _open_lock(path: str) -> int:
    """An O_RDONLY descriptor of a lock file of ours (created 0600; never through a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"lock file {path} is not a regular file of ours")
    return fd


def _physical_device(index: str) -> str:
    """Device `index` among the GPUs this process may use (our CUDA_VISIBLE_DEVICES, if set, maps it)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and "CUDA_VISIBLE_DEVICES" in os.environ:
        return visible[int(index)]
    return index


def _alive(process) -> bool:
    """True while the process runs (the sandbox's `alive`; else /proc: a zombie until wait() reaps it)."""
    alive = getattr(process, "alive", None)
    if alive is not None:
        return bool(alive)
    pid = process.pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _text(data) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data or ""


def _outcome(worker: _Worker, device: str, res: dict) -> WorkerOutcome:
    return WorkerOutcome(result=None, device=device, exit_code=res.get("exit_code"), signal=res.get("signal"),
                         timed_out=bool(res.get("timed_out")), peak_rss_bytes=res.get("peak_rss_bytes"),
                         stderr_tail=(worker.ready_error + "\n" if worker.ready_error else "")
                         + _text(res.get("stderr"))[-8000:],
                         stdout_tail=_text(res.get("stdout"))[-2000:], worker_info=worker.info)


def _reap(worker: _Worker, device: str) -> WorkerOutcome:
    worker.process.kill()
    res = worker.process.wait(10.0)
    outcome = _outcome(worker, device, res)
    if worker.sock is not None:
        worker.sock.close()
    shutil.rmtree(worker.workdir, ignore_errors=True)
    return outcome


def _discard(proc) -> None:
    try:
        proc.process.kill()
        proc.process.wait(10.0)
    except Exception:  # already gone
        pass
    if proc.sock is not None:
        proc.sock.close()
    shutil.rmtree(proc.workdir, ignore_errors=True)
