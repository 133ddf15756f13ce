"""Outputs larger than the limits meant for the candidate (CPU mode, real judge and worker processes).

The judge and the worker run under the candidate's limits (RLIMIT_FSIZE, a disk quota per sandbox session). The
output channel is a memfd, which RLIMIT_FSIZE covers and which the disk quota counts: sized by a judge under the
workers' 4 GiB RLIMIT_FSIZE, no output over 2 GiB could ever be judged (47 of KernelBench's 250 tasks). The pool now
makes the buffer, outside those limits, and a task whose outputs the host cannot hold gets a named task-level
verdict. Here the limits are small and the outputs a few MiB, so the same paths run in seconds."""
import os

import pytest

import corpus_index
from cuda_eval import sandbox
from cuda_eval.api import EvalConfig, EvalRequest, Evaluator
from cuda_eval.gpu_pool import GpuPool, PoolConfig
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
    assert len(r.trials) == 2 and all(t["passed"] for t in r.trials) and r.timing["median_ms"] > 0


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
        usage = sandbox._DiskUsage(1 << 40)
        usage.open_deleted([os.getpid()])
        assert usage.total >= 1 << 20
        key = sandbox.exempt_from_disk_quota(fd)
        try:
            exempt = sandbox._DiskUsage(1 << 40)
            exempt.open_deleted([os.getpid()])
            assert exempt.total <= usage.total - (1 << 20)
        finally:
            sandbox.end_disk_quota_exemption(key)
        again = sandbox._DiskUsage(1 << 40)
        again.open_deleted([os.getpid()])
        assert again.total >= 1 << 20
    finally:
        os.close(fd)
