import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

masked_fill_source = r"""
#include <torch/extension.h>

// One thread per element, but the threads of a block walk DOWN a column of the (rows, cols) view: thread x takes
// row blockIdx.x * blockDim.x + threadIdx.x of column blockIdx.y. Neighbouring threads touch addresses a whole row
// apart, so every warp-wide load and store is split into 32 separate memory transactions (uncoalesced).
__global__ void masked_fill_colwise_kernel(const float* __restrict__ x, const bool* __restrict__ mask, float value, float* __restrict__ out, long rows, long cols) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    for (long c = blockIdx.y; c < cols; c += gridDim.y) {
        long i = r * cols + c;
        out[i] = mask[i] ? value : x[i];
    }
}

torch::Tensor masked_fill_cuda(torch::Tensor x, torch::Tensor mask, double value) {
    TORCH_CHECK(x.is_cuda() && mask.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(mask.scalar_type() == torch::kBool, "mask must be a bool tensor");
    TORCH_CHECK(x.sizes() == mask.sizes(), "x and mask must have the same shape");
    auto xc = x.contiguous();
    auto mc = mask.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    if (n == 0) return out;
    long cols = xc.dim() > 0 ? xc.size(-1) : 1;
    long rows = n / cols;
    const int threads = 256;
    dim3 grid((unsigned int)((rows + threads - 1) / threads), (unsigned int)(cols < 65535 ? cols : 65535));
    masked_fill_colwise_kernel<<<grid, threads>>>(xc.data_ptr<float>(), mc.data_ptr<bool>(), (float)value, out.data_ptr<float>(), rows, cols);
    return out;
}
"""

masked_fill_cpp = "torch::Tensor masked_fill_cuda(torch::Tensor x, torch::Tensor mask, double value);"

masked_fill_ext = load_inline(
    name="builtin_l1_masked_fill_uncoalesced",
    cpp_sources=masked_fill_cpp,
    cuda_sources=masked_fill_source,
    functions=["masked_fill_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
        return masked_fill_ext.masked_fill_cuda(x, mask, value)
