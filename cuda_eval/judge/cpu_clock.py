"""The CPU time of a worker's processes, read by the judge from outside them (the CPU device's clock: docs/
EVALUATOR.md, "Timing"). Kernel accounting only: nothing the candidate's process does changes it.

A process's CPU time is read as its thread group's total, which keeps the time of threads that have exited (a live
thread's schedstat does not: a C11 or pthread thread that does the work and exits before the judge reads would be
missed), plus the time of its children it has reaped (cutime + cstime); live children and their own descendants
are walked (/proc/<pid>/task/*/children) and read the same way.
"""
from __future__ import annotations

import os
import time

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CPUCLOCK_SCHED = 2   # the kernel's clockid of a process's CPU clock: ((~pid) << 3) | CPUCLOCK_SCHED (no per-thread bit)


def process_cpu_clock(pid: int) -> int:
    """clock_getcpuclockid(pid): the clock of the whole thread group's CPU time, exited threads included (ns)."""
    return ((~pid) << 3) | _CPUCLOCK_SCHED


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()   # after the command name, which may hold spaces and parentheses


def process_cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds of `pid`'s thread group (exited threads included) and of the children it has reaped; None if
    it cannot be read."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:   # fields 14..17 of stat (1-based): utime stime cutime cstime, in clock ticks
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    except (ValueError, IndexError):
        return None
    try:
        own = time.clock_gettime_ns(process_cpu_clock(pid))   # nanoseconds, where the kernel lets us
    except (OSError, OverflowError):
        own = (utime + stime) * 1_000_000_000 // _TICKS      # the same total in ticks (10 ms on most kernels)
    return own + (cutime + cstime) * 1_000_000_000 // _TICKS


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass   # a thread that just ended
    return out


def process_tree_cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds of `pid` and of its descendants (each a thread group's total, exited threads and reaped
    children included); None if `pid` cannot be read."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        ns = process_cpu_ns(p)
        if ns is None:
            if p == pid:
                return None
            continue   # a child that just exited (its parent's cutime has it once reaped)
        total += ns
        todo.extend(_children(p))
    return total
