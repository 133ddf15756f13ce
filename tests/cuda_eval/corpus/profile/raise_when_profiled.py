# task: cpu_relu
# verdict: correct
# about: raises when it finds the profiler's frames on its stack; an honest kernel otherwise
import os
import sys
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


def _profiled():
    frame = sys._getframe(1)
    while frame is not None:
        if "profile" in frame.f_code.co_name:
            return True
        frame = frame.f_back
    return False


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if _profiled():
            raise RuntimeError("no profiling, please")
        return cpu_ext.relu_out(x)
