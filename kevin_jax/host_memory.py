"""A watch on the host's available memory while the trainer runs (config `gpu.host_memory_floor`).

Why: a host that runs out of memory does not always kill anything. With most of its RAM pinned (an offloaded
optimiser state: XLA's pinned-host pools cannot be paged out) and no swap, the kernel reclaims the last page cache
(the code of every process) over and over and the machine crawls: the full-size Kevin-32B run on 4 GPUs sat 13
minutes that way, all 503 GiB of its memory in use, until its time limit (docs/LOG.md, 2026-11-27, "4 x H200"); the
memory had filled at 4 GiB/s. So the guard acts early and fast: when the available memory (cuda_eval's reading, the
one its output buffers are granted by: MemAvailable, bounded by a container's limit) stays under the floor for
HOLD_S, or falls under half of it once, it logs the numbers and the largest processes and raises HostMemoryError in
the main thread (the run's clean-up runs; launch/train.py exits with EXIT_STATUS); if the run has not left the guard
GRACE_S later (a thread stuck in a device call), it ends the process.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from cuda_eval.api import host_memory_available, host_memory_total

log = logging.getLogger(__name__)

HOLD_S = 5.0           # under the floor this long (not a passing dip: a checkpoint's buffers, an evaluator burst) ...
POLL_S = 0.5
GRACE_S = 30.0         # after interrupting the main thread, how long before the process is ended
EXIT_STATUS = 75       # EX_TEMPFAIL: the machine, not the run's inputs
STOP_SIGNAL = signal.SIGUSR1   # our own signal: SIGINT is ignored by background jobs of a non-interactive shell
GiB = 1 << 30


class HostMemoryError(BaseException):
    """The host ran out of memory during the run (HostMemoryGuard). A BaseException, like KeyboardInterrupt: the
    run's `except Exception` blocks (a lost evaluation, a sampler fallback) must not swallow it."""


def largest_processes(n: int = 5, proc: str = "/proc") -> list[tuple[int, str, int]]:
    """(pid, name, resident bytes) of the n processes with the most resident memory ([] without /proc)."""
    rows = []
    try:
        entries = list(Path(proc).iterdir())
    except OSError:
        return []
    for d in entries:
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss = fields.get("VmRSS", "0 kB").split()
        if rss and rss[0].isdigit():
            rows.append((int(d.name), fields.get("Name", "?").strip(), int(rss[0]) * 1024))
    return sorted(rows, key=lambda r: -r[2])[:n]


def floor_bytes(fraction: float) -> int:
    """gpu.host_memory_floor (a fraction of the host's memory, or its container's) in bytes; 0 where it is off."""
    return int(fraction * host_memory_total()) if fraction > 0 else 0


class HostMemoryGuard:
    """Context manager: a daemon thread that calls `on_breach(message)` once when the host's available memory has
    been under `floor_bytes` for `hold_s`, or under half of it once. `read` returns the available bytes (None: no
    reading, the guard stops). The default action is `stop_run`."""

    def __init__(self, floor_bytes: int, hold_s: float = HOLD_S, poll_s: float = POLL_S,
                 read: Callable[[], int | None] = host_memory_available,
                 on_breach: Callable[[str], None] | None = None):
        self.floor_bytes, self.hold_s, self.poll_s = int(floor_bytes), hold_s, poll_s
        self.read, self.on_breach = read, on_breach or self.stop_run
        self.message: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()      # the stop and a signal to the main thread never cross
        self._thread: threading.Thread | None = None
        self._previous_handler = None
        self._on_main_thread = False
        self._leaving = False
        self._sent = False                 # our stop signal is on its way (the next one that arrives is ours)

    def _available(self) -> int | None:
        try:
            return self.read()
        except (OSError, ValueError):     # no reading on this system: no watch
            return None

    def __enter__(self) -> "HostMemoryGuard":
        if self.floor_bytes <= 0 or self._available() is None:
            return self
        self._on_main_thread = threading.current_thread() is threading.main_thread()
        if self._on_main_thread:
            self._previous_handler = signal.signal(STOP_SIGNAL, self._raise)
        self._thread = threading.Thread(target=self._watch, name="host-memory-guard", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._leaving = True              # from here a stop signal is not raised: the run is over
        try:
            with self._lock:
                self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=2 * self.poll_s + 1)
        finally:
            if self._on_main_thread:
                previous = self._previous_handler
                signal.signal(STOP_SIGNAL, previous if previous is not None else signal.SIG_DFL)
                self._on_main_thread = False

    def _raise(self, signum, frame) -> None:
        leaving = self._leaving or (frame is not None and frame.f_code is HostMemoryGuard.__exit__.__code__)
        if self._sent and not leaving:
            self._sent = False
            raise HostMemoryError(self.message)
        if self._sent:                    # ours, but the run is over: nothing to stop
            self._sent = False
            return
        previous = self._previous_handler  # not ours: what was there before the guard
        if callable(previous):
            previous(signum, frame)
        else:
            log.warning("signal %d arrived while the host-memory guard held it: ignored", signum)

    def stop_run(self, message: str) -> None:
        """HostMemoryError in the main thread, once (only when the guard was entered there: another thread's run
        cannot be interrupted; a BaseException, so the run's `except Exception` blocks let it through to its
        clean-up); if the run has not left the guard GRACE_S later, end the process."""
        with self._lock:
            if self._stop.is_set():           # the run has left the guard
                return
            if self._on_main_thread:
                self._sent = True
                signal.pthread_kill(threading.main_thread().ident, STOP_SIGNAL)
        if not self._stop.wait(GRACE_S):
            log.error("the run did not stop within %.0f s of the host-memory error: ending the process", GRACE_S)
            logging.shutdown()
            os._exit(EXIT_STATUS)

    def _watch(self) -> None:
        under_since = None
        while not self._stop.wait(self.poll_s):
            available = self._available()
            if available is None:
                return
            if available >= self.floor_bytes:
                under_since = None
                continue
            now = time.monotonic()
            under_since = now if under_since is None else under_since
            if now - under_since >= self.hold_s or available < self.floor_bytes // 2:
                top = ", ".join(f"{name} (pid {pid}) {rss / GiB:.1f} GiB" for pid, name, rss in largest_processes())
                self.message = (
                    f"host memory exhausted: {available / GiB:.1f} GiB available of {host_memory_total() / GiB:.0f} "
                    f"GiB (floor gpu.host_memory_floor: {self.floor_bytes / GiB:.1f} GiB); stopping the run before "
                    f"the machine thrashes. Largest processes: {top or 'unknown'}. With optim.offload=pinned_host the "
                    f"optimiser state's pools are pinned: run fewer evaluator processes (eval.spare_workers, "
                    f"eval.compile_workers, eval.devices) or shard the state over more hosts")
                log.error("%s", self.message)
                self.on_breach(self.message)
                return
