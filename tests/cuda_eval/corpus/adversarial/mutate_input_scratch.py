# task: row_sum
# expect: input_mutated
# about: computes correct row sums but uses the input buffer as scratch space (reduces in place)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

// In-place tree reduction over each row of x (destroys x), result copied out.
__global__ void inplace_row_sum_kernel(float* x, float* out, int cols) {
    float* row = x + (long)blockIdx.x * cols;
    for (int width = cols; width > 1; width = (width + 1) / 2) {
        int half = (width + 1) / 2;
        for (int c = threadIdx.x; c + half < width; c += blockDim.x) row[c] += row[c + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = row[0];
}

torch::Tensor row_sum_inplace(torch::Tensor x) {
    auto out = torch::empty({x.size(0), 1}, x.options());
    inplace_row_sum_kernel<<<x.size(0), 512>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
    return out;
}
"""

ext = load_inline(name="adv_row_sum_inplace", cpp_sources="torch::Tensor row_sum_inplace(torch::Tensor x);",
                  cuda_sources=source, functions=["row_sum_inplace"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()

    def forward(self, x):
        return ext.row_sum_inplace(x)
