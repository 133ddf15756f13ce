import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gemm_source = r"""
#include <torch/extension.h>

#define TILE 32

// out[M, N] = relu(x[M, K] @ w[N, K]^T + b_linear + b_extra) * scale, the epilogue fused into the tiled GEMM.
__global__ void gemm_bias_relu_scale_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                            const float* __restrict__ b_linear, const float* __restrict__ b_extra,
                                            float* __restrict__ out, int M, int N, int K, float scale) {
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
    if (row < M && col < N) {
        float v = acc + b_linear[col];  // BUG: the extra bias is never added
        out[(long)row * N + col] = fmaxf(v, 0.0f) * scale;
    }
}

torch::Tensor gemm_bias_relu_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b_linear,
                                        torch::Tensor b_extra, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto out = torch::empty({M, N}, xc.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    gemm_bias_relu_scale_kernel<<<grid, block>>>(xc.data_ptr<float>(), wc.data_ptr<float>(),
                                                 b_linear.contiguous().data_ptr<float>(),
                                                 b_extra.contiguous().data_ptr<float>(), out.data_ptr<float>(),
                                                 M, N, K, (float)scale);
    return out;
}
"""

gemm_cpp = ("torch::Tensor gemm_bias_relu_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b_linear, "
            "torch::Tensor b_extra, double scale);")

gemm_ext = load_inline(
    name="builtin_l2_gemm_bias_relu_scale_wrong_bias",
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
