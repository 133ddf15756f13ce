"""Pre-started worker processes per device; one candidate per process; one candidate per GPU at a time.

Each device slot owns a thread and keeps `spares` *spare* workers (`python -m cuda_eval.worker`) starting or
started: they import torch, warm up, initialise CUDA, then block on stdin. A job is handed to the oldest spare
(job.json in its working directory, the path on stdin), a new spare is started at once, and the slot waits for the
job with its timeout. Start-up is therefore hidden as long as a job takes longer than start-up / spares. All
workers of one GPU share a lock file (machine-wide, named by the physical GPU, so also across pools): a worker holds
an exclusive flock on it while it initialises CUDA and while it times, so a spare starting up never disturbs a
measurement. Jobs come from one queue shared by all slots, so the GPUs of a machine drain it together.

Workers run through the sandbox of cuda_eval.sandbox (own session/process group, scrubbed environment, confined
working directory, limits, kill of the whole group at the timeout). Whatever a worker does (segfault, illegal
address, hang, os._exit), the slot reports a WorkerOutcome with exit code, signal, stderr tail and the last phase the
worker reached, and the next job runs on a fresh process.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable

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
    file_size_bytes: int = 4 << 30
    extra_env: dict = dataclasses.field(default_factory=dict)
    # A GPU's timing lock is machine-wide, named by the physical GPU: two evaluators on one GPU (two trainers, or a
    # trainer and launch/eval.py) must not time at the same time either. CPU-mode slots are virtual: per pool.
    device_lock_dir: str = os.environ.get("CUDA_EVAL_DEVICE_LOCK_DIR", "/tmp/cuda_eval_device_locks")


@dataclasses.dataclass
class WorkerOutcome:
    """What happened to one job. `result` is the worker's result.json (None when it crashed or timed out)."""
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


@dataclasses.dataclass
class _Worker:
    process: Any
    workdir: str
    started: float
    info: dict | None = None


def default_spawn(argv: list[str], workdir: str, limits: Any, env: dict[str, str]):
    """Start a worker through the native sandbox (cuda_eval.sandbox, part 1). It dies with its slot thread: the
    job's timeout is enforced by that thread, so a worker whose evaluator was killed (a run cut by `timeout`) would
    otherwise keep going unwatched, e.g. a hung kernel spinning on the GPU for hours under the next run's timings
    (docs/LOG.md, session 8). Safe because the slot thread starts, waits for and discards its own workers."""
    from cuda_eval import sandbox
    return sandbox.spawn_sandboxed(argv, workdir, limits, extra_env=env, die_with_parent_thread=True)


def default_limits(config: PoolConfig, timeout_s: float):
    from cuda_eval import sandbox
    return sandbox.SandboxLimits(address_space_bytes=config.address_space_bytes, cpu_seconds=config.cpu_seconds,
                                 open_files=config.open_files, file_size_bytes=config.file_size_bytes,
                                 processes=config.processes, wall_timeout_s=timeout_s,
                                 output_cap_bytes=config.output_cap_bytes)


class GpuPool:
    """`submit(payload, timeout_s) -> Future[WorkerOutcome]`; `device_info()`; `close()` (also a context manager).
    `spawn(argv, workdir, limits, env)` and `limits(config, timeout_s)` can be replaced (tests)."""

    def __init__(self, config: PoolConfig, *, spawn: Callable | None = None, limits: Callable | None = None):
        self.config = config
        self._spawn = spawn or default_spawn
        self._limits = limits or default_limits
        self._own_run_dir = config.run_dir is None
        self.run_dir = config.run_dir or tempfile.mkdtemp(prefix="cuda_eval_workers_")
        os.makedirs(self.run_dir, exist_ok=True)
        os.chmod(self.run_dir, 0o755)
        self._queue: queue.Queue = queue.Queue()
        self._counter = itertools.count()
        self._info: dict | None = None
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
        """Facts of the device (gpu_name, torch_version, ...) from the first worker that finished starting (waits
        for one; None if none started within the timeout)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.config.start_timeout_s)
        while self._info is None and time.monotonic() < deadline:
            for name in sorted(os.listdir(self.run_dir)):
                try:
                    with open(os.path.join(self.run_dir, name, "ready.json")) as f:
                        info = json.load(f)
                except (OSError, ValueError):
                    continue
                if info.get("ok"):
                    self._info = info
                    break
            else:
                time.sleep(0.05)
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- a device slot ------------------------------------------------------------------------------------------
    def _start(self, device: str) -> _Worker:
        workdir = os.path.join(self.run_dir, f"dev{device}-{next(self._counter)}")
        os.makedirs(workdir)
        os.chmod(workdir, 0o777)  # the sandbox may run the worker under its own uid
        cfg = self.config
        env = {"OMP_NUM_THREADS": str(max(1, cfg.cpu_threads)),
               "PYTHONDONTWRITEBYTECODE": "1", "TORCH_EXTENSIONS_DIR": os.path.join(workdir, "torch_extensions"),
               "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
        env["CUDA_VISIBLE_DEVICES"] = _physical_device(device) if cfg.device_type == "cuda" else ""
        env.update(cfg.extra_env)
        argv = [cfg.python, "-m", "cuda_eval.worker", "--device-type", cfg.device_type,
                "--cpu-threads", str(cfg.cpu_threads), "--device-lock", self._lock_file(device),
                "--start-timeout", f"{max(1.0, cfg.start_timeout_s - 3.0):.1f}"]
        # The wall limit here only bounds a worker nobody ever hands a job (wait() applies the job's own timeout).
        limits = self._limits(cfg, cfg.start_timeout_s + 24 * 3600)
        process = self._spawn(argv, workdir, limits, env)
        return _Worker(process, workdir, time.monotonic())

    def _lock_file(self, device: str) -> str:
        if self.config.device_type == "cuda" and self.config.device_lock_dir:
            directory = self.config.device_lock_dir
            name = "".join(c if c.isalnum() or c in "-_" else "_" for c in _physical_device(device))
            if not os.path.isdir(directory):
                os.makedirs(directory, exist_ok=True)
                _chmod_if_owner(directory, 0o1777)   # like /tmp: every user's pools, sandboxed workers included
        else:
            directory, name = self.run_dir, device
        path = os.path.join(directory, f"device-{name}.lock")
        if not os.path.exists(path):
            with open(path, "a"):
                pass
            _chmod_if_owner(path, 0o666)
        return path

    def _await_ready(self, worker: _Worker) -> bool:
        path = os.path.join(worker.workdir, "ready.json")
        deadline = worker.started + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(path):
                try:
                    with open(path) as f:
                        worker.info = json.load(f)
                except (OSError, ValueError):
                    worker.info = None
                if worker.info is not None:
                    return bool(worker.info.get("ok"))
            if not _alive(worker.process):
                return False
            time.sleep(0.01)
        return False

    def _slot_loop(self, device: str) -> None:
        spares: collections.deque[_Worker] = collections.deque()
        try:
            self._refill(device, spares)
            while True:
                item = self._queue.get()
                if item is None:
                    break
                future, payload, timeout_s, queued_at = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    outcome = self._run_job(device, spares, payload, timeout_s, queued_at)
                except BaseException as e:  # a bug or an OS failure here must not hang the caller
                    future.set_exception(e)
                    continue
                future.set_result(outcome)
        finally:
            for worker in spares:
                _discard(worker)

    def _refill(self, device: str, spares) -> None:
        while len(spares) < max(1, self.config.spares):
            try:
                spares.append(self._start(device))
            except Exception:  # spawn failures surface at the next job (it retries and reports)
                return

    def _run_job(self, device: str, spares, payload: dict, timeout_s: float, queued_at: float) -> WorkerOutcome:
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
        if self._info is None and worker.info:
            self._info = worker.info
        queue_s = time.monotonic() - queued_at
        job_path = os.path.join(worker.workdir, "job.json")
        with open(job_path, "w") as f:
            json.dump(payload, f)
        os.chmod(job_path, 0o644)
        worker.process.write_stdin((job_path + "\n").encode())
        worker.process.close_stdin()
        started, started_at = time.monotonic(), time.time()
        self._refill(device, spares)
        res = worker.process.wait(timeout_s)
        outcome = _collect(worker, device, res)
        outcome.wall_s = time.monotonic() - started
        outcome.started_at = started_at
        outcome.queue_s = queue_s
        shutil.rmtree(worker.workdir, ignore_errors=True)
        return outcome


def _chmod_if_owner(path: str, mode: int) -> None:
    """Another user's pool may have created the shared lock directory or file; it set the mode already."""
    try:
        os.chmod(path, mode)
    except PermissionError:
        pass


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


def _collect(worker: _Worker, device: str, res: dict) -> WorkerOutcome:
    def load(name: str) -> dict | None:
        try:
            with open(os.path.join(worker.workdir, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    return WorkerOutcome(result=load("result.json"), device=device, exit_code=res.get("exit_code"),
                         signal=res.get("signal"), timed_out=bool(res.get("timed_out")), progress=load("progress.json"),
                         stderr_tail=_text(res.get("stderr"))[-8000:], stdout_tail=_text(res.get("stdout"))[-2000:],
                         worker_info=worker.info)


def _reap(worker: _Worker, device: str) -> WorkerOutcome:
    worker.process.kill()
    res = worker.process.wait(10.0)
    outcome = _collect(worker, device, res)
    shutil.rmtree(worker.workdir, ignore_errors=True)
    return outcome


def _discard(worker: _Worker) -> None:
    try:
        worker.process.kill()
        worker.process.wait(10.0)
    except Exception:  # already gone
        pass
    shutil.rmtree(worker.workdir, ignore_errors=True)
