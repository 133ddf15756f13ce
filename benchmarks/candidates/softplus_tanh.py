import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Two functions in one extension: the fused Mish used by forward, and a plain softplus.
mish_source = r"""
#include <torch/extension.h>

__device__ __forceinline__ float softplus_f(float v) { return v > 20.f ? v : log1pf(expf(v)); }

__global__ void softplus_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = softplus_f(x[i]);
}

__global__ void mish_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; y[i] = v * tanhf(softplus_f(v)); }
}

torch::Tensor softplus_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    softplus_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}

torch::Tensor mish_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    mish_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

mish_cpp = """
torch::Tensor softplus_cuda(torch::Tensor x);
torch::Tensor mish_cuda(torch::Tensor x);
"""

mish_ext = load_inline(name="mish_ext", cpp_sources=mish_cpp, cuda_sources=mish_source,
                       functions={"softplus_cuda": "softplus", "mish_cuda": "x * tanh(softplus(x))"})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return mish_ext.mish_cuda(x.contiguous())
