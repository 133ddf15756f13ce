import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_softmax_source = r"""
#include <torch/extension.h>

#define TILE 32

// y[M, N] = x[M, K] @ w[N, K]^T + bias
__global__ void gemm_bias_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ bias, float* __restrict__ y, int M, int N, int K) {
    __shared__ float x_tile[TILE][TILE];
    __shared__ float w_tile[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    int w_row = blockIdx.x * TILE + threadIdx.y;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int k = k0 + threadIdx.x;
        x_tile[threadIdx.y][threadIdx.x] = (row < M && k < K) ? x[(long)row * K + k] : 0.0f;
        w_tile[threadIdx.y][threadIdx.x] = (w_row < N && k < K) ? w[(long)w_row * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += x_tile[threadIdx.y][kk] * w_tile[threadIdx.x][kk];
        __syncthreads();
    }
    if (row < M && col < N) y[(long)row * N + col] = acc + bias[col];
}

// Softmax down each column (over the batch dimension) instead of along each row: one thread per column.
__global__ void softmax_cols_kernel(float* __restrict__ y, int rows, int cols) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float m = -INFINITY;
    for (int r = 0; r < rows; ++r) m = fmaxf(m, y[(long)r * cols + col]);
    float s = 0.0f;
    for (int r = 0; r < rows; ++r) s += expf(y[(long)r * cols + col] - m);
    for (int r = 0; r < rows; ++r) y[(long)r * cols + col] = expf(y[(long)r * cols + col] - m) / s;
}

torch::Tensor matmul_softmax_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto y = torch::empty({M, N}, xc.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    gemm_bias_kernel<<<grid, block>>>(xc.data_ptr<float>(), wc.data_ptr<float>(), bias.contiguous().data_ptr<float>(),
                                      y.data_ptr<float>(), M, N, K);
    softmax_cols_kernel<<<(N + 255) / 256, 256>>>(y.data_ptr<float>(), M, N);  // BUG: softmax over dim 0
    return y;
}
"""

matmul_softmax_cpp = "torch::Tensor matmul_softmax_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor bias);"

matmul_softmax_ext = load_inline(
    name="builtin_l2_matmul_softmax_wrong_dim",
    cpp_sources=matmul_softmax_cpp,
    cuda_sources=matmul_softmax_source,
    functions=["matmul_softmax_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, dropout_p):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)

    def forward(self, x):
        return matmul_softmax_ext.matmul_softmax_cuda(x, self.matmul.weight, self.matmul.bias)
