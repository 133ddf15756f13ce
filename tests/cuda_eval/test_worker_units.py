"""In-process units of the worker (CPU torch): output comparison, memory checks, tracing, snapshots, timing."""
import itertools
import math
import sys
import threading
import time
import types

import pytest
import torch

from cuda_eval.judge import compare
from cuda_eval.protocol import harness, tensors, timing, tracing
from cuda_eval.worker import dynamic_checks


def test_compare_tolerances_and_errors():
    r = torch.tensor([1.0, 2.0, 100.0])
    ok = compare.compare_outputs(r + torch.tensor([0.005, -0.01, 0.9]), r, atol=1e-2, rtol=1e-2)
    assert ok["passed"] and ok["max_abs_err"] == pytest.approx(0.9, rel=1e-5)
    bad = compare.compare_outputs(r + torch.tensor([0.05, 0.0, 0.0]), r, atol=1e-2, rtol=1e-2)
    assert not bad["passed"] and bad["mismatch_frac"] == pytest.approx(1 / 3) and "1 of 3 elements" in bad["message"]
    strict = compare.compare_outputs(r + 1e-3, r, atol=1e-2, rtol=1e-2, strict_fp32=1e-4)
    assert not strict["passed"]


def test_compare_nonfinite_shapes_dtypes_structure():
    r = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare.compare_outputs(r.clone(), r, atol=1e-2, rtol=1e-2)["passed"]
    nan_where_none = compare.compare_outputs(torch.tensor([float("nan"), 0.0]), torch.zeros(2), atol=1e-2, rtol=1e-2)
    assert not nan_where_none["passed"] and "NaN/Inf" in nan_where_none["message"]
    wrong_inf = compare.compare_outputs(torch.tensor([-float("inf")]), torch.tensor([float("inf")]), atol=1, rtol=1)
    assert not wrong_inf["passed"]
    assert "shape mismatch" in compare.compare_outputs(torch.zeros(4), torch.zeros(2, 2), atol=1, rtol=1)["message"]
    assert "dtype mismatch" in compare.compare_outputs(torch.zeros(2), torch.zeros(2, dtype=torch.float64), atol=1,
                                                       rtol=1)["message"]
    ints = compare.compare_outputs(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]), atol=10, rtol=10)
    assert not ints["passed"] and "int64 elements differ" in ints["message"]
    tup = compare.compare_outputs((torch.zeros(2),), torch.zeros(2), atol=1, rtol=1)
    assert "structure mismatch" in tup["message"]
    assert compare.compare_outputs((torch.ones(2), 3), (torch.ones(2), 3), atol=0, rtol=0)["passed"]
    assert "got list(float, float)" in compare.compare_outputs([1.0, 2.0], torch.zeros(2), atol=1, rtol=1)["message"]
    assert "expected a torch.Tensor, got builtins.float" in compare.compare_outputs(3.0, torch.zeros(2), atol=1,
                                                                                     rtol=1)["message"]


def test_non_plain_tensors():
    class Sub(torch.Tensor):
        pass

    class Wrapper:
        @classmethod
        def __torch_function__(cls, *a, **k):
            return None

    assert dynamic_checks.non_plain_tensors(torch.zeros(2)) == []
    assert dynamic_checks.non_plain_tensors((torch.zeros(2), torch.zeros(2).as_subclass(Sub)))[0].endswith("Sub")
    assert dynamic_checks.non_plain_tensors(Wrapper())[0].endswith("Wrapper")
    assert dynamic_checks.non_plain_tensors(torch.nn.Parameter(torch.zeros(2)))  # a Parameter is a subclass too


def test_aliasing_and_poison():
    x = torch.randn(10)
    assert tensors.overlaps(x[2:5], [x]) and not tensors.overlaps(x.clone(), [x])
    junk = torch.empty(8, dtype=torch.float32)
    junk.view(torch.uint8).fill_(tensors.POISON_BYTE)
    assert compare.poison_fraction(junk) == 1.0 and compare.poison_fraction(torch.zeros(8)) == 0.0
    assert tensors.bitwise_equal([torch.tensor([float("nan")])], [torch.tensor([float("nan")])])
    assert not tensors.bitwise_equal([torch.tensor([0.0])], [torch.tensor([-0.0])])


def test_forward_trace_attributes_ops_to_python_or_extension():
    x = torch.randn(8)
    with dynamic_checks.ForwardTrace([torch.relu]) as trace:  # stands in for an extension function
        torch.relu(x)       # "inside the extension": its aten::relu is the extension's
        y = x.sum()         # from Python
        torch.empty(3)      # allocation: never compute
    assert trace.extension_calls == 1
    assert trace.python_compute_ops() == ["sum"]
    assert set(trace.compute_ops()) == {"relu", "sum"}
    assert y.item() == pytest.approx(x.sum().item())


def test_forward_trace_sees_task_code():
    src = "def forward(x):\n    return x + 1\n"
    namespace = {}
    exec(compile(src, harness.TASK_FILENAME, "exec"), namespace)
    with dynamic_checks.ForwardTrace([]) as trace:
        namespace["forward"](torch.ones(2))
    assert trace.task_code_calls == {"forward"}


def _candidate_forward(src: str):
    """`forward` of a candidate-like source compiled under the candidate's file name (as the worker loads it)."""
    namespace = {}
    exec(compile(src, harness.CANDIDATE_FILENAME, "exec"), namespace)
    return namespace["forward"]


def test_forward_trace_sees_its_profile_hook_switched_off():
    """The hook that sees torch calls made from Python (and the tracer's state at each) can be removed from inside
    the call: through any alias (a call of sys.setprofile itself is seen), or from native code, and put back before
    the call returns (the hook is found missing or replaced at the end of the call)."""
    ext = math.fabs  # stands in for an extension function
    detour = _candidate_forward(
        "import os, math\n"
        "def forward(x):\n"
        "    math.fabs(1.0)\n"
        "    hook = os.sys.getprofile()\n"
        "    os.sys.setprofile(None)\n"
        "    y = os.sys.modules['torch'].relu(x)\n"
        "    os.sys.setprofile(hook)\n"
        "    return y\n")
    trace = dynamic_checks.ForwardTrace([ext])
    x = torch.randn(16)
    with trace:
        y = detour(x)
    assert torch.equal(y, torch.relu(x))
    assert any("sys.setprofile was called" in r for r in trace.tracer_off), trace.tracer_off

    native = _candidate_forward(
        "import ctypes, math, torch\n"
        "_set = ctypes.pythonapi.PyEval_SetProfile\n"
        "_set.argtypes, _set.restype = [ctypes.c_void_p, ctypes.c_void_p], None\n"
        "def forward(x):\n"
        "    math.fabs(1.0)\n"
        "    _set(None, None)\n"
        "    return torch.relu(x)\n")
    trace = dynamic_checks.ForwardTrace([ext])
    with trace:
        native(x)
    assert trace.tracer_off == {"the profile hook was replaced or removed during the call"}
    assert sys.getprofile() is None  # the previous hook (none here) is back

    honest = _candidate_forward("import math\ndef forward(x):\n    math.fabs(1.0)\n    return x * 1\n")
    trace = dynamic_checks.ForwardTrace([ext])
    for _ in range(2):
        with trace:
            honest(x)
    assert trace.tracer_off == set() and trace.calls == 2


@pytest.fixture
def hook_guards():
    """sys's hook functions guarded as in the worker, and given back after the test."""
    dynamic_checks.install_hook_guards()
    yield
    dynamic_checks.remove_hook_guards()


@pytest.mark.parametrize("body", [
    # called from C (no c_call event), then the hook put back
    "h = sys.getprofile()\nfunctools.partial(sys.setprofile, None)()\ny = torch.relu(x)\nsys.setprofile.__call__(h)",
    "h = sys.getprofile()\nlist(map(sys.setprofile, [None]))\ny = torch.relu(x)\nlist(map(sys.setprofile, [h]))",
    # an exception raised inside the hook (CPython removes a hook that raises)
    "class L(list):\n    @property\n    def __class__(self):\n        raise ValueError\n"
    "with contextlib.suppress(ValueError):\n    L().append(1)\ny = torch.relu(x)",
    # the worker's own thread hook, which switches the profile hook off in new threads, called on this one
    "WATCH._on_thread_start(None, None, None)\ny = torch.relu(x)",
])
def test_forward_trace_cannot_be_blinded_from_python(hook_guards, body):
    """Pure-Python ways around the profile hook that a policy could find (each left the call unseen before)."""
    src = ("import contextlib, functools, math, sys, torch\n"
           "def forward(x):\n    math.fabs(1.0)\n" + "".join(f"    {line}\n" for line in body.splitlines()) +
           "    return y\n")
    namespace = {"WATCH": dynamic_checks.ThreadWatch()}
    exec(compile(src, harness.CANDIDATE_FILENAME, "exec"), namespace)
    trace = dynamic_checks.ForwardTrace([math.fabs])
    x = torch.randn(16)
    try:
        with trace:
            y = namespace["forward"](x)
    finally:
        namespace["WATCH"].stop_recording()
    assert torch.equal(y, torch.relu(x))
    assert trace.tracer_off or "torch.relu" in trace.python_torch_calls, (trace.tracer_off, trace.python_torch_calls)


def test_a_guard_replaced_inside_the_call_is_seen(hook_guards):
    """A candidate that swaps a guard for sys's original (or anything else) has switched the tracer off."""
    guard = sys.getprofile
    trace = dynamic_checks.ForwardTrace([])
    try:
        with trace:
            sys.getprofile = lambda: None
    finally:
        sys.getprofile = guard
    assert trace.tracer_off == {"sys.getprofile was replaced during the call"}


def test_a_trace_function_set_before_the_call_is_seen():
    trace = dynamic_checks.ForwardTrace([])
    previous = sys.gettrace()
    sys.settrace(lambda *a: None)
    try:
        with trace:
            torch.ones(2) * 2
    finally:
        sys.settrace(previous)
    assert trace.tracer_off == {"a trace function (sys.settrace) was set when the call began"}


def test_reference_ops_and_heavy_ops():
    a = torch.randn(4, 4)
    assert tracing.reference_compute_ops(lambda: torch.relu(a @ a)) == ["mm", "relu"]
    assert "mm" in tracing.HEAVY_OPS and tracing.is_compute("relu")
    assert not tracing.is_compute("empty_like")


def test_fork_check_judges_kernels_against_the_gate():
    """The fork check's rule on a recorded timeline (microseconds): a kernel on another stream that started before
    the gate on the current stream ended did not wait for it; one that started after it did, or may have."""
    K = tracing.KernelRecord
    gate = K("void at::cuda::(anonymous namespace)::spin_kernel(long)", stream=7, start_us=100.0, end_us=2100.0)
    cheat = K("relu_kernel(float const*, float*, long)", stream=13, start_us=140.0, end_us=150.0)
    forked = K("relu_part_kernel(float const*, float*, long, long)", stream=13, start_us=2104.0, end_us=2110.0)
    own = K("relu_part_kernel(float const*, float*, long, long)", stream=7, start_us=2101.0, end_us=2109.0)
    trace = tracing.KernelTrace()
    trace.kernels = [cheat, own, gate, forked]
    assert trace.gate() is gate
    assert trace.unforked_kernels() == [cheat]
    trace.kernels = [gate, own, forked]
    assert trace.unforked_kernels() == []
    # a candidate kernel that happens to be named spin_kernel, starting later, is not taken for the gate
    late_spin = K("spin_kernel(long)", stream=13, start_us=2200.0, end_us=2300.0)
    trace.kernels = [late_spin, gate, cheat]
    assert trace.gate() is gate and trace.unforked_kernels() == [cheat]
    # no gate recorded: nothing can be concluded, nothing is flagged
    trace.kernels = [cheat, own]
    assert trace.gate() is None and trace.unforked_kernels() == []


def test_identity_snapshot_sees_replacements():
    import time as time_module
    snap = dynamic_checks.IdentitySnapshot(dynamic_checks.default_watch_modules(),
                                           dynamic_checks.default_watch_classes())
    assert snap.changed() == []
    original = time_module.perf_counter
    time_module.perf_counter = lambda: 0.0
    try:
        assert "time.perf_counter" in snap.changed()
    finally:
        time_module.perf_counter = original
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not old
    try:
        assert any("cudnn.benchmark" in c for c in snap.changed())
    finally:
        torch.backends.cudnn.benchmark = old
    assert snap.changed() == []


def test_thread_watch_sees_running_and_finished_threads():
    watch = dynamic_checks.ThreadWatch()
    try:
        stop = threading.Event()
        t = threading.Thread(target=stop.wait, name="candidate-thread")
        t.start()
        assert watch.new_python_threads() == ["candidate-thread (Thread)"]
        assert watch.new_native_threads()
        stop.set()
        t.join()
        short = threading.Thread(target=lambda: None, name="short-lived")
        short.start()
        short.join()
        assert watch.new_python_threads() == ["candidate-thread (finished)", "short-lived (finished)"]
    finally:
        watch.stop_recording()


def test_time_rotating_on_host():
    calls = []

    def work(i):
        calls.append(i)
        time.sleep(0.001)

    cfg = timing.TimingConfig(target_s=0.02, warmup_s=0.002, min_reps=5, max_reps=50)
    stats = timing.time_rotating(work, 3, timer=timing.HostTimer(), device_type="cpu", config=cfg)
    assert 5 <= stats["n"] <= 50 and stats["median_ms"] >= 1.0 and stats["input_sets"] == 3
    assert set(calls) == {0, 1, 2}
    assert stats["min_ms"] >= 1.0  # every timed call sleeps 1 ms: a time below it was not measured around the call
    # the 4 calls of the estimate (1 warm-up, 3 reps), then the timed run, which ends on the set the judge checks
    assert len(calls) == 4 + stats["warmup"] + stats["n"]
    assert calls[-1] == (stats["warmup"] + stats["n"] - 1) % 3


def test_timing_methods_plan_their_repetitions():
    """KernelBench's protocol has fixed counts (3 warm-up calls, 100 trials); the others adapt to the estimate within
    [min_reps, max_reps]; an unknown method is an error; on the CPU every method is the host clock."""
    assert timing.TimingConfig(method="kernelbench").plan(5.0) == (3, 100)
    cfg = timing.TimingConfig(target_s=0.25, warmup_s=0.03, min_reps=20, max_reps=200)
    assert cfg.plan(0.001)[1] == 200 and cfg.plan(100.0)[1] == 20 and cfg.plan(2.5) == (12, 100)
    with pytest.raises(ValueError, match="timing method"):
        timing.TimingConfig(method="fast")
    host = timing.make_timer("cpu")
    assert all(timing.timer_for(m, "cpu", host, None) is host for m in timing.METHODS)


class _FakeGate:
    """Stand-ins for the CUDA calls of timing.GatedTimer (a test fake): the gate "opens early" (the host did not queue
    the group in time) for the groups listed in `late`, so the timer measures them again behind a longer gate."""

    def __init__(self, late: set[int]):
        self.late, self.groups = late, 0

    def event(self, enable_timing: bool = False):
        fake = self

        class Event:
            def record(self):
                if not enable_timing:
                    fake.groups += 1  # the gate event is recorded once per attempt at a group

            def query(self):
                return (fake.groups - 1) in fake.late  # True: the gate had opened before the host finished

            def elapsed_time(self, other):
                return 1.0

            def synchronize(self):
                pass
        return Event()


def _timing_fakes(monkeypatch, **fakes) -> None:
    """Test fakes for what timing.py's functions call: they hold their clock, events, spin and synchronise as
    keyword-only defaults (a rebound module name changes nothing), so the fakes go there."""
    fns = [v for v in vars(timing).values() if isinstance(v, types.FunctionType)]
    fns += [f for c in vars(timing).values() if isinstance(c, type) and c.__module__ == timing.__name__
            for f in vars(c).values() if isinstance(f, types.FunctionType)]
    for fn in fns:
        for name, fake in fakes.items():
            if name in (fn.__kwdefaults__ or {}):
                monkeypatch.setitem(fn.__kwdefaults__, name, fake)


@pytest.mark.parametrize("warmup,reps,late", [(3, 27, {0}), (5, 50, {1}), (3, 200, {2, 3}), (1, 7, {0, 1})])
def test_gated_retries_keep_the_input_rotation(monkeypatch, warmup, reps, late):
    """A group measured again behind a longer gate calls the model again; the calls must repeat the same logical
    numbers k, so that the last timed call is k = warmup+reps-1 and its input set is the one the judge checks
    ((warmup+reps-1) mod n_sets). Before, the retried calls advanced the worker's rotation: honest ~9 ms kernels
    (one group of 27 reps, retried) were flagged timed_output_mismatch on an idle H100."""
    fake = _FakeGate(late)
    # A fake host clock (1 us per read): on a loaded machine the real one can see a group take longer to queue than
    # 0.9 x the grown gate, and the timer then rightly stops retrying ("waits for the device"), which is not the case
    # under test here.
    fake_clock = itertools.count(0, 1000)
    _timing_fakes(monkeypatch, _event=fake.event, _spin=lambda cycles: None, _sync=lambda: None,
                  _clock=lambda: next(fake_clock))
    calls: list[int] = []
    timer = timing.GatedTimer(cycles_per_ms=1000.0)
    times = timer.time(calls.append, warmup=warmup, reps=reps, l2_flush_bytes=0)
    assert len(times) == reps and timer.meta["retries"] == len(late)
    assert len(calls) > warmup + reps  # the retries really called the model again
    assert calls[:warmup] == list(range(warmup)) and calls[-1] == warmup + reps - 1
    assert sorted(set(calls)) == list(range(warmup + reps))  # every k, repeats only within a retried group
    n_sets = 4
    last_set_used = calls[-1] % n_sets
    assert last_set_used == (warmup + reps - 1) % n_sets


class _FakeNativeCudaTimer:
    """A test fake of cuda_eval._native.CudaTimer's contract (cuda_timer.cpp): fn() is called `warmup` times, then
    once per rep, never again; one time per rep."""

    def time(self, fn, *, warmup, reps, l2_flush_bytes, sync_device, stream):
        for _ in range(warmup + reps):
            fn()
        return [1.0] * reps


def _cuda_timers_on_fakes(monkeypatch):
    """The CUDA timers of timing.py with their CUDA calls replaced by fakes (CPU only): events that time nothing and
    a gate that always holds."""
    fake = _FakeGate(late=set())
    _timing_fakes(monkeypatch, _event=fake.event, _spin=lambda cycles: None, _sync=lambda: None)
    kernelbench = timing.KernelBenchTimer()
    kernelbench._thrash = torch.empty(1, dtype=torch.int64)  # its L2-thrash buffer, on the host instead of the GPU
    return {"native": timing.NativeTimer(_FakeNativeCudaTimer()), "torch_events": timing.TorchEventTimer(),
            "kernelbench": kernelbench, "gated": timing.GatedTimer(cycles_per_ms=1000.0), "host": timing.HostTimer()}


@pytest.mark.parametrize("name", ["native", "torch_events", "kernelbench", "gated", "host"])
@pytest.mark.parametrize("warmup,reps", [(2, 9), (3, 100), (0, 1)])
def test_every_timer_ends_on_the_judges_last_call(monkeypatch, name, warmup, reps):
    """Whatever the timer, its last call is k = warmup+reps-1 (the judge checks the last timed output against input
    set (warmup+reps-1) mod n_sets), every k in [0, warmup+reps) is used, and it returns one time per rep. The CUDA
    timers run here on fakes of their CUDA calls (_cuda_timers_on_fakes); test_cuda_timers_end_on_the_judges_last_call
    runs them on a GPU."""
    timer = _cuda_timers_on_fakes(monkeypatch)[name]
    calls: list[int] = []
    times = timer.time(calls.append, warmup=warmup, reps=reps, l2_flush_bytes=0)
    assert len(times) == reps
    assert calls[-1] == warmup + reps - 1
    assert sorted(set(calls)) == list(range(warmup + reps))
    if name == "kernelbench":  # KernelBench's discarded first trial repeats the first timed k
        assert calls == list(range(warmup)) + [warmup] + list(range(warmup, warmup + reps))
    else:
        assert calls == list(range(warmup + reps))


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["device_sync", "kernelbench", "gated"])
def test_cuda_timers_end_on_the_judges_last_call(method):
    """The same rule for the real CUDA timers (the native timer or its torch-events fallback, KernelBench's, the gated
    one with the spin kernel calibrated as the harness does): the last call is k = warmup+reps-1."""
    assert torch.cuda.is_available()
    cycles = 4_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles // 10)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    timer = timing.timer_for(method, "cuda", timing.make_timer("cuda"), cycles / start.elapsed_time(end))
    x = torch.randn(1 << 20, device="cuda")
    calls: list[int] = []

    def fn(k: int) -> None:
        torch.relu(x)
        calls.append(k)

    times = timer.time(fn, warmup=3, reps=27, l2_flush_bytes=timing.l2_flush_bytes("cuda"))
    assert len(times) == 27 and all(t > 0 for t in times)
    assert calls[-1] == 3 + 27 - 1 and sorted(set(calls)) == list(range(30))


def test_the_timers_and_the_trace_session_are_watched(monkeypatch):
    """The timers report the times and the kernel trace's session the GPU time that bound them, and our kernels
    (gate, flush) delimit the calls in the trace: replacing a method of theirs in the candidate's process is a
    monkeypatch, as for the harness's own classes."""
    import types

    from cuda_eval.protocol import device_kernels, timing
    from cuda_eval.worker import __main__ as worker_main
    from cuda_eval.worker import dynamic_checks
    task = types.ModuleType("task")
    task.Model = type("Model", (), {})
    for cls, name in ((dynamic_checks.KernelSession, "stop"), (timing.GatedTimer, "time_group"),
                      (timing.TorchEventTimer, "time"), (timing.NativeTimer, "time"), (device_kernels.Kernels, "gate"),
                      (device_kernels.Kernels, "flush")):
        snapshot = worker_main.harness_snapshot(task)
        assert not snapshot.changed()
        monkeypatch.setattr(cls, name, lambda *a, **k: None)
        assert any(c.endswith(f"{cls.__qualname__}.{name}") for c in snapshot.changed()), (cls, snapshot.changed())
        monkeypatch.undo()


def test_the_timers_given_parts_are_watched():
    """The gated timer's flush is an attribute of the timer object (our kernel, set at start-up), not of its class: a
    candidate that finds the timer (gc) and rebinds its flush to a no-op (no L2 flush, no flush marker closing the
    calls in the kernel trace) or shortens its gate is a monkeypatch; the timers' working state is not."""
    import types

    from cuda_eval.protocol import device_kernels, timing
    from cuda_eval.worker import __main__ as worker_main
    task = types.ModuleType("task")
    task.Model = type("Model", (), {})
    gated = timing.GatedTimer(1000.0)
    kernels = device_kernels.Kernels("cpu")
    gated.flush = kernels.flush        # what harness.Device does on a GPU with our NVRTC kernels
    device = types.SimpleNamespace(_timers={"gated": gated, "host": timing.HostTimer()}, kernels=kernels)
    snapshot = worker_main.harness_snapshot(task, device)
    ours = gated.flush
    gated.meta = {"gate_ms": 2.0}      # the last call's description: working state
    gated.reserve(0)
    assert not snapshot.changed()
    attack = ("import gc\nfrom cuda_eval.protocol import timing\n"
              "for o in gc.get_objects():\n"
              "    if type(o) is timing.GatedTimer:\n"
              "        o.flush = lambda buffer: True\n")
    exec(attack, {})
    assert "device.timer_for('gated').flush" in snapshot.changed(), snapshot.changed()
    gated.flush = ours
    gated.cycles_per_ms = 1.0
    assert snapshot.changed() == ["device.timer_for('gated').cycles_per_ms"]
    gated.cycles_per_ms = 1000.0
    device._timers["gated"] = timing.GatedTimer(1000.0)   # the timer itself replaced
    assert "device._timers.gated" in snapshot.changed()
    device._timers["gated"] = gated
    kernels.names["gate"] = "relu_kernel"                 # our gate's name in the trace changed
    assert snapshot.changed() == ["device.kernels.names.gate"]


@pytest.mark.parametrize("module,name", [("cuda_eval.protocol.timing", "_perf_counter_ns"),
                                         ("cuda_eval.protocol.timing", "_CudaEvent"),
                                         ("cuda_eval.protocol.harness", "_manual_seed"),
                                         ("cuda_eval.protocol.device_kernels", None),
                                         ("cuda_eval.worker.dynamic_checks", "_setprofile")])
def test_private_names_of_our_modules_are_watched(monkeypatch, module, name):
    """A private alias of ours (the timing protocol's captured clock, the seed, the hook's setter) replaced in the
    candidate's process is a monkeypatch: the snapshot covers every name of our modules, not only public ones."""
    import importlib
    import types

    from cuda_eval.worker import __main__ as worker_main
    mod = importlib.import_module(module)
    if name is None:   # the first private name the module has
        name = next(k for k in vars(mod) if k.startswith("_") and not k.startswith("__")
                    and k not in ("_active", "_guarded_now"))
    task = types.ModuleType("task")
    task.Model = type("Model", (), {})
    snapshot = worker_main.harness_snapshot(task)
    assert not snapshot.changed()
    monkeypatch.setattr(mod, name, lambda *a, **k: 0)
    assert f"{module}.{name}" in snapshot.changed(), (name, snapshot.changed()[:5])


def test_what_our_functions_hold_is_watched(monkeypatch):
    """The timers hold their clocks as keyword-only defaults, and closures hold what they captured: replacing one
    of those (a default, a cell, the code) is a monkeypatch too."""
    import types

    from cuda_eval.protocol import timing
    from cuda_eval.worker import __main__ as worker_main
    from cuda_eval.worker import dynamic_checks
    task = types.ModuleType("task")
    task.Model = type("Model", (), {})
    snapshot = worker_main.harness_snapshot(task)
    monkeypatch.setitem(timing.HostTimer.time.__kwdefaults__, "_clock", lambda: 0)
    assert "cuda_eval.protocol.timing.HostTimer.time.__kwdefaults__[_clock]" in snapshot.changed()
    monkeypatch.undo()
    monkeypatch.setattr(timing.HostTimer.time, "__code__", (lambda self, fn, **k: []).__code__)
    assert "cuda_eval.protocol.timing.HostTimer.time.__code__" in snapshot.changed()
    monkeypatch.undo()
    # a closure of a module of ours: its cell rebound
    own = types.ModuleType("cuda_eval.closure_example")
    exec("import time\ndef make():\n    clock = time.perf_counter_ns\n    def read():\n        return clock()\n"
         "    return read\nread = make()\n", own.__dict__)
    own.read.__module__ = own.__name__
    snapshot = dynamic_checks.IdentitySnapshot([own], [])
    assert snapshot.changed() == []
    own.read.__closure__[0].cell_contents = lambda: 0
    assert snapshot.changed() == ["cuda_eval.closure_example.read.__closure__[0]"]


def test_a_rebound_clock_alias_changes_no_timer(monkeypatch):
    """The host timer reads the clock it holds, not the module's name: a slowed clock planted in
    cuda_eval.protocol.timing._perf_counter_ns (the clock_alias attack, from Python or from C++) changes no time."""
    from cuda_eval.protocol import timing
    busy = lambda _k: sum(range(20000))   # noqa: E731
    real = timing._perf_counter_ns
    monkeypatch.setattr(timing, "_perf_counter_ns", lambda: real() // 1000)
    slowed = timing.HostTimer().time(busy, warmup=1, reps=5)
    monkeypatch.undo()
    honest = timing.HostTimer().time(busy, warmup=1, reps=5)
    assert min(slowed) > 0.1 * min(honest), (slowed, honest)


def test_the_cpu_clock_counts_threads_that_have_exited():
    """The CPU device's clock (the judge reads the worker's CPU time from outside): work done on a thread that has
    exited before the read still counts (a live thread's schedstat would lose it: a C11 thread that does the work and
    ends before the judge looks), and so does the work of a child process that has been reaped."""
    import os
    import subprocess

    from cuda_eval.judge import cpu_clock

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    before = cpu_clock.process_tree_cpu_ns(os.getpid())
    t = threading.Thread(target=burn, args=(0.3,))
    t.start()
    t.join()
    after = cpu_clock.process_tree_cpu_ns(os.getpid())
    assert after - before >= 0.25e9, (after - before) / 1e9
    code = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    before = cpu_clock.process_tree_cpu_ns(os.getpid())
    subprocess.run([sys.executable, "-c", code], check=True)   # reaped by run(): its time is our cutime now
    after = cpu_clock.process_tree_cpu_ns(os.getpid())
    assert after - before >= 0.25e9, (after - before) / 1e9
    assert cpu_clock.process_tree_cpu_ns(2 ** 22 + 12345) is None


def _aten_cpu_override(ops: list[str], seen: list[str]):
    """A library registering a CPU kernel over each of `ops` that records its call and raises (what a candidate's
    TORCH_LIBRARY_IMPL(aten, CPU, m) does from C++); the caller destroys it."""
    lib = torch.library.Library("aten", "IMPL")
    for op in ops:
        def kernel(*args, _op=op, **kwargs):
            seen.append(_op)
            raise RuntimeError(f"intercepted {_op}")
        lib.impl(op, kernel, "CPU")
    return lib


def test_the_host_digest_runs_no_aten_op():
    """The digest that commits a call's output is our own code over the tensor's memory on the host: a kernel a
    candidate registers over the ATen ops the torch form of the digest runs (detach, _to_copy, bitwise ops, cat)
    is never called, so no deferred work can finish inside it."""
    from cuda_eval.protocol import device_kernels
    kernels = device_kernels.Kernels("cpu")
    outs = [torch.randn(64, 33), (torch.randn(5, 7)[:, ::2], 3), torch.arange(10, dtype=torch.int8)]
    expected = kernels.digests(outs, 99)
    seen: list[str] = []
    lib = _aten_cpu_override(["detach", "_to_copy", "bitwise_xor.Tensor", "bitwise_and.Scalar", "cat",
                              "view.dtype", "clone", "copy_"], seen)
    try:
        got = kernels.digests(outs, 99)
    finally:
        lib._destroy()
    assert got == expected and seen == [], seen
    assert expected[0] == kernels.digests([outs[0].clone()], 99)[0]   # the digest of the bytes, not of the object
    # the same digests as the spec's torch form (the judge on a GPU, the CUDA kernels)
    assert device_kernels.finish(*device_kernels._native_digest_values(
        outs[2].data_ptr(), [10], [1], 1, 99), 99) == device_kernels.digest_tensor_torch(outs[2], 99)


def test_kernels_registered_over_the_harness_aten_ops_are_seen():
    """A kernel registered for an ATen op the harness runs (the digest's torch form, the inputs' generation, the
    outputs' packing) after the snapshot is a monkeypatch."""
    snapshot = dynamic_checks.IdentitySnapshot(dynamic_checks.default_watch_modules(),
                                               dynamic_checks.default_watch_classes())
    assert snapshot.changed() == []
    lib = _aten_cpu_override(["detach"], [])
    try:
        changed = snapshot.changed()
    finally:
        lib._destroy()
    assert "the kernels registered for aten::detach" in changed, changed
    assert snapshot.changed() == []
