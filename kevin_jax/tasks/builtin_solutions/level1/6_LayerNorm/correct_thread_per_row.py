import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_source = r"""
#include <torch/extension.h>

// One thread per row: the mean, the (biased) variance around it and the normalised, affine output, each a sequential
// loop over the row. Threads of a warp read 32 different rows, a whole row apart: uncoalesced, and only rows / 32
// warps to hide the memory latency.
__global__ void layernorm_thread_per_row_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                                const float* __restrict__ bias, float* __restrict__ out, long rows,
                                                int cols, float eps) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = x + r * cols;
    float* out_row = out + r * cols;
    float sum = 0.0f;
    for (int i = 0; i < cols; ++i) sum += row[i];
    float mean = sum / cols;
    float sq = 0.0f;
    for (int i = 0; i < cols; ++i) {
        float d = row[i] - mean;
        sq += d * d;
    }
    float inv_std = rsqrtf(sq / cols + eps);
    for (int i = 0; i < cols; ++i) out_row[i] = (row[i] - mean) * inv_std * weight[i] + bias[i];
}

torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    int cols = weight.numel();
    long rows = xc.numel() / cols;
    auto out = torch::empty_like(xc);
    if (rows == 0) return out;
    const int threads = 128;
    layernorm_thread_per_row_kernel<<<(unsigned int)((rows + threads - 1) / threads), threads>>>(
        xc.data_ptr<float>(), weight.contiguous().data_ptr<float>(), bias.contiguous().data_ptr<float>(),
        out.data_ptr<float>(), rows, cols, (float)eps);
    return out;
}
"""

layernorm_cpp = "torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);"

layernorm_ext = load_inline(
    name="builtin_l1_layernorm_thread_per_row",
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
