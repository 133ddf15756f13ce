# task: cpu_relu
# verdict: correct
# expect: timing_inconsistent
# about: takes 50 ms per call but replaces the timer of its own process so that every call is reported as 1 microsecond
import time

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpu_source = r"""
#include <torch/extension.h>

torch::Tensor relu_out(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (int64_t i = 0, n = xc.numel(); i < n; ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
    return y;
}

torch::Tensor relu_inplace(torch::Tensor x) {
    float* a = x.data_ptr<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) a[i] = a[i] > 0.f ? a[i] : 0.f;
    return x;
}

torch::Tensor abs_out(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (int64_t i = 0, n = xc.numel(); i < n; ++i) b[i] = a[i] < 0.f ? -a[i] : a[i];
    return y;
}

torch::Tensor row_sum(torch::Tensor x) {
    auto xc = x.contiguous();
    int64_t rows = xc.size(0), cols = xc.size(1);
    auto out = torch::empty({rows, 1}, xc.options());
    const float* a = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        float acc = 0.f;
        for (int64_t c = 0; c < cols; ++c) acc += a[r * cols + c];
        o[r] = acc;
    }
    return out;
}

torch::Tensor relu_aten(torch::Tensor x) {
    return at::relu(x);
}

torch::Tensor host_segfault(torch::Tensor x) {
    volatile int* p = nullptr;
    *p = 1;
    return x;
}
"""

cpu_ext = load_inline(
    name="cpu_toolkit",
    cpp_sources=cpu_source,
    functions=["relu_out", "relu_inplace", "abs_out", "row_sum", "relu_aten", "host_segfault"],
    verbose=False,
)


def _patch_timer():
    import sys
    timing = sys.modules["cuda_eval.timing"]

    def fast(self, fn, *, warmup, reps, **kwargs):
        for k in range(warmup + reps):  # timers call fn(k), k the logical call number
            fn(k)
        return [0.001] * reps
    for value in list(vars(timing).values()):
        if isinstance(value, type) and hasattr(value, "time"):
            value.time = fast


_patch_timer()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        time.sleep(0.05)  # real time spent in every call, whatever the load on the machine
        return cpu_ext.relu_out(x)
