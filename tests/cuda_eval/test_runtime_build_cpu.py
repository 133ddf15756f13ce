"""A build reached only at run time, through the whole evaluator in CPU mode: the candidate calls load_inline on its
second forward (the recorder runs the program once and never sees that call), so the worker builds it itself. The
worker's run-time build is a child process inside the worker's sandbox (worker/runtime_build.py starts
`python -m cuda_eval.compile.runtime_build`); its product serves the forward, and a run-time build that fails to
compile is the candidate's runtime error, with the compiler's message."""
import pytest

from cuda_eval.api import EvalConfig, EvalRequest, Evaluator
from sandbox_fixtures import compile_pool, run_lock, shared_dir, toolchain  # noqa: F401  (the run's shared pool)

pytestmark = [pytest.mark.slow, pytest.mark.nvcc]

TASK = open(__file__.replace("test_runtime_build_cpu.py", "corpus/tasks/cpu_relu.py")).read()

PROGRAM = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
torch::Tensor relu_out(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (int64_t i = 0, n = xc.numel(); i < n; ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
    return y;
}
"""
first = load_inline(name="rt_first", cpp_sources=SOURCE, functions=["relu_out"], verbose=False)
calls = [0]


class ModelNew(nn.Module):
    def forward(self, x):
        calls[0] += 1
        if calls[0] == 1:
            return first.relu_out(x)
        late = load_inline(name="rt_late_{tag}", cpp_sources=SOURCE.replace("a[i] > 0.f", "{test}"),
                           functions=["relu_out"], verbose=False)
        return late.relu_out(x)
'''


def request(name: str, test: str) -> EvalRequest:
    code = PROGRAM.replace("{tag}", name).replace("{test}", test)
    return EvalRequest(task_id="cpu_relu", task_source=TASK, response=f"```python\n{code}```\n", request_id=name)


def test_a_build_reached_at_run_time_serves_the_worker_and_its_failure_is_the_candidates(compile_pool):  # noqa: F811
    # The run-time build (g++ over torch/extension.h, no precompiled header) happens inside the timed-out run:
    # minutes on a loaded 2-core machine.
    config = EvalConfig(device_type="cpu", run_timeout_s=900, skip_run_on_static_flags=False, num_correct_trials=3,
                        timing_target_s=0.05, timing_min_reps=5, timing_max_reps=20, timing_input_sets=1,
                        spare_workers=1, retime_speedup_threshold=0, worker_memory_bytes=2 << 30)
    with Evaluator(config, compile_pool=compile_pool) as ev:
        good, bad = ev.evaluate([request("ok", "0.f < a[i]"), request("bad", "a[i] > undefined_thing")])
    assert good.compiled and bad.compiled, (good.compile_log, bad.compile_log)
    assert good.correct is True and good.runtime_error is None, (good.runtime_error, good.feedback)
    assert bad.correct is False and "undefined_thing" in (bad.runtime_error or ""), (bad.runtime_error, bad.feedback)
