import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

leaky_relu_source = r"""
#include <torch/extension.h>

// One thread per element, but the threads of a block walk DOWN a column of the (rows, cols) view: thread x takes
// row blockIdx.x * blockDim.x + threadIdx.x of column blockIdx.y. Neighbouring threads touch addresses a whole row
// apart, so every warp-wide load and store is split into 32 separate memory transactions (uncoalesced).
__global__ void leaky_relu_colwise_kernel(const float* __restrict__ x, float* __restrict__ out, float slope, long rows, long cols) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    for (long c = blockIdx.y; c < cols; c += gridDim.y) {
        long i = r * cols + c;
        float v = x[i];
        out[i] = v > 0.0f ? v : v * slope;
    }
}

torch::Tensor leaky_relu_cuda(torch::Tensor x, double slope) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    if (n == 0) return out;
    long cols = xc.dim() > 0 ? xc.size(-1) : 1;
    long rows = n / cols;
    const int threads = 256;
    dim3 grid((unsigned int)((rows + threads - 1) / threads), (unsigned int)(cols < 65535 ? cols : 65535));
    leaky_relu_colwise_kernel<<<grid, threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), (float)slope, rows, cols);
    return out;
}
"""

leaky_relu_cpp = "torch::Tensor leaky_relu_cuda(torch::Tensor x, double slope);"

leaky_relu = load_inline(
    name="builtin_l1_leaky_relu_uncoalesced",
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
