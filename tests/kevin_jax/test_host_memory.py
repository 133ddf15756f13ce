"""The trainer's watch on the host's available memory (kevin_jax.host_memory): a host out of memory with most of it
pinned thrashes instead of failing, so the run must stop itself with an error."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from kevin_jax import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
linux = pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux /proc")


@linux
def test_the_guard_reads_this_hosts_memory():
    from cuda_eval.api import host_memory_available, host_memory_total
    total = host_memory_total()
    assert 1 << 28 < total <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < host_memory_available() <= total
    assert host_memory.floor_bytes(0.01) == pytest.approx(total // 100, rel=0.01)
    assert host_memory.floor_bytes(0.0) == 0
    top = host_memory.largest_processes(3)
    assert top and top == sorted(top, key=lambda r: -r[2]) and any(pid == os.getpid() for pid, _, _ in
                                                                   host_memory.largest_processes(10 ** 6))


def _watch(readings, floor=10, hold_s=0.3, poll_s=0.02):
    """Runs a guard over fake readings (GiB-free stand-ins); returns (breach times, reading times)."""
    it, consumed = iter(readings), []

    def fake_available():
        value = next(it, readings[-1])
        consumed.append(time.monotonic())
        return value
    breaches = []
    with host_memory.HostMemoryGuard(floor, hold_s=hold_s, poll_s=poll_s, read=fake_available,
                                     on_breach=lambda m: breaches.append((time.monotonic(), m))) as guard:
        deadline = time.monotonic() + 5
        while not breaches and time.monotonic() < deadline:
            time.sleep(0.01)
    assert all(m == guard.message for _, m in breaches)
    return breaches, consumed


def test_a_dip_shorter_than_the_hold_passes_a_long_one_stops_the_run():
    # the first reading is __enter__'s; under the floor (10) but above half of it (5): 6
    breaches, consumed = _watch([100, 6, 6, 100] + [6] * 1000)
    assert len(breaches) == 1 and "host memory exhausted" in breaches[0][1] and "eval.spare_workers" in breaches[0][1]
    # it fired on the long stretch (from the 5th reading), a hold (0.3 s) after it began, not on the short dip
    assert len(consumed) > 5 and breaches[0][0] - consumed[4] >= 0.3
    assert len(_watch([100] * 50 + [6] * 3 + [100] * 1000, hold_s=30)[0]) == 0


def test_under_half_the_floor_stops_the_run_at_once():
    breaches, consumed = _watch([100, 100, 4] + [100] * 1000, hold_s=30)
    assert len(breaches) == 1 and len(consumed) == 3


def test_no_floor_no_watch():
    calls = []
    with host_memory.HostMemoryGuard(0, poll_s=0.01, read=lambda: calls.append(1) or 0, on_breach=pytest.fail):
        time.sleep(0.1)
    assert calls == []


SCRIPT = textwrap.dedent("""
    import signal, sys, time
    from kevin_jax import host_memory
    if sys.argv[2] == "sigint-ignored":       # a background job of a non-interactive shell
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    host_memory.GRACE_S = 2.0
    try:
        with host_memory.HostMemoryGuard(1 << 62, hold_s=0.2, poll_s=0.05):   # a floor above any host's memory
            try:
                time.sleep(30)
            except Exception:
                print("swallowed", flush=True)       # the run's own handlers must not catch it
            except host_memory.HostMemoryError as e:
                print("stopped:", str(e)[:40], flush=True)
                if sys.argv[1] == "stuck":
                    time.sleep(30)      # a main thread that does not stop (stuck in a device call)
                raise
    except host_memory.HostMemoryError:
        if signal.getsignal(host_memory.STOP_SIGNAL) is not signal.SIG_DFL:
            print("handler left installed", flush=True)
        sys.exit(host_memory.EXIT_STATUS)
""")


@linux
@pytest.mark.parametrize("main_thread,sigint", [("stops", "default"), ("stops", "sigint-ignored"),
                                                ("stuck", "default")])
def test_the_guard_stops_the_run_and_ends_a_stuck_one(main_thread, sigint):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", SCRIPT, main_thread, sigint], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert "stopped: host memory exhausted" in p.stdout, p.stderr
    assert "swallowed" not in p.stdout and "handler left installed" not in p.stdout
    assert p.returncode == host_memory.EXIT_STATUS, p.stderr
    assert ("did not stop within" in p.stderr) == (main_thread == "stuck")
    assert time.monotonic() - t0 < 25


@pytest.fixture
def stop_signals():
    """Stop signals that reach this process's main thread (a recording handler in place of the default, which would
    end the test process)."""
    import signal
    seen = []
    previous = signal.signal(host_memory.STOP_SIGNAL, lambda *a: seen.append(a))
    yield seen
    signal.signal(host_memory.STOP_SIGNAL, previous)


def test_a_guard_off_the_main_thread_does_not_signal_the_main_thread(stop_signals):
    import threading
    seen = []

    def run():
        guard = host_memory.HostMemoryGuard(1 << 62, hold_s=0.0, poll_s=0.01, read=lambda: 0)
        with guard:
            deadline = time.monotonic() + 5
            while guard.message is None and time.monotonic() < deadline:
                time.sleep(0.01)
        seen.append(guard.message)
    old = host_memory.GRACE_S
    host_memory.GRACE_S = 0.5      # the guard waits this long for the run to leave it, then would end the process
    try:
        t = threading.Thread(target=run)
        t.start()
        t.join(10)
    finally:
        host_memory.GRACE_S = old
    assert seen and "host memory exhausted" in seen[0]
    time.sleep(0.2)
    assert stop_signals == []


def test_no_signal_once_the_run_has_left_the_guard(stop_signals):
    """The breach is found while the run leaves the guard: the guard must not interrupt a run that is over (its
    signal would land in whatever the process does next)."""
    readings = []

    def read_after_exit():           # the first reading (entering) is fine; later ones wait for the run to leave
        readings.append(1)
        if len(readings) == 1:
            return 1 << 40
        guard._stop.wait(5)
        return 0                     # under half the floor: a breach at once
    guard = host_memory.HostMemoryGuard(1 << 30, poll_s=0.01, read=read_after_exit)
    with guard:
        time.sleep(0.05)
    time.sleep(0.3)
    assert guard.message is not None and "host memory exhausted" in guard.message
    assert stop_signals == []


def test_a_foreign_stop_signal_goes_to_the_handler_before_the_guard(stop_signals):
    """The guard's signal is also other software's (a scheduler's warning, a traceback dump): one the guard did not
    send reaches the handler that was there before it, and raises nothing."""
    import signal
    with host_memory.HostMemoryGuard(1, poll_s=0.05, read=lambda: 1 << 40):     # never under the floor
        signal.pthread_kill(threading_main_ident(), host_memory.STOP_SIGNAL)
        time.sleep(0.1)
    assert len(stop_signals) == 1
    assert signal.getsignal(host_memory.STOP_SIGNAL) is not None


def test_the_stop_signal_is_ignored_once_the_run_is_leaving(stop_signals):
    guard = host_memory.HostMemoryGuard(1, poll_s=0.05, read=lambda: 1 << 40)
    with guard:
        guard.message, guard._sent = "host memory exhausted (test)", True
        guard._leaving = True                  # as __exit__ sets it first thing
        guard._raise(host_memory.STOP_SIGNAL, None)      # ours, late: no HostMemoryError
        guard._leaving = False
        guard._sent = True
        with pytest.raises(host_memory.HostMemoryError):
            guard._raise(host_memory.STOP_SIGNAL, None)
    assert stop_signals == []


def test_no_reading_no_watch():
    def broken_read():
        raise OSError("no /proc here")
    with host_memory.HostMemoryGuard(1 << 30, read=broken_read, on_breach=pytest.fail) as guard:
        pass
    assert guard._thread is None


def threading_main_ident():
    import threading
    return threading.main_thread().ident


def test_the_evaluator_leaves_the_host_down_to_the_trainers_floor_plus_a_margin(monkeypatch):
    """train.evaluator_config: cuda_eval's output buffers stop one build and 1 GiB above the trainer's floor (1% of
    the host), not at their own default (2% of a large host); an explicit eval.host_memory_reserve_gib is kept, and
    without a floor the evaluator's default stands."""
    import types

    from cuda_eval.api import EvalConfig
    from kevin_jax import train
    from kevin_jax.placement import GpuConfig
    monkeypatch.setattr(host_memory, "host_memory_total", lambda: 503 << 30)
    spec = types.SimpleNamespace(gpu=GpuConfig(host_memory_floor=0.01), eval=EvalConfig())
    assert train.evaluator_config(spec).host_memory_reserve_gib == pytest.approx(5.03 + 4.3 + 1.0)
    spec.eval = EvalConfig(compile_parallel_phases=False)          # a build with its phases in turn: 2.1 GiB
    assert train.evaluator_config(spec).host_memory_reserve_gib == pytest.approx(5.03 + 2.1 + 1.0)
    spec.eval = EvalConfig(host_memory_reserve_gib=12.0)
    assert train.evaluator_config(spec).host_memory_reserve_gib == 12.0
    spec = types.SimpleNamespace(gpu=GpuConfig(host_memory_floor=0.0), eval=EvalConfig())
    assert train.evaluator_config(spec).host_memory_reserve_gib == 0.0
