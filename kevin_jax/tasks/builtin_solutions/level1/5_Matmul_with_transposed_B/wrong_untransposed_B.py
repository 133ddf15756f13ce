import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_source = r"""
#include <torch/extension.h>

// One thread per output element. Reads B as if it were stored (K, N), which it is not.
__global__ void matmul_naive_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                    int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[(long)row * K + k] * B[(long)k * N + col];  // BUG: B is (N, K)
    C[(long)row * N + col] = acc;
}

torch::Tensor matmul_naive_cuda(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "inputs must be CUDA tensors");
    auto a = A.contiguous();
    auto b = B.contiguous();
    int M = a.size(0), K = a.size(1), N = b.size(0);
    auto C = torch::empty({M, N}, a.options());
    dim3 block(16, 16);
    dim3 grid((N + 15) / 16, (M + 15) / 16);
    matmul_naive_kernel<<<grid, block>>>(a.data_ptr<float>(), b.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    return C;
}
"""

matmul_cpp = "torch::Tensor matmul_naive_cuda(torch::Tensor A, torch::Tensor B);"

matmul_ext = load_inline(
    name="builtin_l1_matmul_nt_wrong_layout",
    cpp_sources=matmul_cpp,
    cuda_sources=matmul_source,
    functions=["matmul_naive_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul_ext.matmul_naive_cuda(A, B)
