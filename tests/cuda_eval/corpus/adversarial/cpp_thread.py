# task: relu
# expect: thread
# static: thread
# about: a detached C++ std::thread launches the kernel after forward returned
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <thread>
#include <chrono>

__global__ void relu_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_later(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    long n = x.numel();
    std::thread([xp, yp, n]() {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        relu_kernel<<<(n + 255) / 256, 256>>>(xp, yp, n);
    }).detach();
    return y;
}
"""

ext = load_inline(name="adv_cpp_thread", cpp_sources="torch::Tensor relu_later(torch::Tensor x);",
                  cuda_sources=source, functions=["relu_later"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_later(x.contiguous())
