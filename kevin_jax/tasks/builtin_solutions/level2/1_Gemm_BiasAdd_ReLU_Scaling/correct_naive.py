import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gemm_source = r"""
#include <torch/extension.h>

// out[M, N] = relu(x[M, K] @ w[N, K]^T + b_linear + b_extra) * scale, the epilogue fused in.
// One thread per output element, every operand read straight from global memory (no tiling, no reuse through shared
// memory): each thread streams a row of the left operand and a row of the right one, and the threads of a warp read
// 16 different rows of the right operand, a whole row apart.
__global__ void gemm_bias_relu_scale_naive_kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ b_linear,
                                                  const float* __restrict__ b_extra, float* __restrict__ out, float scale, int M, int N, int K) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;
    const float* a = A + (long)row * K;
    const float* b = B + (long)col * K;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += a[k] * b[k];
    float v = acc + b_linear[col] + b_extra[col];
    out[(long)row * N + col] = fmaxf(v, 0.0f) * scale;
}

torch::Tensor gemm_bias_relu_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b_linear,
                                        torch::Tensor b_extra, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto out = torch::empty({M, N}, xc.options());
    dim3 block(16, 16);
    dim3 grid((N + 15) / 16, (M + 15) / 16);
    gemm_bias_relu_scale_naive_kernel<<<grid, block>>>(xc.data_ptr<float>(), wc.data_ptr<float>(),
                                                       b_linear.contiguous().data_ptr<float>(),
                                                       b_extra.contiguous().data_ptr<float>(), out.data_ptr<float>(),
                                                       (float)scale, M, N, K);
    return out;
}
"""

gemm_cpp = ("torch::Tensor gemm_bias_relu_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b_linear, "
            "torch::Tensor b_extra, double scale);")

gemm_ext = load_inline(
    name="builtin_l2_gemm_bias_relu_scale_naive",
    cpp_sources=gemm_cpp,
    cuda_sources=gemm_source,
    functions=["gemm_bias_relu_scale_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape, scaling_factor):
        super(ModelNew, self).__init__()
        # Same construction order as the reference, so the seeded initialisation gives the same parameters.
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        return gemm_ext.gemm_bias_relu_scale_cuda(x, self.gemm.weight, self.gemm.bias, self.bias, self.scaling_factor)
