"""The trainer's watch on the host's available memory (kevin_jax.host_memory): a host out of memory with most of it
pinned thrashes instead of failing, so the run must stop itself with an error."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from kevin_jax import host_memory

linux = pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux /proc")


@linux
def test_meminfo_reads_this_hosts_memory():
    info = host_memory.meminfo()
    assert info["MemTotal"] > 1 << 28 and 0 < info["MemAvailable"] <= info["MemTotal"]
    assert host_memory.available_bytes() == pytest.approx(info["MemAvailable"], rel=0.5)
    assert host_memory.floor_bytes(0.01) == pytest.approx(info["MemTotal"] // 100, rel=0.01)
    assert host_memory.floor_bytes(0.0) == 0
    top = host_memory.largest_processes(3)
    assert top and all(rss >= 0 for _, _, rss in top) and top == sorted(top, key=lambda r: -r[2])


def test_meminfo_of_a_missing_file_is_empty(tmp_path):
    assert host_memory.meminfo(str(tmp_path / "none")) == {}
    assert host_memory.floor_bytes(0.01, str(tmp_path / "none")) == 0


def test_a_dip_shorter_than_the_hold_passes_a_long_one_stops_the_run():
    readings = iter([100, 5, 5, 100] + [5] * 1000)     # GiB-free stand-ins; the floor is 10

    def fake_available():
        return next(readings, 5)
    breaches = []
    with host_memory.HostMemoryGuard(10, hold_s=0.25, poll_s=0.05, read=fake_available,
                                     on_breach=breaches.append) as guard:
        deadline = time.monotonic() + 5
        while not breaches and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(breaches) == 1 and breaches[0] == guard.message
    assert "host memory exhausted" in guard.message and "eval.spare_workers" in guard.message


def test_no_floor_no_watch():
    calls = []
    with host_memory.HostMemoryGuard(0, poll_s=0.01, read=lambda: calls.append(1) or 0,
                                     on_breach=pytest.fail):
        time.sleep(0.1)
    assert calls == []


SCRIPT = textwrap.dedent("""
    import sys, time
    from kevin_jax import host_memory
    host_memory.GRACE_S = 1.0
    with host_memory.HostMemoryGuard(1 << 62, hold_s=0.2, poll_s=0.05):   # a floor above any host's memory
        try:
            time.sleep(30)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            if sys.argv[1] == "stop":
                sys.exit(3)
            time.sleep(30)            # a main thread that does not stop (stuck in a device call)
""")


@linux
@pytest.mark.parametrize("main_thread", ["stop", "stuck"])
def test_the_guard_interrupts_the_run_and_ends_a_stuck_one(main_thread):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", SCRIPT, main_thread], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert "interrupted" in p.stdout, p.stderr
    assert "host memory exhausted" in p.stderr
    assert p.returncode == (3 if main_thread == "stop" else host_memory.EXIT_STATUS)
    assert time.monotonic() - t0 < 20
