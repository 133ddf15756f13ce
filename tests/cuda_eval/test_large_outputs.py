"""Outputs larger than the limits meant for the candidate (CPU mode, real judge and worker processes).

The judge and the worker run under the candidate's limits (RLIMIT_FSIZE, a disk quota per sandbox session). The
output channel is a memfd, which RLIMIT_FSIZE covers and which the disk quota counts: sized by a judge under the
workers' 4 GiB RLIMIT_FSIZE, no output over 2 GiB could ever be judged (47 of KernelBench's 250 tasks). The pool now
makes the buffer, outside those limits, and a task whose outputs the host cannot hold gets a named task-level
verdict. Here the limits are small and the outputs a few MiB, so the same paths run in seconds."""
import os

import pytest

import corpus_index
from cuda_eval.api import EvalConfig, EvalRequest, Evaluator
from cuda_eval.orchestrator.gpu_pool import GpuPool, PoolConfig
from cuda_eval.sandbox import quota as sandbox_quota
from sandbox_fixtures import compile_pool, run_lock, shared_dir, toolchain  # noqa: F401  (the run's shared pool)

HONEST_RELU = next(c for c in corpus_index.load("cpu") if c.name == "honest_relu")
ROWS, COLS = 1024, 1024          # a 4 MiB float32 output


def relu_task(rows: int, cols: int) -> str:
    source = HONEST_RELU.task_source
    assert "batch_size = 128\ndim = 512\n" in source
    return source.replace("batch_size = 128\ndim = 512\n", f"batch_size = {rows}\ndim = {cols}\n")


def cpu_config(**kw) -> EvalConfig:
    base = dict(device_type="cpu", run_timeout_s=60, skip_run_on_static_flags=False, num_correct_trials=2,
                timing_target_s=0.02, timing_min_reps=3, timing_max_reps=10, timing_input_sets=1,
                retime_speedup_threshold=0, worker_memory_bytes=2 << 30)
    base.update(kw)
    return EvalConfig(**base)


def small_limits_pool(**kw) -> GpuPool:
    return GpuPool(PoolConfig(**dict(dict(device_type="cpu", devices=("cpu0",), spares=1, data_bytes=2 << 30,
                                          start_timeout_s=120), **kw)))


def request(source: str, request_id: str) -> EvalRequest:
    return EvalRequest(task_id="big_relu", task_source=source, response=HONEST_RELU.response, request_id=request_id)


@pytest.mark.slow
def test_an_output_over_the_candidates_file_size_limit_and_disk_quota_is_judged(compile_pool):  # noqa: F811
    """A 4 MiB output under a 1 MiB RLIMIT_FSIZE and a 3 MiB disk quota: before, the judge's ftruncate of the buffer
    failed with EFBIG (an internal evaluator error); now it is an ordinary correct verdict."""
    with small_limits_pool(file_size_bytes=1 << 20, disk_bytes=3 << 20) as pool, \
            Evaluator(cpu_config(), compile_pool=compile_pool, gpu_pool=pool) as ev:
        r = ev.evaluate([request(relu_task(ROWS, COLS), "big")])[0]
    assert r.correct is True and r.runtime_error is None, (r.runtime_error, r.meta.get("crash"))
    assert r.meta["output_buffer_bytes"] >= ROWS * COLS * 4 and not r.meta.get("internal_error")
    assert len([t for t in r.trials if "affine" not in t]) == 2 and all(t["passed"] for t in r.trials)
    assert r.timing["median_ms"] > 0


@pytest.mark.slow
def test_outputs_the_host_cannot_hold_get_a_task_level_verdict(compile_pool):  # noqa: F811
    """Outputs over the host memory granted to a job's outputs (here a 1 MiB cap): a named task-level verdict, never
    an internal error; the slot's next job runs normally."""
    with small_limits_pool(output_memory_bytes=1 << 20) as pool, \
            Evaluator(cpu_config(), compile_pool=compile_pool, gpu_pool=pool) as ev:
        big, small = ev.evaluate([request(relu_task(ROWS, COLS), "big"), request(relu_task(64, 64), "small")])
    assert big.correct is None and big.meta.get("reference_error"), big.runtime_error
    too_large = big.meta["task_too_large"]
    assert too_large["resource"] == "host memory" and too_large["needed_bytes"] > 4 << 20
    assert "too large for this machine" in big.runtime_error and "output_memory_bytes" in big.runtime_error
    assert "internal" not in big.runtime_error and not big.meta.get("internal_error")
    assert big.feedback.startswith("This task could not be judged on this machine")
    assert small.correct is True and small.runtime_error is None, small.runtime_error


def test_the_output_buffer_is_left_out_of_the_disk_quota():
    """The disk quota counts memfds that sandboxed processes hold (a candidate could fill memory with them), except
    the one the pool granted for a job's outputs."""
    fd = os.memfd_create("quota-test")
    try:
        os.write(fd, b"x" * (1 << 20))
        usage = sandbox_quota._DiskUsage(1 << 40)
        usage.open_deleted([os.getpid()])
        assert usage.total >= 1 << 20
        key = sandbox_quota.exempt_from_disk_quota(fd)
        try:
            exempt = sandbox_quota._DiskUsage(1 << 40)
            exempt.open_deleted([os.getpid()])
            assert exempt.total <= usage.total - (1 << 20)
        finally:
            sandbox_quota.end_disk_quota_exemption(key)
        again = sandbox_quota._DiskUsage(1 << 40)
        again.open_deleted([os.getpid()])
        assert again.total >= 1 << 20
    finally:
        os.close(fd)


# --- the large-output path under the judge-driven timing protocol (no processes: the judge's and worker's pieces) ---
class _HostDevice:
    """What Job's timing and replay read of a device, on the host (a fake: no lock, no CUDA)."""
    type, info = "cpu", {}

    def __init__(self):
        import contextlib

        import torch
        from cuda_eval.protocol import device_kernels
        self.torch_device = torch.device("cpu")
        self.kernels = device_kernels.Kernels("cpu")
        self.exclusive = lambda deadline=None: contextlib.nullcontext()

    def timer_for(self, method):
        from cuda_eval.protocol import timing
        return timing.HostTimer()

    def sync(self):
        pass


def _bare_job(input_bytes: int, output_bytes: int, **fields):
    from cuda_eval.api import EvalConfig
    from cuda_eval.orchestrator.evaluator import job_config
    from cuda_eval.judge.job import Job
    job = Job.__new__(Job)   # no socket, no task: the judge's own arithmetic only
    job.device, job.flags, job.meta, job.groups, job.revealed = _HostDevice(), [], {}, [], []
    job.settings = job_config(EvalConfig(), kernel_profile=False, profile_tools={"cuobjdump": None})
    job.deadline, job.digest_key = None, 1234
    job.input_bytes, job.output_bytes, job.param_bytes = input_bytes, output_bytes, 0
    job.group_method, job.gate_ms = "gated", 1.0
    job.__dict__.update(fields)
    return job


@pytest.mark.parametrize("in_gib,out_gib,size", [(8, 8, 1), (16, 0.125, 1), (1, 1, 2), (0.001, 0.001, 32)])
def test_every_group_of_calls_holds_at_most_the_group_size(in_gib, out_gib, size):
    """The estimate too: four calls of an 8 GiB-in, 8 GiB-out task in one group would hold 64 GiB in the worker."""
    from cuda_eval.protocol import timing
    job = _bare_job(int(in_gib * 2**30), int(out_gib * 2**30))
    job.timing_config = timing.TimingConfig(method="gated", min_reps=20, max_reps=20)
    sizes = []

    def group(n, *, reveal, replay):
        sizes.append(n)
        return {"n": n, "times": [1.0] * n, "wall_s": 0.001 * n, "gate_ms": 1.0, "held": True,
                "replay": {"wall_s": 0.0, "cpu_s": 0.0, "empty_ms": 0.001}}

    job._timing_group = group
    job._conclude_timing = lambda groups, warmup, reps: job.meta.update(planned=(warmup, reps))
    job.time_candidate()
    assert job._group_size() == size and max(sizes) <= size and sizes[0] == min(4, size), sizes
    warmup, reps = job.meta["planned"]
    assert sum(sizes) == 4 + warmup + reps and reps == 20


def test_the_replay_allocates_the_reference_layout_and_holds_nothing_between_groups():
    """The judge's replay template describes the reference's outputs (shapes, strides, dtypes: an 8 GiB template
    would stay on the card for the whole job); the replay allocates each call's outputs like them on the judge's
    device."""
    import torch
    from cuda_eval.judge.job import _EmptyTensor
    from cuda_eval.protocol.harness import map_tree
    out = (torch.randn(6, 4).t(), [torch.arange(5), 3])   # a non-contiguous leaf, an int64 one, a scalar
    template = map_tree(out, _EmptyTensor)
    assert not [t for t in (template[0], template[1][0]) if isinstance(t, torch.Tensor)]
    job = _bare_job(4 * 6 * 4, 4 * 24 + 8 * 5, output_template=template)
    job.inputs = lambda seed: [torch.randn(6, 4)]
    seen = []
    job.device.kernels.digests = lambda outs, key: seen.extend(outs) or ["0" * 32] * len(outs)
    replay = job._replay(3, 1.0)
    assert replay["wall_s"] > 0 and replay["empty_ms"] >= 0 and len(seen) == 3
    for call in seen:
        leaves = [call[0], call[1][0]]
        assert [(t.shape, t.dtype, t.stride(), t.device.type) for t in leaves] == \
            [(t.shape, t.dtype, t.stride(), "cpu") for t in (out[0], out[1][0])]
        assert type(call) is tuple and type(call[1]) is list and call[1][1] == 3


def test_large_outputs_are_accepted_up_to_the_granted_buffer():
    """A revealed output takes no more host memory than the pool granted: over 1 GiB, the judge accepts what the
    buffer holds (an output with the reference's shapes always fits); smaller outputs may be up to twice the size."""
    from cuda_eval.judge.job import OUTPUT_SLACK_BYTES
    from cuda_eval.protocol import wire
    big = _bare_job(8 << 30, 8 << 30, output_sizes=[8 << 30], large_output=True)
    assert big.max_output_bytes() == big.output_buffer_bytes() == wire.layout_bytes([8 << 30]) + OUTPUT_SLACK_BYTES
    small = _bare_job(1 << 20, 3 << 20, output_sizes=[1 << 20, 2 << 20], large_output=False)
    assert small.max_output_bytes() == 2 * (3 << 20) + (1 << 16)
    # the least a candidate's process holds: a call's inputs and output, the previous call's output, the weights
    assert big.worker_least_bytes() == 24 << 30


def test_large_tensors_are_digested_in_chunks_to_the_same_value(monkeypatch):
    """Over CHUNK_BYTES the torch-op digest (CPU, a GPU without NVRTC, a host copy digested on the card) runs in
    chunks of lanes, with the same value as the one-piece spec: temporaries of a chunk, not ~4x the output."""
    import torch
    from cuda_eval.protocol import device_kernels
    kernels = device_kernels.Kernels("cpu")
    base = torch.randn(50_003)
    tensors = [base, base.half(), base[1:].view(torch.uint8)[:30_001], torch.randn(300, 170).t(),
               base.to(torch.float64), torch.zeros(5)]
    expected = [device_kernels.digest_tensor_torch(t, 77) for t in tensors]
    monkeypatch.setattr(device_kernels, "CHUNK_LANES", 256)
    monkeypatch.setattr(device_kernels, "CHUNK_BYTES", 4 * 16 * 256)
    chunked = kernels.digests(tensors, 77)
    assert chunked == kernels.digests([wire_received(t) for t in tensors], 77, device=torch.device("cpu"))
    monkeypatch.setattr(device_kernels, "CHUNK_BYTES", 1 << 40)
    assert kernels.digests(tensors, 77) == chunked
    for t, digest in zip(tensors, expected):
        values, n = device_kernels._values_torch_chunked(t, 77, torch.device("cpu"), chunk_lanes=512)
        assert device_kernels.finish(device_kernels._host_bytes(values), n, 77) == digest


def wire_received(t):
    from cuda_eval.protocol import wire
    return wire.Received(t.contiguous().clone(), "cuda")


def test_a_large_recent_size_a_free_block_covers_is_not_poisoned_anew():
    """The worker poisons every free block of its allocator and a block of each recent output size; a multi-GB size
    that a free block already holds is not allocated again (the process would keep another 8 GiB)."""
    from cuda_eval.worker.dynamic_checks import POISON_COVERED_MIN_BYTES as big, poison_sizes
    assert poison_sizes([], [1 << 20]) == [1 << 20]
    assert poison_sizes([2 << 20], [1 << 20]) == [2 << 20, 1 << 20]        # small sizes: as before
    assert poison_sizes([8 * big, 3 * big], [8 * big]) == [8 * big, 3 * big]
    assert poison_sizes([3 * big], [8 * big]) == [8 * big, 3 * big]        # no free block holds it
    assert poison_sizes([9 * big, 8 * big], [8 * big, 8 * big]) == [9 * big, 8 * big]
    assert poison_sizes([8 * big], [8 * big, 8 * big]) == [8 * big, 8 * big]


def test_the_pool_refuses_outputs_over_the_judges_own_memory_limit():
    """The judge's memory cgroup is charged for the buffer's pages and its host copy: a task whose outputs exceed
    its limit gets the task-level verdict before the judge could be killed for them."""
    import threading
    import time

    from cuda_eval.orchestrator import gpu_pool
    pool = GpuPool.__new__(GpuPool)    # the grant's arithmetic only: no processes
    pool.config = PoolConfig(device_type="cpu", devices=("cpu0",), data_bytes=16 << 30)
    pool._memory, pool._granted, pool._counter = threading.Condition(), {}, iter(range(100))
    with pytest.raises(MemoryError, match="judge's process"):
        pool._reserve_host_memory(12 << 30, time.monotonic() + 1)
    token = pool._reserve_host_memory(1 << 20, time.monotonic() + 1)     # small needs: granted unchecked
    pool._release_host_memory(token)
    assert gpu_pool.JUDGE_OWN_MEMORY < 16 << 30 and not pool._granted


def test_output_buffers_leave_a_large_host_its_share_free(monkeypatch):
    """On a large host the grant leaves 2% of its memory free (not only 2 GiB): a trainer beside the evaluator stops
    its run below 1% (kevin_jax gpu.host_memory_floor), and a host with an offloaded optimiser state pinned thrashes
    before that. Fake sizes stand in for the host (500 GiB, 12 GiB available)."""
    import os
    import threading
    import time

    from cuda_eval.orchestrator import host_memory
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 1 << 28 < host_memory.host_memory_total() <= physical       # the container's limit, where there is one
    fake_total = {"bytes": 500 << 30}
    monkeypatch.setattr(host_memory, "host_memory_total", lambda: fake_total["bytes"])
    monkeypatch.setattr(host_memory, "host_memory_available", lambda: 12 << 30)
    assert host_memory.host_memory_reserve() == 10 << 30
    pool = GpuPool.__new__(GpuPool)    # the grant's arithmetic only: no processes
    pool.config = PoolConfig(device_type="cpu", devices=("cpu0",), data_bytes=None)
    pool._memory, pool._granted, pool._counter = threading.Condition(), {}, iter(range(100))
    with pytest.raises(MemoryError, match="2.00 GiB available"):
        pool._reserve_host_memory(4 << 30, time.monotonic() + 1)
    pool._release_host_memory(pool._reserve_host_memory(1 << 30, time.monotonic() + 1))
    fake_total["bytes"] = 24 << 30                                  # a small host: the 2 GiB floor
    assert host_memory.host_memory_reserve() == host_memory.HOST_MEMORY_RESERVE


def test_a_trainer_sets_the_reserve_an_output_buffer_leaves(monkeypatch):
    """EvalConfig.host_memory_reserve_gib: beside a trainer whose floor is 5 GiB of a 500 GiB host (kevin_jax sets
    its floor plus a margin), an output buffer may use what is available above that line, not above the default
    2% (10 GiB): with 12 GiB available a 4 GiB need is granted, a 7 GiB one is a task-level verdict."""
    import threading
    import time

    from cuda_eval.orchestrator import gpu_pool, host_memory
    from cuda_eval.api import EvalConfig, Evaluator
    monkeypatch.setattr(host_memory, "host_memory_total", lambda: 500 << 30)
    monkeypatch.setattr(host_memory, "host_memory_available", lambda: 12 << 30)
    made = {}                          # the pool config the Evaluator makes from its EvalConfig (no processes)
    monkeypatch.setattr(gpu_pool, "GpuPool", lambda config: made.setdefault("config", config))
    evaluator = Evaluator.__new__(Evaluator)
    evaluator.config = EvalConfig(device_type="cpu", host_memory_reserve_gib=6.0, worker_memory_bytes=0)
    evaluator._make_gpu_pool(0)
    assert made["config"].host_memory_reserve_bytes == 6 << 30
    pool = GpuPool.__new__(GpuPool)    # the grant's arithmetic only
    pool.config = made["config"]
    pool._memory, pool._granted, pool._counter = threading.Condition(), {}, iter(range(100))
    pool._release_host_memory(pool._reserve_host_memory(4 << 30, time.monotonic() + 1))
    with pytest.raises(MemoryError, match="6.00 GiB available"):
        pool._reserve_host_memory(7 << 30, time.monotonic() + 1)
    with pytest.raises(ValueError, match="host_memory_reserve_gib"):
        EvalConfig(host_memory_reserve_gib=-1.0)
