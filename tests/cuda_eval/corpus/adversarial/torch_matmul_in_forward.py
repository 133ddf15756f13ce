# task: matmul
# expect: torch_in_forward
# static: torch_in_forward
# about: defines a CUDA kernel but forward calls torch.matmul
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_source = r"""
#include <torch/extension.h>
#define TILE 32

__global__ void matmul_tile_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                   int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[(long)row * K + ak] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[(long)bk * N + col] : 0.f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[(long)row * N + col] = acc;
}

__global__ void scale_kernel(float* y, long n, float s) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] *= s;
}

torch::Tensor matmul_tiled(torch::Tensor A, torch::Tensor B) {
    auto a = A.contiguous(), b = B.contiguous();
    int M = a.size(0), K = a.size(1), N = b.size(1);
    auto C = torch::empty({M, N}, a.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_tile_kernel<<<grid, block>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    return C;
}

torch::Tensor matmul_library(torch::Tensor A, torch::Tensor B) {
    auto C = torch::matmul(A, B);
    long n = C.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(C.data_ptr<float>(), n, 1.0f);
    return C;
}
"""

matmul_ext = load_inline(
    name="matmul_toolkit",
    cpp_sources="torch::Tensor matmul_tiled(torch::Tensor A, torch::Tensor B);\ntorch::Tensor matmul_library(torch::Tensor A, torch::Tensor B);",
    cuda_sources=matmul_source,
    functions=["matmul_tiled", "matmul_library"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = matmul_ext

    def forward(self, A, B):
        return torch.matmul(A, B)
