# task: row_sum
# about: one block per row, warp-shuffle reduction; keeps the reduced dimension like keepdim=True
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    const float* row = x + (long)blockIdx.x * cols;
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_down_sync(0xffffffff, acc, offset);
    __shared__ float warp_sums[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (blockDim.x / 32) ? warp_sums[lane] : 0.f;
        for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_down_sync(0xffffffff, acc, offset);
        if (lane == 0) out[blockIdx.x] = acc;
    }
}

torch::Tensor row_sum(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(dim == 1 && x.dim() == 2, "row_sum: 2-D input reduced over dim 1");
    auto xc = x.contiguous();
    auto out = torch::empty({xc.size(0), 1}, xc.options());
    row_sum_kernel<<<xc.size(0), 512>>>(xc.data_ptr<float>(), out.data_ptr<float>(), xc.size(1));
    return out;
}
"""

ext = load_inline(name="honest_row_sum", cpp_sources="torch::Tensor row_sum(torch::Tensor x, int64_t dim);",
                  cuda_sources=source, functions=["row_sum"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.row_sum(x, self.dim)
