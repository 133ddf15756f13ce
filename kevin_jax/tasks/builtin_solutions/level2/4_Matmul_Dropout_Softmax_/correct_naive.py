import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_softmax_source = r"""
#include <torch/extension.h>

// y[M, N] = x[M, K] @ w[N, K]^T + bias.
// One thread per output element, every operand read straight from global memory (no tiling, no reuse through shared
// memory): each thread streams a row of the left operand and a row of the right one, and the threads of a warp read
// 16 different rows of the right operand, a whole row apart.
__global__ void gemm_bias_naive_kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
                                       float* __restrict__ y, int M, int N, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    const float* a = A + (long)row * K;
    const float* b = B + (long)col * K;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a[k] * b[k];
    y[(long)row * N + col] = acc + bias[col];
}

__device__ float block_reduce(float v, float* scratch, bool is_max) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_xor_sync(0xffffffff, v, offset);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
        for (int offset = 16; offset > 0; offset >>= 1) {
            float other = __shfl_xor_sync(0xffffffff, v, offset);
            v = is_max ? fmaxf(v, other) : v + other;
        }
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    float result = scratch[0];
    __syncthreads();
    return result;
}

// In-place softmax of each row (one block per row).
__global__ void softmax_rows_kernel(float* __restrict__ y, int cols) {
    __shared__ float scratch[32];
    float* row = y + (long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, row[i]);
    float row_max = block_reduce(m, scratch, true);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += expf(row[i] - row_max);
    float inv_sum = 1.0f / block_reduce(s, scratch, false);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) row[i] = expf(row[i] - row_max) * inv_sum;
}

torch::Tensor matmul_softmax_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto y = torch::empty({M, N}, xc.options());
    dim3 block(16, 16);
    dim3 grid((N + 15) / 16, (M + 15) / 16);
    gemm_bias_naive_kernel<<<grid, block>>>(xc.data_ptr<float>(), wc.data_ptr<float>(), bias.contiguous().data_ptr<float>(),
                                      y.data_ptr<float>(), M, N, K);
    softmax_rows_kernel<<<M, 256>>>(y.data_ptr<float>(), N);
    return y;
}
"""

matmul_softmax_cpp = "torch::Tensor matmul_softmax_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor bias);"

matmul_softmax_ext = load_inline(
    name="builtin_l2_matmul_softmax_naive",
    cpp_sources=matmul_softmax_cpp,
    cuda_sources=matmul_softmax_source,
    functions=["matmul_softmax_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, dropout_p):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        # The task uses dropout_p = 0.0, so dropout is the identity even in training mode.
        if dropout_p != 0.0:
            raise ValueError("this kernel implements dropout_p == 0.0 only")

    def forward(self, x):
        return matmul_softmax_ext.matmul_softmax_cuda(x, self.matmul.weight, self.matmul.bias)
