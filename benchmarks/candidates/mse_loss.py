import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

mse_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void sq_diff_sum_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ acc,
                                   int64_t n) {
    __shared__ float partial[256];
    float s = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float d = a[i] - b[i];
        s += d * d;
    }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(acc, partial[0]);
}

torch::Tensor mse_cuda(torch::Tensor predictions, torch::Tensor targets) {
    auto a = predictions.contiguous(), b = targets.contiguous();
    auto acc = torch::zeros({}, a.options());
    int64_t n = a.numel();
    sq_diff_sum_kernel<<<1024, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), acc.data_ptr<float>(), n);
    return acc / (double)n;
}
"""

mse_ext = load_inline(name="mse_ext", cpp_sources="torch::Tensor mse_cuda(torch::Tensor predictions, torch::Tensor targets);",
                      cuda_sources=mse_source, functions=["mse_cuda"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return mse_ext.mse_cuda(predictions, targets)
