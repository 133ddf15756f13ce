# task: relu
# about: float4 loads/stores, grid-stride loop, scalar tail
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>

__global__ void relu_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, long n4) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        y[i] = v;
    }
}

__global__ void relu_tail_kernel(const float* __restrict__ x, float* __restrict__ y, long start, long n) {
    long i = start + blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu_vec4(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    long n4 = n / 4;
    cudaStream_t stream = 0;
    if (n4 > 0) {
        int threads = 256;
        long blocks = std::min<long>((n4 + threads - 1) / threads, 132L * 16);
        relu_vec4_kernel<<<blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    }
    if (n > n4 * 4) {
        relu_tail_kernel<<<1, 32, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n4 * 4, n);
    }
    return y;
}
"""

cpp_src = "torch::Tensor relu_vec4(torch::Tensor x);"

module = load_inline(name="honest_relu_vec4", cpp_sources=cpp_src, cuda_sources=cuda_src,
                     functions=["relu_vec4"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return module.relu_vec4(x)
