"""The pieces of the judge-driven timing protocol that run without a sandbox: the output digest (against a plain
Python transcription of its spec), the kernel-trace windows, the judge's group sizes and its reading of the
worker's CPU time; on a GPU, the NVRTC digest and gate kernels. The whole protocol runs in test_worker_cpu.py and,
on the GPU, test_hack_corpus.py."""
import hashlib
import os
import struct
import time

import pytest
import torch

from cuda_eval.judge.job import _chunks, _process_tree_cpu_ns
from cuda_eval.protocol import device_kernels, timing, wire
from cuda_eval.worker import dynamic_checks

M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def _fold(a: int, b: int) -> int:
    return (_mix(a ^ _mix(b)) + b) & M64


def spec_digest(t: torch.Tensor, key: int, max_values: int = device_kernels.MAX_VALUES) -> bytes:
    """device_kernels' docstring, line by line, in plain Python."""
    raw = t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
    raw += b"\0" * (-len(raw) % 4)
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    n = len(words)
    lanes = max(1, -(-n // 16))
    values = []
    for j in range(lanes):
        h = _mix(key ^ (((j + 1) * 0x9E3779B97F4A7C15) & M64))
        for r in range(16):
            i = r * lanes + j
            h = (_mix(h ^ (words[i] if i < n else 0) ^ (r << 40)) + h) & M64
        values.append(h)

    def level(v):
        v = v + [0] * (-len(v) % 256)
        out = []
        for s in range(0, len(v), 256):
            block, half = v[s:s + 256], 128
            while half:
                block = [_fold(block[t], block[t + half]) for t in range(half)]
                half //= 2
            out.append(block[0])
        return out

    values = level(values)
    while len(values) > max_values:
        values = level(values)
    return hashlib.blake2b(struct.pack("<QQ", key & M64, n) + struct.pack(f"<{len(values)}Q", *values),
                           digest_size=16).digest()


@pytest.mark.parametrize("t", [torch.arange(37, dtype=torch.int32), torch.randn(3, 5), torch.tensor([True, False]),
                               torch.randn(300, 70).half(), torch.zeros(0), torch.randn(9000),
                               torch.randn(6, 7).t(), torch.randint(-5, 5, (3, 3), dtype=torch.int64)],
                         ids=lambda t: f"{str(t.dtype)[6:]}{list(t.shape)}")
def test_torch_digest_follows_its_spec(t):
    for key in (0, 12345, (1 << 63) + 7):
        assert device_kernels.digest_tensor_torch(t, key) == spec_digest(t, key)


def test_further_tree_levels_follow_the_spec(monkeypatch):
    monkeypatch.setattr(device_kernels, "MAX_VALUES", 2)   # 9000 floats: 563 lanes, 3 values, then one more level
    t = torch.randn(9000)
    assert device_kernels.digest_tensor_torch(t, 7) == spec_digest(t, 7, max_values=2)


def test_call_digests_commit_to_every_bit_and_the_structure():
    kernels = device_kernels.Kernels("cpu")
    x, y = torch.randn(64, 32), torch.arange(10)
    outs = [x, (x, y), None, (1, "s" * 300), torch.zeros(0)]
    digests = kernels.digests(outs, 99)
    received = [wire.Received(x.clone(), "cpu"), (wire.Received(x.clone(), "cpu"), wire.Received(y.clone(), "cpu")),
                None, (1, "s" * 200), wire.Received(torch.zeros(0), "cpu")]  # the wire cuts strings at 200
    assert kernels.digests(received, 99) == digests and len(set(digests)) == len(digests)
    flipped = x.clone()
    flipped.view(torch.int32)[17, 3] ^= 1
    assert kernels.digests([flipped], 99)[0] != digests[0]
    assert kernels.digests([x.reshape(32, 64)], 99)[0] != digests[0]       # same bytes, another shape
    assert kernels.digests([[x, y]], 99)[0] != digests[1]                    # a list is not a tuple
    assert kernels.digests([x], 98)[0] != digests[0]


OURS = {"gate": "cuda_eval_gate_5e1f", "flush": "cuda_eval_flush_5e1f", "digests": ("digest_lanes_5e1f",
                                                                                      "digest_tree_5e1f")}


def _record(name: str, start: int, end: int, stream: int = 7, kernel: bool = True):
    return dynamic_checks.GpuRecord(start, end, name, stream, kernel)


def test_kernel_windows_split_the_trace_by_group():
    """Windows open and close on this process's names of our gate and digests; every other kernel inside counts,
    whatever its name (a fill, a copy, a kernel named like our own kernels' base names); our flushes do not."""
    records = sorted([
        _record("normal_kernel_cuda", 0, 50),                    # input generation: before the gate, not a call
        _record(OURS["gate"], 100, 200),
        _record(OURS["flush"], 201, 209),
        _record("void my_relu_kernel<float>(float*)", 210, 260),  # own, on the current stream
        _record(OURS["flush"], 262, 270),
        _record("at::native::vectorized_elementwise_kernel<4, fill>", 271, 275),   # the call's fill: counted
        _record("void my_relu_kernel<float>(float*)", 280, 330),
        _record("zero_pad_kernel", 335, 340),                    # the program's own, whatever its name says
        _record("digest_tree", 341, 345),                        # our digest's base name: not ours, counted
        _record(OURS["flush"], 346, 347),
        _record(OURS["digests"][0], 400, 410),
        _record(OURS["digests"][1], 411, 412),
        _record("sm90_xmma_gemm_f32f32", 500, 600),              # between groups: not a call
        _record(OURS["gate"], 700, 800),
        _record("at::native::relu_kernel", 810, 900),
        _record(OURS["digests"][0], 950, 960),
    ], key=lambda r: r.start)
    own = ["_Z14my_relu_kernelIfEvPT_", "void my_relu_kernel<float>(float*)", "zero_pad_kernel"]   # the binary's
    windows, foreign = dynamic_checks.split_windows(records, own, OURS)
    assert len(windows) == 2
    assert windows[0].own == 3 and windows[0].kernels == 5 and windows[0].unsynced == 0
    assert windows[0].busy_ms == pytest.approx((260 - 210 + 275 - 271 + 330 - 280 + 340 - 335 + 345 - 341) / 1e6)
    assert windows[1].own == 0 and windows[1].busy_ms == pytest.approx(90 / 1e6)
    assert foreign == {"digest_tree": 1, "at::native::relu_kernel": 1}


def test_a_kernel_named_like_a_copy_or_our_digest_is_in_the_window():
    """The hole: windows used to close on any kernel named like our digests, and kernels named like fills or copies
    were left out of the GPU time. A 1 ms kernel named `copy_rows` and a `digest_tree` marker after a short honest
    kernel now count: the window's GPU time is the whole 1 ms."""
    records = [_record(OURS["gate"], 0, 100), _record(OURS["flush"], 101, 110),
               _record("relu_kernel", 111, 120), _record("digest_tree", 121, 122),
               _record("copy_rows(float const*, float*)", 123, 1_000_123), _record(OURS["flush"], 1_000_124, 1_000_125),
               _record(OURS["digests"][0], 1_000_200, 1_000_210)]
    windows, _ = dynamic_checks.split_windows(records, ["relu_kernel"], OURS)
    assert len(windows) == 1 and windows[0].kernels == 3
    assert windows[0].busy_ms == pytest.approx((9 + 1 + 1_000_000) / 1e6)


def test_own_kernels_are_the_binarys_symbols_whole():
    """The candidate's kernels are the symbols its built binary holds, compared whole with the trace's names: a
    name its source merely mentions (a comment declaring `__global__ void vectorized_elementwise_kernel`) no longer
    makes ATen's kernel its own, and its own kernel named like a copy or our digest is its own."""
    aten = "void at::native::vectorized_elementwise_kernel<4, at::native::relu_functor<float>>(int, float*)"
    records = [_record(OURS["gate"], 0, 100), _record(aten, 111, 120), _record(OURS["digests"][0], 200, 210),
               _record(OURS["gate"], 300, 400), _record("copy_kernel_rows(float const*, float*)", 411, 420),
               _record("void ns::digest_tree_k<3>(float*)", 421, 430), _record(OURS["digests"][0], 500, 510)]
    windows, foreign = dynamic_checks.split_windows(records, ["vectorized_elementwise_kernel"], OURS)
    assert [w.own for w in windows] == [0, 0] and aten[:200] in foreign
    own = ["_Z16copy_kernel_rowsPKfPf", "copy_kernel_rows(float const*, float*)", "_ZN2ns13digest_tree_kILi3EEEvPf",
           "void ns::digest_tree_k<3>(float*)"]
    windows, foreign = dynamic_checks.split_windows(records, own, OURS)
    assert [w.own for w in windows] == [0, 2] and [w.kernels for w in windows] == [1, 2]


def test_work_left_on_another_stream_is_flagged_on_the_calls_themselves():
    """A kernel on another stream that started while our gate held the current stream waited for nothing; one still
    running when our next flush started on the current stream outlived its call (the flush follows the call's end
    event). A side stream forked from and joined back to the current stream does neither."""
    us = 1000   # GPU timestamps in ns

    def window(*side):
        records = [_record(OURS["gate"], 0, 1000 * us, stream=7), _record(OURS["flush"], 1001 * us, 1010 * us, stream=7),
                   _record("main_kernel", 1011 * us, 5000 * us, stream=7), *side,
                   _record(OURS["flush"], 9000 * us, 9010 * us, stream=7),
                   _record("main_kernel", 9011 * us, 12000 * us, stream=7),
                   _record(OURS["flush"], 12001 * us, 12002 * us, stream=7),
                   _record(OURS["digests"][0], 13000 * us, 13010 * us)]
        windows, _ = dynamic_checks.split_windows(sorted(records, key=lambda r: r.start), ["main_kernel"], OURS)
        return windows[0].unsynced
    assert window(_record("side_kernel", 1011 * us, 8500 * us, stream=9)) == 0     # forked and joined
    assert window(_record("side_kernel", 50 * us, 800 * us, stream=9)) == 1        # started during the gate
    assert window(_record("side_kernel", 4000 * us, 11000 * us, stream=9)) == 1    # ran past its call's end
    assert window(_record("side_kernel", 9500 * us, 12500 * us, stream=9)) == 1    # the last call's, past the tail


def test_group_sizes_and_chunks():
    assert _chunks(0, 32) == [] and _chunks(5, 32) == [5]
    assert _chunks(70, 32) == [24, 23, 23] and sum(_chunks(200, 32)) == 200
    assert max(_chunks(200, 32)) <= 32 and len(_chunks(200, 32)) == 7


def test_worker_cpu_time_is_read_from_the_kernel():
    before = _process_tree_cpu_ns(os.getpid())
    assert before and before > 0
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert _process_tree_cpu_ns(os.getpid()) - before >= 40e6
    assert _process_tree_cpu_ns(2 ** 22 + 12345) is None


def test_host_group_times_each_call():
    calls = []
    times, meta = timing.time_group(timing.HostTimer(), lambda k: calls.append(k), 5, l2_flush_bytes=0)
    assert calls == [0, 1, 2, 3, 4] and len(times) == 5 and all(t >= 0 for t in times) and meta["held"]


@pytest.mark.gpu
def test_nvrtc_digest_and_gate_on_the_gpu():
    """The CUDA digest equals the torch-op digest (one block, several blocks, a second tree level) and the gate
    holds the stream for its wall time."""
    kernels = device_kernels.Kernels("cuda")
    assert kernels.backend == "nvrtc", kernels.fallback_reason
    for n in (1, 37, 4096 * 16 + 3, 300_000, 20_000_000):
        t = torch.randn(n, device="cuda")
        assert kernels.digest_tensor(t, 0xDEADBEEF) == device_kernels.digest_tensor_torch(t, 0xDEADBEEF), n
    half = torch.randn(1001, 3, device="cuda").half()
    assert kernels.digests([half], 5) == device_kernels.Kernels("cpu").digests([half.cpu()], 5)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    assert kernels.gate(5.0)
    end.record()
    end.synchronize()
    assert 4.9 <= start.elapsed_time(end) <= 7.0
    # every process names its kernels with a token of its own; the flush zeroes whole buffers
    other = device_kernels.Kernels("cuda")
    assert kernels.names["gate"] != other.names["gate"] and kernels.names["gate"].startswith("cuda_eval_gate_")
    buf = torch.full((3 << 20,), 7, dtype=torch.uint8, device="cuda")
    assert kernels.flush(buf) and not buf.any()


class _FakeDevice:
    """What Job's bookkeeping reads of a device (type, timers), without a device."""
    def __init__(self, device_type: str):
        self.type = device_type
        self.info = {}

    def timer_for(self, method):
        return timing.HostTimer()


def _job(device_type: str = "cpu"):
    from cuda_eval.api import EvalConfig
    from cuda_eval.orchestrator.evaluator import job_config
    from cuda_eval.judge.job import Job
    job = Job.__new__(Job)   # no socket, no task: only the arithmetic of the timing phase
    job.device, job.flags, job.meta = _FakeDevice(device_type), [], {}
    job.group_method, job.gate_ms, job.retries, job.rng_dependent, job.revealed = "gated", 1.0, 0, False, []
    settings = job_config(EvalConfig(), kernel_profile=False, profile_tools={"cuobjdump": None})
    job.kernel_names, job.settings, job.groups = ["my_kernel"], settings, []
    job.modules = [{"name": "ext", "kernels": ["my_kernel"]}]
    return job


def _group(kind: str, times: list, wall_s: float, replay_s: float, empty_ms: float = 0.002) -> dict:
    return {"kind": kind, "n": len(times), "times": times, "wall_s": wall_s, "gate_ms": 1.0, "held": True,
            "replay": {"wall_s": replay_s, "cpu_s": replay_s, "empty_ms": empty_ms}}


def _concluded(groups, reps, traced=False, device_type="cuda"):
    job = _job(device_type)
    job._conclude_timing(groups, 3, reps)
    job.bound_by_wall(traced)
    return job


def test_a_revealed_output_must_be_the_one_committed_when_the_call_ran():
    """The judge picks which call's output to see after every call of the group has committed to its output by
    digest: an output sent that differs from its digest (rewritten after the call, or computed only when asked) is
    flagged uncommitted_output; the committed one passes."""
    job = _job("cpu")
    job.device.kernels = device_kernels.Kernels("cpu")
    job.digest_key = 1234
    outs = [torch.randn(8, 8) for _ in range(3)]
    group = {"digests": job.device.kernels.digests(outs, job.digest_key)}
    sent = {}
    job._ask_output = lambda op, **fields: ({"op": op, "j": fields["j"]}, [])
    job.receive_output = lambda reply, blobs: sent[reply["j"]]
    sent.update({0: outs[0], 1: outs[2], 2: outs[2]})   # call 1's buffer holds what the last call wrote
    assert torch.equal(job._reveal(group, 0), outs[0]) and job.flags == []
    job._reveal(group, 2)
    assert job.flags == []
    job._reveal(group, 1)
    assert [f["code"] for f in job.flags] == ["uncommitted_output"]


def test_the_reward_time_is_what_the_judges_clock_proves():
    from cuda_eval.judge import job as judge
    allowance = judge.GROUP_JITTER_S["cuda"]
    # Honest: 32 calls of 1 ms, the wall holds them plus the replay's cost and a little noise.
    honest = _concluded([_group("timed", [1.0] * 32, 0.032 + 0.010 + allowance / 2, 0.010)], 32)
    assert not honest.flags and not honest.timing["capped"] and honest.timing["median_ms"] == 1.0
    # A clock 20x slow: reported 0.05 ms, the wall says 1 ms a call: the reward time is ~1 ms / 1.15, flagged.
    forged = _concluded([_group("timed", [0.05] * 32, 0.032 + 0.010 + allowance, 0.010)] * 2, 64)
    assert forged.timing["capped"] and forged.timing["reported_median_ms"] == 0.05
    assert forged.timing["median_ms"] == pytest.approx(1.0 / judge.WALL_TOLERANCE, rel=1e-6)
    assert [f["code"] for f in forged.flags] == ["timing_inconsistent"]
    # A mild forgery (1.5x) is capped, not flagged; a report below half an empty call is flagged.
    mild = _concluded([_group("timed", [1.0 / 1.5] * 32, 0.032 + 0.010 + allowance, 0.010)], 32)
    assert mild.timing["capped"] and not mild.flags
    tiny = _concluded([_group("timed", [0.0001] * 32, 0.010 + allowance, 0.010, empty_ms=0.0013)], 32)
    assert [f["code"] for f in tiny.flags] == ["timing_inconsistent"] and "empty call" in tiny.flags[0]["reason"]
    # A replay without a gate (the GPU timer's exact gate is added to its wall, not run) times the host's launch
    # gaps: its empty calls (15-50 us on an H100) are no floor for a 6 us kernel behind a gate.
    ungated = _group("timed", [0.0066] * 32, 0.010 + allowance, 0.010, empty_ms=0.0145)
    ungated["replay"]["gated"] = False
    small = _concluded([ungated], 32)
    assert not small.flags and small.meta["wall_bound"]["empty_call_ms"] is None


def test_the_wall_allowance_is_tight_whatever_the_trace_says():
    """Honest groups on an H100 took a few ms more or less than the judge's replays of them (row_sum_warp: 14 groups
    of 15 calls of 0.14 ms, excess per group from -1.7 to +6.9 ms): the least time per call over the groups does not
    raise such a time, with the trace or without. A clock forged 20x slow in every group (a 1 ms kernel of groups of
    8 calls reported as 0.05 ms) is capped and flagged by the wall clock even where the trace "judged every group"
    (a trace comes from the candidate's process: it once bought an allowance of 10 ms per group, which left this
    forgery uncapped by the clock)."""
    from cuda_eval.judge import job as judge
    excess = [-0.0017, 0.0069, 0.0024, 0.0031, 0.0008, 0.0045, 0.0019, 0.0052, 0.0027, 0.0011, 0.0038, 0.0062,
              0.0021, 0.0033]
    groups = [_group("timed", [0.14] * 15, 0.0185 + 0.0021 + e, 0.0185) for e in excess]
    for traced in (True, False):
        honest = _concluded([dict(g) for g in groups], 210, traced=traced)
        assert not honest.flags and not honest.timing["capped"] and honest.timing["median_ms"] == pytest.approx(0.14)
    assert honest.meta["wall_bound"]["allowance_s"] == pytest.approx(14 * judge.GROUP_JITTER_S["cuda"])
    forged = [_group("timed", [0.05] * 8, 0.010 + 0.008 + 0.0003 * (i % 3), 0.010) for i in range(25)]
    job = _concluded(forged, 200, traced=True)
    assert job.meta["wall_bound"]["trace"] == "judged every group"
    assert job.timing["capped"] and job.timing["median_ms"] == pytest.approx((1.0 - 0.5 / 8) / judge.WALL_TOLERANCE)
    assert [f["code"] for f in job.flags] == ["timing_inconsistent"]


def test_a_forged_clock_is_bound_when_the_trace_is_missing():
    """A 0.25 ms kernel whose clock reports 0.001 ms in groups of 32 calls: with the kernel trace skipped (by the
    candidate or the machine), the judge's clock with the tight allowance caps and flags it; with the trace, the
    trace does (here it shows the kernels' 0.25 ms)."""
    from cuda_eval.judge import job as judge

    def forged(trace):
        job = _job("cuda")
        groups = [_group("timed", [0.001] * 32, 0.010 + 32 * 0.00025 + 0.0003, 0.010) for _ in range(8)]
        job._conclude_timing(groups, 3, 256)
        job.groups = groups
        if trace:
            job.meta.update(call_windows=[[0.25 * 32, 32, 32]] * 8, call_foreign_kernels={})
        else:
            job.meta.update(call_trace_skipped="profiler: RuntimeError: a profiler is already running")
        job._reference_kernels = lambda: []
        job.bound_by_wall(job.judge_call_trace())
        return job
    skipped, traced = forged(False), forged(True)
    assert skipped.timing["median_ms"] > 0.15 and "timing_inconsistent" in {f["code"] for f in skipped.flags}
    assert traced.timing["median_ms"] == pytest.approx(0.25 / judge.WALL_TOLERANCE)
    assert "timing_inconsistent" in {f["code"] for f in traced.flags}


def test_every_groups_window_reaches_the_judge():
    """A job of 100 groups (large inputs: a group of 2 calls) sends 100 trace windows; the judge's bounded copy of
    the worker's meta keeps them all (cut at 64, the trace looked broken: an honest kernel flagged)."""
    from cuda_eval.judge.job import _plain
    job = _job("cuda")
    job.groups = [{"n": 2, "times": [1.0, 1.0]} for _ in range(100)]
    job.meta.update(call_windows=_plain([[1.9, 2, 2]] * 100, items=512), call_foreign_kernels={})
    job._reference_kernels = lambda: []
    assert job.judge_call_trace() and not job.flags


def test_the_kernel_trace_of_the_calls_is_judged():
    def judged(windows, foreign=None, ref_kernels=()):
        job = _job("cuda")
        job.groups = [{"n": 2, "times": [1.0, 1.0]} for _ in range(2)]
        job.meta.update(call_windows=windows, call_foreign_kernels=foreign or {})
        job._reference_kernels = lambda: list(ref_kernels)
        job.judge_call_trace()
        return {f["code"] for f in job.flags}
    assert judged([[1.9, 2, 2], [2.0, 2, 2]]) == set()
    assert judged([[20.0, 2, 2], [20.0, 2, 2]]) == {"timing_inconsistent"}     # the GPU ran 10x what was reported
    assert judged([[1.9, 2, 2]]) == {"timing_inconsistent"}                    # a group missing from the trace
    assert judged([[1.9, 2, 2], [2.0, 0, 2]]) == {"no_custom_kernel"}           # a group without the own kernel
    relu = "void at::native::vectorized_elementwise_kernel<4, relu>"
    assert judged([[1.9, 2, 2], [2.0, 2, 3]], {relu: 1}, [relu]) == {"reference_op"}
    # Real ATen names share their first 64 characters; the worker's meta keeps them whole through the judge's
    # bounded copy, so the reference's relu is told from another elementwise op.
    from cuda_eval.judge.job import _plain
    prefix = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
    relu, add = prefix + "launch_clamp_scalar(...)", prefix + "CUDAFunctor_add<float>"
    assert judged([[1.9, 2, 2], [2.0, 2, 3]], _plain({relu: 271}), [relu]) == {"reference_op"}
    assert judged([[1.9, 2, 2], [2.0, 2, 3]], _plain({add: 271}), [relu]) == set()
    assert judged([[1.9, 2, 2], [2.0, 2, 3]], {"sm90_xmma_gemm_f32f32": 2}) == {"library_heavy_op"}


def test_the_trace_keeps_every_kernel_and_drops_copies_and_runtime_calls():
    """Where the profiler gives no activity kind, the GPU records' names say which are kernels: the profiler's copy
    and set activities and bare runtime-call names are not; with the kind (CUPTI's), the name does not matter: an
    extern "C" kernel `cudaRelu` is a kernel, a memset is not."""
    from cuda_eval.protocol.tracing import is_kernel_name
    for name in (device_kernels.GATE_KERNEL, *device_kernels.DIGEST_KERNELS, "void my_relu_kernel<float>(float*)",
                 "cuda_relu_kernel(float const*, float*, int)", "cudaRelu(float const*, float*)", "Memset(float*)",
                 "MemcpyRows"):
        assert is_kernel_name(name), name
    for name in ("cudaLaunchKernel", "cudaStreamSynchronize", "Memcpy HtoD (Pageable -> Device)",
                 "Memcpy DtoD (Device -> Device)", "Memset (Device)"):
        assert not is_kernel_name(name), name
    records = [_record(OURS["gate"], 0, 10), _record("cudaRelu", 20, 70),
               _record("Memcpy DtoD (Device -> Device)", 75, 80, kernel=False),
               _record(OURS["digests"][0], 90, 95)]
    windows, foreign = dynamic_checks.split_windows(records, [], OURS)
    assert len(windows) == 1 and windows[0].own == 0 and windows[0].kernels == 1 and foreign == {"cudaRelu": 1}
    assert windows[0].busy_ms == pytest.approx(50 / 1e6)


def test_the_reward_time_is_bounded_by_the_kernel_trace():
    """A timer forged below what the kernels took on the GPU: the trace scales the median back up (less the
    tolerance) and flags it; an honest trace (a little under the reports) changes nothing."""
    from cuda_eval.judge import job as judge
    allowance = judge.GROUP_JITTER_S["cuda"]

    def traced(reported_ms: float, busy_ms: float):
        job = _job("cuda")
        group = _group("timed", [reported_ms] * 32, 0.010 + allowance, 0.010)   # the wall proves nothing here
        job._conclude_timing([group], 3, 32)
        job.groups = [group]
        job.meta.update(call_windows=[[busy_ms * 32, 32, 32]], call_foreign_kernels={})
        job._reference_kernels = lambda: []
        job.judge_call_trace()
        return job
    honest = traced(1.0, 0.97)
    assert not honest.flags and not honest.timing["capped"] and honest.timing["median_ms"] == 1.0
    forged = traced(0.05, 1.0)
    assert forged.timing["capped"] and forged.timing["median_ms"] == pytest.approx(1.0 / judge.WALL_TOLERANCE)
    assert [f["code"] for f in forged.flags] == ["timing_inconsistent"]
    mild = traced(1.0 / 1.1, 1.0)   # within the tolerance: neither flagged nor capped, a gain of at most 1.15x
    assert not mild.flags and mild.timing["median_ms"] == pytest.approx(1.0 / 1.1)
    # Reports skewed around the same total (most calls low, a few high): the median falls, the sums agree; the mean
    # GPU time per call still bounds the reward's time.
    job = _job("cuda")
    times = [0.1] * 17 + [(32.0 - 1.7) / 15] * 15
    group = _group("timed", times, 0.010 + allowance, 0.010)
    job._conclude_timing([group], 3, 32)
    job.groups = [group]
    job.meta.update(call_windows=[[32.0, 32, 32]], call_foreign_kernels={})
    job._reference_kernels = lambda: []
    job.judge_call_trace()
    assert job.timing["reported_median_ms"] == pytest.approx(0.1) and not job.flags
    assert job.timing["capped"] and job.timing["median_ms"] == pytest.approx(1.0 / judge.WALL_TOLERANCE)


def test_a_report_faster_than_the_card_can_move_its_bytes_is_bound():
    """The judge's own physical bound, whatever the worker reports (clock or trace): a relu of 4096 x 16384 floats
    reads 256 MiB and writes 256 MiB, of which all but two L2's worth go through the card's memory, at no more than
    1.5x its measured copy bandwidth. An honest 0.18 ms is far above it; a report of 1 us is faster_than_hardware and
    raised to it. Without the bound (no bandwidth measured) the forgery passes the wall clock here (its groups are
    within the noise)."""
    from cuda_eval.judge import floor

    def concluded(reported_ms, bandwidth=3.0e12):
        job = _job("cuda")
        job.device.info.update(copy_bytes_per_s=bandwidth, l2_bytes=50 << 20)
        job.needs = floor.Needs(output_bytes=256 << 20, input_bytes=256 << 20, param_bytes=0, flops=None,
                                inputs_perturbed=True)
        groups = [_group("timed", [reported_ms] * 8, 0.010 + 8 * reported_ms / 1e3, 0.010) for _ in range(25)]
        job._conclude_timing(groups, 3, 200)
        job.bound_by_wall(True)
        return job
    floor_ms = (512 - 100) * 2**20 / (floor.MARGIN * 3.0e12) * 1e3
    honest, forged = concluded(0.18), concluded(0.001)
    assert not honest.flags and honest.timing["median_ms"] == 0.18
    assert honest.timing["floor_ms"] == pytest.approx(floor_ms, rel=1e-4)
    assert forged.timing["median_ms"] == pytest.approx(floor_ms, rel=1e-4) and forged.timing["capped"]
    assert [f["code"] for f in forged.flags] == ["faster_than_hardware"]
    unbound = concluded(0.001, bandwidth=None)
    assert not unbound.flags and unbound.timing["median_ms"] < 0.01


@pytest.mark.parametrize("busy", [10 ** 400, -1.0, float("nan"), True, "2.0", None])
def test_a_forged_or_broken_trace_window_is_a_flag_not_our_error(busy):
    """The windows come from the candidate's process: a value no trace gives (too large for a float, negative, not
    a number) is a broken trace (flagged, and the wall clock binds tightly), never an exception in the judge."""
    from cuda_eval.judge.job import _plain
    job = _job("cuda")
    job.groups = [{"n": 2, "times": [1.0, 1.0]} for _ in range(2)]
    job.meta.update(call_windows=_plain([[1.9, 2, 2], [busy, 2, 2]], items=2048), call_foreign_kernels={})
    job._reference_kernels = lambda: []
    assert job.judge_call_trace() is False
    assert [f["code"] for f in job.flags] == ["timing_inconsistent"]


def test_unsynced_kernels_of_the_timed_calls_are_flagged_by_the_judge():
    """The worker's windows carry, per group, the kernels of another stream not ordered within their call: any is
    unsynced_stream, on the timed calls themselves (not only in a separate trace step)."""
    job = _job("cuda")
    job.groups = [{"n": 2, "times": [1.0, 1.0]} for _ in range(2)]
    job.meta.update(call_windows=[[1.9, 2, 2, 0], [2.0, 2, 3, 1]], call_foreign_kernels={})
    job._reference_kernels = lambda: []
    assert job.judge_call_trace() is True
    assert [f["code"] for f in job.flags] == ["unsynced_stream"]
