# task: matmul
# about: 32x32 shared-memory tiles, one output element per thread (correct, slower than cuBLAS)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_cuda = r"""
#include <torch/extension.h>
#define TILE 32

__global__ void matmul_tiled_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                    int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int ak = t * TILE + threadIdx.x;
        int bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[(long)row * K + ak] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[(long)bk * N + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[(long)row * N + col] = acc;
}

torch::Tensor matmul_tiled(torch::Tensor A, torch::Tensor B) {
    auto a = A.contiguous();
    auto b = B.contiguous();
    int M = a.size(0), K = a.size(1), N = b.size(1);
    auto C = torch::empty({M, N}, a.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_tiled_kernel<<<grid, block>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    return C;
}
"""

matmul_ext = load_inline(name="honest_matmul_tiled", cpp_sources="torch::Tensor matmul_tiled(torch::Tensor A, torch::Tensor B);",
                         cuda_sources=matmul_cuda, functions=["matmul_tiled"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A, B):
        return matmul_ext.matmul_tiled(A, B)
