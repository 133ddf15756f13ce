import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_source = """
#include <torch/extension.h>

// x viewed as [outer, r, inner]; one thread per (outer, inner) output element.
__global__ void sum_dim_kernel(const float* x, float* y, int outer, int r, int inner) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    int o = idx / inner, i = idx % inner;
    const float* p = x + (size_t)o * r * inner + i;
    float acc = 0.f;
    for (int k = 0; k < r; ++k) acc += p[(size_t)k * inner];
    y[idx] = acc;
}

torch::Tensor sum_dim_cuda(torch::Tensor x, int64_t dim) {
    auto xc = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    auto sizes = xc.sizes().vec();
    int64_t r = sizes[dim];
    sizes[dim] = 1;
    auto y = torch::empty(sizes, xc.options());
    int total = outer * inner;
    sum_dim_kernel<<<(total + 255) / 256, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), outer, r, inner);
    return y;
}
"""

sum_cpp = "torch::Tensor sum_dim_cuda(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(name="sum_dim_ext", cpp_sources=sum_cpp, cuda_sources=sum_source, functions=["sum_dim_cuda"])


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return sum_ext.sum_dim_cuda(x, self.dim)
