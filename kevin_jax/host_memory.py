"""A watch on the host's available memory while the trainer runs (config `gpu.host_memory_floor`).

Why: a host that runs out of memory does not always kill anything. With most of its RAM pinned (an offloaded
optimiser state: XLA's pinned-host pools cannot be paged out) and no swap, the kernel reclaims the last page cache
(the code of every process) over and over and the machine crawls: the full-size Kevin-32B run on 4 GPUs sat 13
minutes that way, all 503 GiB of its memory in use, until its time limit (docs/LOG.md, 2026-11-27, "4 x H200"). The
guard turns that into a clear error within seconds: when the available memory (MemAvailable: free memory and what
the kernel can reclaim) stays under the floor for HOLD_S, it logs the numbers and the largest processes, interrupts
the main thread, and, if the run has not stopped GRACE_S later (a thread stuck in a device call), ends the process
with EXIT_STATUS. Linux only (/proc); elsewhere it does nothing.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

HOLD_S = 15.0          # under the floor this long (not a passing dip: a checkpoint's buffers, an evaluator burst)
POLL_S = 1.0
GRACE_S = 30.0         # after interrupting the main thread, how long before the process is ended
EXIT_STATUS = 75       # EX_TEMPFAIL: the machine, not the run's inputs
GiB = 1 << 30


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes ({} where there is none)."""
    out: dict[str, int] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def available_bytes() -> int | None:
    """MemAvailable in bytes, or None where the kernel does not say."""
    return meminfo().get("MemAvailable")


def largest_processes(n: int = 5, proc: str = "/proc") -> list[tuple[int, str, int]]:
    """(pid, name, resident bytes) of the n processes with the most resident memory."""
    rows = []
    for d in Path(proc).iterdir():
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


class HostMemoryGuard:
    """Context manager: a daemon thread that calls `on_breach(message)` once when the host's available memory has
    been under `floor_bytes` for `hold_s`. `read` returns the available bytes (None: no reading, the guard stops)."""

    def __init__(self, floor_bytes: int, hold_s: float = HOLD_S, poll_s: float = POLL_S,
                 read: Callable[[], int | None] = available_bytes,
                 on_breach: Callable[[str], None] | None = None):
        self.floor_bytes, self.hold_s, self.poll_s = int(floor_bytes), hold_s, poll_s
        self.read, self.on_breach = read, on_breach or self.end_run
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "HostMemoryGuard":
        if self.floor_bytes > 0 and self.read() is not None:
            self._thread = threading.Thread(target=self._watch, name="host-memory-guard", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.poll_s + 1)

    def end_run(self, message: str) -> None:
        """The default action: SIGINT to the main thread (KeyboardInterrupt, even out of a blocking call: the run's
        cleanup runs and leaves the guard); if the run has not left it GRACE_S later, end the process."""
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        if not self._stop.wait(GRACE_S):
            log.error("the run did not stop within %.0f s of the host-memory error: ending the process", GRACE_S)
            logging.shutdown()
            os._exit(EXIT_STATUS)

    def _watch(self) -> None:
        under_since = None
        while not self._stop.wait(self.poll_s):
            available = self.read()
            if available is None:
                return
            if available >= self.floor_bytes:
                under_since = None
                continue
            now = time.monotonic()
            under_since = now if under_since is None else under_since
            if now - under_since >= self.hold_s:
                total = meminfo().get("MemTotal", 0)
                top = ", ".join(f"{name} (pid {pid}) {rss / GiB:.1f} GiB" for pid, name, rss in largest_processes())
                self.message = (
                    f"host memory exhausted: {available / GiB:.1f} GiB available of {total / GiB:.0f} GiB for "
                    f"{now - under_since:.0f} s (floor gpu.host_memory_floor: {self.floor_bytes / GiB:.1f} GiB); "
                    f"stopping the run before the machine thrashes. Largest processes: {top or 'unknown'}. "
                    f"With optim.offload=pinned_host the optimiser state's pools are pinned: run fewer evaluator "
                    f"processes (eval.spare_workers, eval.devices) or shard the state over more hosts")
                log.error("%s", self.message)
                self.on_breach(self.message)
                return


def floor_bytes(fraction: float, meminfo_path: str = "/proc/meminfo") -> int:
    """gpu.host_memory_floor (a fraction of the host's memory) in bytes; 0 where it is off or unknown."""
    total = meminfo(meminfo_path).get("MemTotal", 0)
    return int(fraction * total) if fraction > 0 else 0
