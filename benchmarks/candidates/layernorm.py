import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_source = r"""
#include <torch/extension.h>

template <int BLOCK>
__device__ float block_sum(float v, float* smem) {
    smem[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
        __syncthreads();
    }
    float r = smem[0];
    __syncthreads();
    return r;
}

template <int BLOCK>
__global__ void layernorm_kernel(const float* x, const float* gamma, const float* beta, float* y, int n, float eps) {
    __shared__ float smem[BLOCK];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK) s += xr[i];
    float mean = block_sum<BLOCK>(s, smem) / n;
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += BLOCK) { float d = xr[i] - mean; v += d * d; }
    float rstd = rsqrtf(block_sum<BLOCK>(v, smem) / n + eps);
    for (int i = threadIdx.x; i < n; i += BLOCK) yr[i] = (xr[i] - mean) * rstd * gamma[i] + beta[i];
}

torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int n = xc.size(-1);
    int rows = xc.numel() / n;
    layernorm_kernel<256><<<rows, 256>>>(xc.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                                          y.data_ptr<float>(), n, (float)eps);
    return y;
}
"""

layernorm_cpp = "torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps);"

layernorm_ext = load_inline(name="layernorm_ext", cpp_sources=layernorm_cpp, cuda_sources=layernorm_source,
                            functions=["layernorm_cuda"], extra_cuda_cflags=["-O3", "--use_fast_math"])


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: int):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return layernorm_ext.layernorm_cuda(x, self.ln.weight, self.ln.bias, self.ln.eps)
