import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_source = r"""
#include <torch/extension.h>

// x viewed as (outer, reduce, inner); one thread per (outer, inner) output, reading along `reduce` with a stride of
// `inner` so that neighbouring threads read neighbouring addresses.
__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ out, long outer, long reduce, long inner) {
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    long o = idx / inner, i = idx % inner;
    const float* p = x + o * reduce * inner + i;
    float acc = 0.0f;
    for (long r = 0; r < reduce; ++r) acc += p[r * inner];
    out[idx] = acc;
}

torch::Tensor sum_dim_cuda(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    if (dim < 0) dim += xc.dim();
    TORCH_CHECK(dim >= 0 && dim < xc.dim(), "dim out of range");
    long outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    long reduce = xc.size(dim);
    auto out_sizes = xc.sizes().vec();
    out_sizes[dim] = 1;
    auto out = torch::empty(out_sizes, xc.options());
    const int threads = 256;
    long blocks = (outer * inner + threads - 1) / threads;
    sum_dim_kernel<<<(int)blocks, threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), outer, reduce, inner);
    return out;
}
"""

sum_cpp = "torch::Tensor sum_dim_cuda(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(
    name="builtin_l1_sum_dim_correct",
    cpp_sources=sum_cpp,
    cuda_sources=sum_source,
    functions=["sum_dim_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_dim_cuda(x, self.dim)
