"""The largest outputs KernelBench has, on a real GPU: a relu over 6 GiB of floats (level 1's activations), an L2
norm with 8 GiB in and out (its largest) and a 1.5 GiB tuple output with an int64 part, each with the copy candidate
of benchmarks/kernelbench_sweep.py, honest and wrong. Before the output channel moved to the pool, every one of these
was an internal evaluator error (EFBIG under the workers' 4 GiB RLIMIT_FSIZE). On a card too small for a task the
verdict is the task-level too-big one; never an internal error. Synthetic tasks: no KernelBench files needed."""
import importlib.util
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from cuda_eval.api import EvalConfig, EvalRequest, Evaluator

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("kernelbench_sweep", REPO / "benchmarks" / "kernelbench_sweep.py")
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor):
        return {expr}


batch_size = {rows}
dim = {cols}


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
'''
GIB = 1 << 30
# name: (forward, rows, cols, output bytes)
TASKS = {
    "relu_6gib": ("torch.relu(x)", 4096, 393216, 6 * GIB),
    "l2norm_8gib": ("x / torch.norm(x, p=2, dim=1, keepdim=True)", 32768, 65536, 8 * GIB),
    "tuple_1p5gib": ("(torch.relu(x), torch.argmax(x, dim=1))", 4096, 98304, 3 * GIB // 2 + 4096 * 8),
}


def card_bytes() -> int:
    out = subprocess.run([shutil.which("nvidia-smi") or "nvidia-smi", "-i", "0", "--query-gpu=memory.total",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    return int(out.stdout.split()[0]) << 20


def task_source(name: str) -> str:
    expr, rows, cols, _ = TASKS[name]
    return TASK.format(expr=expr, rows=rows, cols=cols)


@pytest.fixture(scope="module")
def results():
    requests = [EvalRequest(name, task_source(name), sweep.response(sweep.copy_candidate(task_source(name),
                                                                                         wrong=wrong)),
                            f"{name}/{'wrong' if wrong else 'honest'}")
                for name in TASKS for wrong in (False, True)]
    with tempfile.TemporaryDirectory() as ref_dir, \
            Evaluator(EvalConfig(devices="0", run_timeout_s=600, spare_workers=2, skip_run_on_static_flags=False,
                                 strict=True, num_correct_trials=2, timing_min_reps=5, timing_max_reps=5,
                                 timing_input_sets=1, ref_timing_cache_dir=ref_dir)) as ev:
        return {req.request_id: r for req, r in zip(requests, ev.evaluate(requests))}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_large_outputs_are_judged(results, name):
    honest, wrong = results[f"{name}/honest"], results[f"{name}/wrong"]
    for r in (honest, wrong):
        assert sweep.verdict_class(r, flags_count=False) != "internal_error", r.runtime_error
    output_bytes = TASKS[name][3]
    # the judge holds the task's inputs and outputs a few times over, the candidate's process as much again
    if card_bytes() < 8 * output_bytes:
        assert sweep.verdict_class(honest, flags_count=False) in ("ok", "too_big"), honest.runtime_error
        return
    assert sweep.verdict_class(honest, flags_count=False) == "ok", (honest.runtime_error, honest.trials[-1:])
    # its many groups (a call or two each) all reach the judge's kernel-trace check: no broken-trace flag
    assert "timing_inconsistent" not in {f["code"] for f in honest.hack_flags}, (honest.hack_flags,
                                                                                  honest.meta.get("call_trace"))
    assert sweep.verdict_class(wrong, flags_count=False) == "incorrect", (wrong.runtime_error, wrong.trials[-1:])
    assert re.search(r"(^|: )1 of \d+ elements differ", wrong.trials[-1]["message"])  # the one element changed
    meta = honest.meta
    assert meta["output_buffer_bytes"] >= output_bytes
    assert meta["worker_peak_rss_bytes"] > 0 and meta["judge_peak_device_bytes"] > output_bytes
    # Inputs as large as the outputs here: the judge holds at most a call's inputs, the reference's output and the
    # candidate's (warm-up: two copies of the inputs and one output), whatever the timing protocol's groups and
    # replays add (docs/EVALUATOR.md, "Task-level verdicts").
    assert meta["judge_peak_device_bytes"] <= 3 * output_bytes + 3 * GIB, meta["judge_peak_device_bytes"]
    assert honest.meta.get("timed_output_check") == "passed"


def test_a_host_copy_is_digested_on_the_card_in_chunks():
    """A revealed output the judge could only copy to the host is checked against its digest on the card chunk by
    chunk (never a second whole copy there), with the value the worker's NVRTC kernel commits to."""
    import torch

    from cuda_eval.protocol import device_kernels, wire
    kernels = device_kernels.Kernels("cuda")
    assert kernels.backend == "nvrtc", kernels.fallback_reason
    t = torch.randn(GIB // 4 + 3, device="cuda")
    committed = kernels.digests([t], 99)
    host = wire.Received(t.cpu(), "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    assert kernels.digests([host], 99, device=torch.device("cuda", 0)) == committed
    assert torch.cuda.max_memory_allocated() - before < GIB // 2
