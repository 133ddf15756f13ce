import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

rms_source = r"""
#include <torch/extension.h>

// x: [B, C, S] with S = H*W; normalise over C for every (b, s).
__global__ void rmsnorm_channels_kernel(const float* __restrict__ x, float* __restrict__ y, int C, int64_t S,
                                        int64_t total, float eps) {
    int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= total) return;
    int64_t b = idx / S, s = idx % S;
    const float* p = x + b * C * S + s;
    float acc = 0.f;
    for (int c = 0; c < C; ++c) { float v = p[(int64_t)c * S]; acc += v * v; }
    float inv = rsqrtf(acc / C + eps);
    float* q = y + b * C * S + s;
    for (int c = 0; c < C; ++c) q[(int64_t)c * S] = p[(int64_t)c * S] * inv;
}

torch::Tensor rmsnorm_cuda(torch::Tensor x, double eps) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int C = xc.size(1);
    int64_t S = xc.numel() / (xc.size(0) * C);
    int64_t total = xc.size(0) * S;
    rmsnorm_channels_kernel<<<(total + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), C, S, total,
                                                          (float)eps);
    return y;
}
"""

rms_ext = load_inline(name="rmsnorm_channels", cpp_sources="torch::Tensor rmsnorm_cuda(torch::Tensor x, double eps);",
                      cuda_sources=rms_source, functions=["rmsnorm_cuda"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return rms_ext.rmsnorm_cuda(x, self.eps)
