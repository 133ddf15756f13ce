import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gemm_sigmoid_sum_source = r"""
#include <torch/extension.h>

// z[M, N] = scale * sigmoid(x[M, K] @ w[N, K]^T + bias).
// One thread per output element, every operand read straight from global memory (no tiling, no reuse through shared
// memory): each thread streams a row of the left operand and a row of the right one, and the threads of a warp read
// 16 different rows of the right operand, a whole row apart.
__global__ void gemm_scaled_sigmoid_naive_kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
                                                 float* __restrict__ z, float scale, int M, int N, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    const float* a = A + (long)row * K;
    const float* b = B + (long)col * K;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a[k] * b[k];
    float v = acc + bias[col];
    z[(long)row * N + col] = scale / (1.0f + expf(-v));
}

// out[m, 0] = sum_n z[m, n], one block per row.
__global__ void row_sum_kernel(const float* __restrict__ z, float* __restrict__ out, int cols) {
    __shared__ float scratch[32];
    const float* row = z + (long)blockIdx.x * cols;
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += row[i];
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffff, s, offset);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffff, s, offset);
        if (lane == 0) out[blockIdx.x] = s;
    }
}

torch::Tensor gemm_scaled_sigmoid_sum_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto z = torch::empty({M, N}, xc.options());
    dim3 block(16, 16);
    dim3 grid((N + 15) / 16, (M + 15) / 16);
    gemm_scaled_sigmoid_naive_kernel<<<grid, block>>>(xc.data_ptr<float>(), wc.data_ptr<float>(),
                                                      bias.contiguous().data_ptr<float>(), z.data_ptr<float>(),
                                                      (float)scale, M, N, K);
    auto out = torch::empty({M, 1}, xc.options());
    row_sum_kernel<<<M, 256>>>(z.data_ptr<float>(), out.data_ptr<float>(), N);
    return out;
}
"""

gemm_sigmoid_sum_cpp = ("torch::Tensor gemm_scaled_sigmoid_sum_cuda(torch::Tensor x, torch::Tensor w, "
                        "torch::Tensor bias, double scale);")

gemm_sigmoid_sum_ext = load_inline(
    name="builtin_l2_gemm_scaled_sigmoid_sum_naive",
    cpp_sources=gemm_sigmoid_sum_cpp,
    cuda_sources=gemm_sigmoid_sum_source,
    functions=["gemm_scaled_sigmoid_sum_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return gemm_sigmoid_sum_ext.gemm_scaled_sigmoid_sum_cuda(x, self.gemm.weight, self.gemm.bias, self.scale)
