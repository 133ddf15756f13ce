import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_source = r"""
#include <torch/extension.h>

#define INNER_TILE 32
#define SLICES 16

// x viewed as (outer, reduce, inner). A block of INNER_TILE x SLICES threads owns 32 neighbouring outputs of one
// `outer` index: threadIdx.x walks the inner positions (coalesced reads), threadIdx.y splits the reduced dimension
// SLICES ways, so 16x more threads keep loads in flight; the partial sums meet in shared memory.
__global__ void sum_dim_split_kernel(const float* __restrict__ x, float* __restrict__ out, long outer, long reduce,
                                     long inner) {
    __shared__ float partial[SLICES][INNER_TILE + 1];
    long i = (long)blockIdx.x * INNER_TILE + threadIdx.x;
    for (long o = blockIdx.y; o < outer; o += gridDim.y) {
        float acc = 0.0f;
        if (i < inner) {
            const float* p = x + o * reduce * inner + i;
            for (long r = threadIdx.y; r < reduce; r += SLICES) acc += p[r * inner];
        }
        partial[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && i < inner) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < SLICES; ++k) s += partial[k][threadIdx.x];
            out[o * inner + i] = s;
        }
        __syncthreads();
    }
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
    if (outer * inner == 0) return out;
    dim3 block(INNER_TILE, SLICES);
    dim3 grid((unsigned int)((inner + INNER_TILE - 1) / INNER_TILE), (unsigned int)(outer < 65535 ? outer : 65535));
    sum_dim_split_kernel<<<grid, block>>>(xc.data_ptr<float>(), out.data_ptr<float>(), outer, reduce, inner);
    return out;
}
"""

sum_cpp = "torch::Tensor sum_dim_cuda(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(
    name="builtin_l1_sum_dim_split_reduce",
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
