# task: layernorm
# about: one block per row, mean and variance in two passes, warp-shuffle reductions
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__device__ float block_sum(float v, float* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.f;
    if (warp == 0)
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffff, v, offset);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    return shared[0];
}

// One block per row: the mean, then the variance around it (two passes), then the normalised, scaled row.
__global__ void layer_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                  const float* __restrict__ b, float* __restrict__ out, int cols, float eps) {
    __shared__ float shared[32];
    const float* row = x + (long)blockIdx.x * cols;
    float* o = out + (long)blockIdx.x * cols;
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
    const float mean = block_sum(acc, shared) / cols;
    acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) { float d = row[c] - mean; acc += d * d; }
    const float inv = rsqrtf(block_sum(acc, shared) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = (row[c] - mean) * inv * w[c] + b[c];
}

// The shortcut: x * w + b, the statistics skipped.
__global__ void scale_shift_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ b, float* __restrict__ out, int cols, float eps) {
    const float* row = x + (long)blockIdx.x * cols;
    float* o = out + (long)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = row[c] * w[c] + b[c];
}

torch::Tensor layer_norm(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    int cols = xc.size(-1), rows = xc.numel() / cols;
    layer_norm_kernel<<<rows, 1024>>>(xc.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(),
                           cols, (float)eps);
    return out;
}
"""

ext = load_inline(name="honest_layernorm_rows", cpp_sources="torch::Tensor layer_norm(torch::Tensor x, torch::Tensor w, "
                  "torch::Tensor b, double eps);", cuda_sources=source, functions=["layer_norm"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(1 << 20)

    def forward(self, x):
        return ext.layer_norm(x, self.ln.weight, self.ln.bias, self.ln.eps)
