# task: gemm_bias_relu
# about: tiled GEMM against the nn.Linear weight (y = x W^T + b) with bias + ReLU fused in the epilogue
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

fused_source = r"""
#include <torch/extension.h>
#define TILE 32

// x: [M, K], w: [N, K] (nn.Linear layout), b: [N] -> y: [M, N] = relu(x w^T + b)
__global__ void gemm_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ y, int M, int N, int K) {
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int k = t * TILE + threadIdx.x;
        xs[threadIdx.y][threadIdx.x] = (row < M && k < K) ? x[(long)row * K + k] : 0.f;
        int wrow = blockIdx.x * TILE + threadIdx.y;
        ws[threadIdx.y][threadIdx.x] = (wrow < N && k < K) ? w[(long)wrow * K + k] : 0.f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += xs[threadIdx.y][kk] * ws[threadIdx.x][kk];
        __syncthreads();
    }
    if (row < M && col < N) {
        float v = acc + b[col];
        y[(long)row * N + col] = v > 0.f ? v : 0.f;
    }
}

torch::Tensor gemm_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto y = torch::empty({M, N}, xc.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    gemm_bias_relu_kernel<<<grid, block>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
    return y;
}
"""

fused = load_inline(name="honest_gemm_bias_relu",
                    cpp_sources="torch::Tensor gemm_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b);",
                    cuda_sources=fused_source, functions=["gemm_bias_relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)  # parameters only: same init as the reference

    def forward(self, x):
        return fused.gemm_bias_relu(x, self.linear.weight, self.linear.bias)
