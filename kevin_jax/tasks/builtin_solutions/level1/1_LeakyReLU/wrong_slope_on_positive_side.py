import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

leaky_relu_source = r"""
#include <torch/extension.h>

__global__ void leaky_relu_kernel(const float* __restrict__ x, float* __restrict__ out, float slope, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        out[i] = v > 0.0f ? v * slope : v;  // BUG: slope applied to the positive side
    }
}

torch::Tensor leaky_relu_cuda(torch::Tensor x, double slope) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    const int threads = 256;
    long blocks = (n + threads - 1) / threads;
    if (blocks > 65536) blocks = 65536;
    leaky_relu_kernel<<<(int)blocks, threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), (float)slope, n);
    return out;
}
"""

leaky_relu_cpp = "torch::Tensor leaky_relu_cuda(torch::Tensor x, double slope);"

leaky_relu = load_inline(
    name="builtin_l1_leaky_relu_wrong_side",
    cpp_sources=leaky_relu_cpp,
    cuda_sources=leaky_relu_source,
    functions=["leaky_relu_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float):
        super(ModelNew, self).__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return leaky_relu.leaky_relu_cuda(x, self.negative_slope)
