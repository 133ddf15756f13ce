import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_source = r"""
#include <torch/extension.h>

__device__ float block_sum(float v, float* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    float result = scratch[0];
    __syncthreads();
    return result;
}

// One block per row: mean, then the (biased) variance around it, then normalize with the affine parameters.
__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                 const float* __restrict__ bias, float* __restrict__ out, int cols, float eps) {
    __shared__ float scratch[32];
    const float* row = x + (long)blockIdx.x * cols;
    float* out_row = out + (long)blockIdx.x * cols;

    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += row[i];
    float mean = block_sum(s, scratch) / cols;

    float sq = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) sq += row[i] * row[i];  // BUG: mean not subtracted
    float inv_std = rsqrtf(block_sum(sq, scratch) / cols + eps);

    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out_row[i] = row[i] * inv_std * weight[i] + bias[i];  // BUG: mean not subtracted
}

torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    int cols = weight.numel();
    int rows = xc.numel() / cols;
    auto out = torch::empty_like(xc);
    layernorm_kernel<<<rows, 256>>>(xc.data_ptr<float>(), weight.contiguous().data_ptr<float>(),
                                    bias.contiguous().data_ptr<float>(), out.data_ptr<float>(), cols, (float)eps);
    return out;
}
"""

layernorm_cpp = "torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);"

layernorm_ext = load_inline(
    name="builtin_l1_layernorm_wrong_centering",
    cpp_sources=layernorm_cpp,
    cuda_sources=layernorm_source,
    functions=["layernorm_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: int):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_cuda(x, self.weight, self.bias, self.eps)
