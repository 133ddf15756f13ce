"""The host's memory as the OS reports it: its total and what is still available, within this process's memory
cgroup where it has a limit (a container). The GPU pool grants output buffers by them; the trainer sizes its
optimiser's pinned pools and watches its floor by the same reading (re-exported by cuda_eval.api)."""
from __future__ import annotations

import os

HOST_MEMORY_RESERVE = 2 << 30     # host memory an output buffer must leave free (the processes' own needs) ...
HOST_MEMORY_RESERVE_FRACTION = 0.02  # ... or this share of the host's memory, if more (the default; a trainer beside
#                                      us sets EvalConfig.host_memory_reserve_gib from the floor it stops at, since a
#                                      host out of memory with most of it pinned thrashes)


def host_memory_reserve() -> int:
    """Host memory an output buffer must leave free: HOST_MEMORY_RESERVE, or HOST_MEMORY_RESERVE_FRACTION of the
    host's memory (its container's, where that is less) on a large host."""
    return max(HOST_MEMORY_RESERVE, int(HOST_MEMORY_RESERVE_FRACTION * host_memory_total()))


def _cgroup_memory() -> tuple[int, int, str] | None:
    """(limit, usage, cgroup directory) of this process's memory cgroup where it has a limit (v2, else v1)."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            return int(limit), usage, os.path.dirname(limit_file)
        return None
    return None


def host_memory_total() -> int:
    """Bytes of memory of this host, or of its container's memory cgroup where that is less."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_memory()
    return min(total, cgroup[0]) if cgroup else total


def host_memory_available() -> int:
    """Bytes of memory this process's jobs can still take: MemAvailable, bounded by our cgroup's limit (a container's
    memory.max counts the output buffers' shared memory too)."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup = _cgroup_memory()
    if cgroup:
        limit, usage, directory = cgroup
        avail = min(avail, max(0, limit - usage + _cgroup_inactive_file(directory)))
    return avail


def _cgroup_inactive_file(directory: str) -> int:
    """Page cache of the cgroup that the kernel drops before it fails an allocation (counted in its usage)."""
    try:
        with open(os.path.join(directory, "memory.stat")) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name in ("inactive_file", "total_inactive_file"):
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0
