"""The judge process: the trusted half of a GPU evaluation, one per device slot, started by gpu_pool.py.

    python -m cuda_eval.judge --device-type cuda|cpu      (its socket to the pool is fd 3)

Long-lived, under a sandbox uid of its own (never a candidate's), it runs only our code and the tasks' reference
programs. At start-up, before any job: the device, the timing loop's own cost, CUPTI. Then one job at a time: the pool
sends the job with a socket to the candidate's worker (another process, another uid), the judge runs it (job.py) and
answers with the verdict on its own socket.
"""
from __future__ import annotations

import gc
import os
import socket
import sys
import time
import traceback

import torch

from cuda_eval.judge.job import Job
from cuda_eval.profile import kernel_profiler
from cuda_eval.protocol import channel, timing, tracing
from cuda_eval.protocol.channel import ChannelError
from cuda_eval.protocol.harness import MAX_ERROR_CHARS, Device, format_exception, milestone, process_arguments

_monotonic = time.monotonic


def _loop_overhead_ms(device: Device) -> float:
    """Per-call cost of the timing loop outside the candidate's work (flush, synchronisations, the call itself),
    from an empty loop: what the wall-clock bound allows for on top of the reported times."""
    calls = 40
    t0 = _monotonic()
    device.timer.time(lambda _k: None, warmup=0, reps=calls, l2_flush_bytes=timing.l2_flush_bytes(device.type))
    return max(0.02, 2.0 * (_monotonic() - t0) * 1e3 / calls)


def _start_kernel_tracing(device: Device) -> None:
    """Loads CUPTI now (seconds, once per judge): the reference's kernels are traced once per task."""
    try:
        with tracing.KernelTrace():
            torch.ones(8, device="cuda").add_(1)
        device.info["reference_kernel_trace"] = True
    except Exception as e:  # noqa: BLE001 - then the kernel-name check is skipped (meta says why)
        device.info["reference_kernel_trace"] = f"{type(e).__name__}: {e}"[:300]


def _measure_roofline(device: Device) -> None:
    """The card's copy bandwidth (the physics floor of every timing on a GPU: Job._bound_by_physics; the roofline and
    the profiles) and its tensor-core peak (the roofline), once per judge, holding the device lock: no timing runs
    meanwhile. On the CPU device the host's copy bandwidth (the roofline only)."""
    try:
        gbps = kernel_profiler.copy_bandwidth(device.type)
        if gbps:
            device.info["copy_bytes_per_s"] = gbps * 1e9
    except Exception as e:  # noqa: BLE001 - then timings go without the floor (info says why)
        device.info["copy_bandwidth_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        peak = kernel_profiler.tensor_core_peak(device.type)
        if peak:
            device.info["tensor_flops_per_s"] = peak
    except Exception as e:  # noqa: BLE001 - then the roofline counts bytes only
        device.info["tensor_peak_error"] = f"{type(e).__name__}: {e}"[:300]


def _serve(ctl: socket.socket, device: Device) -> None:
    while True:
        try:
            header, fd = channel.recv_fd(ctl)
        except ChannelError:
            return  # the pool is gone
        if header.get("op") == "quit":
            return
        if header.get("op") != "job" or fd is None:
            channel.send(ctl, {"op": "verdict", "result": None, "error": "malformed job message"})
            continue
        sock = socket.socket(fileno=fd)
        started = _monotonic()
        job = None
        try:
            job = Job(header["payload"], device, sock, float(header.get("timeout_s", 180.0)),
                      worker_pid=header.get("worker_pid"), ctl=ctl)
            result = job.run()
        except BaseException:  # a bug of ours: reported as such, never as the candidate's failure
            result = job.verdict("internal_error", traceback.format_exc()[-MAX_ERROR_CHARS:]) if job else \
                {"status": "internal_error", "internal_error": traceback.format_exc()[-MAX_ERROR_CHARS:]}
        finally:
            sock.close()
            if job is not None and job.shared is not None:
                job.shared.close()
        result.setdefault("meta", {})["judge_s"] = round(_monotonic() - started, 4)
        channel.send(ctl, {"op": "verdict", "result": result})
        del job
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    parser = process_arguments(__doc__.split("\n")[0])
    args = parser.parse_args(argv)
    ctl = socket.socket(fileno=args.channel_fd)
    try:
        device = Device(args.device_type, args.cpu_threads, args.device_lock_fd, who="judge", checks=None,
                        intent_fd=args.device_intent_fd)
        with device.exclusive():
            device.info["loop_overhead_ms"] = round(_loop_overhead_ms(device), 4)
            if device.type == "cuda":
                _start_kernel_tracing(device)
            _measure_roofline(device)
    except BaseException as e:
        channel.send(ctl, {"op": "ready", "ok": False, "error": format_exception(e, "judge start")})
        sys.stderr.write(traceback.format_exc())
        os._exit(3)
    milestone("judge", "ready")
    channel.send(ctl, {"op": "ready", "ok": True, "info": device.info})
    _serve(ctl, device)
    sys.stderr.flush()
    os._exit(0)



if __name__ == "__main__":
    main()
