import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_source = r"""
#include <torch/extension.h>

#define TILE 32

// C[M, N] = A[M, K] @ B[N, K]^T, both operands row-major with K contiguous. 32x32 output tile per block.
__global__ void matmul_nt_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                 int M, int N, int K) {
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE + 1];  // +1: conflict-free reads along the row below
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    int b_row = blockIdx.x * TILE + threadIdx.y;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int k = k0 + threadIdx.x;
        a_tile[threadIdx.y][threadIdx.x] = (row < M && k < K) ? A[(long)row * K + k] : 0.0f;
        b_tile[threadIdx.y][threadIdx.x] = (b_row < N && k < K) ? B[(long)b_row * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += a_tile[threadIdx.y][kk] * b_tile[threadIdx.x][kk];
        __syncthreads();
    }
    if (row < M && col < N) C[(long)row * N + col] = acc;
}

torch::Tensor matmul_nt_cuda(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(1) == B.size(1), "shapes must be (M, K) and (N, K)");
    auto a = A.contiguous();
    auto b = B.contiguous();
    int M = a.size(0), K = a.size(1), N = b.size(0);
    auto C = torch::empty({M, N}, a.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_nt_kernel<<<grid, block>>>(a.data_ptr<float>(), b.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    return C;
}
"""

matmul_cpp = "torch::Tensor matmul_nt_cuda(torch::Tensor A, torch::Tensor B);"

matmul_ext = load_inline(
    name="builtin_l1_matmul_nt_correct",
    cpp_sources=matmul_cpp,
    cuda_sources=matmul_source,
    functions=["matmul_nt_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul_ext.matmul_nt_cuda(A, B)
