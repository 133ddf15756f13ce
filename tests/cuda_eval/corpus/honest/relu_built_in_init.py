# task: relu
# about: the extension is built inside __init__ (some real solutions do this), not at import
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>

__global__ void relu_init_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    relu_init_kernel<<<(n + 511) / 512, 512>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="honest_relu_init", cpp_sources="torch::Tensor run(torch::Tensor x);",
                               cuda_sources=SOURCE, functions=["run"], verbose=False)

    def forward(self, x):
        return self.ext.run(x.contiguous())
