# task: softmax
# about: one block per row, max and sum by shared-memory tree reductions, numerically stable
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_source = r"""
#include <torch/extension.h>

template <int THREADS>
__global__ void softmax_row_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float shared[THREADS];
    const float* row_in = x + (long)blockIdx.x * cols;
    float* row_out = y + (long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += THREADS) m = fmaxf(m, row_in[c]);
    shared[threadIdx.x] = m;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    m = shared[0];
    __syncthreads();
    float sum = 0.f;
    for (int c = threadIdx.x; c < cols; c += THREADS) sum += __expf(row_in[c] - m);
    shared[threadIdx.x] = sum;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    float inv = 1.f / shared[0];
    for (int c = threadIdx.x; c < cols; c += THREADS) row_out[c] = __expf(row_in[c] - m) * inv;
}

torch::Tensor softmax_rows(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int rows = xc.size(0), cols = xc.size(1);
    softmax_row_kernel<256><<<rows, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

softmax = load_inline(name="honest_softmax_rows", cpp_sources="torch::Tensor softmax_rows(torch::Tensor x);",
                      cuda_sources=softmax_source, functions=["softmax_rows"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax.softmax_rows(x)
