import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

masked_fill_source = r"""
#include <torch/extension.h>

__global__ void masked_fill_kernel(const float* __restrict__ x, const bool* __restrict__ mask, float value,
                                   float* __restrict__ out, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = mask[i] ? value : x[i];
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
    const int threads = 256;
    long blocks = (n + threads - 1) / threads;
    if (blocks > 65536) blocks = 65536;
    masked_fill_kernel<<<(int)blocks, threads>>>(xc.data_ptr<float>(), mc.data_ptr<bool>(), (float)value,
                                                 out.data_ptr<float>(), n);
    return out;
}
"""

masked_fill_cpp = "torch::Tensor masked_fill_cuda(torch::Tensor x, torch::Tensor mask, double value);"

masked_fill_ext = load_inline(
    name="builtin_l1_masked_fill_correct",
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
