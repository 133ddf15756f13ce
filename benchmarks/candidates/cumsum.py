import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cumsum_source = r"""
#include <torch/extension.h>

// One block per row; each thread scans a contiguous chunk, then the chunk totals are scanned in shared memory.
__global__ void row_cumsum_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    extern __shared__ float totals[];
    const float* in = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    int chunk = (cols + blockDim.x - 1) / blockDim.x;
    int begin = threadIdx.x * chunk;
    int end = min(begin + chunk, cols);
    float running = 0.f;
    for (int i = begin; i < end; ++i) { running += in[i]; out[i] = running; }
    totals[threadIdx.x] = running;
    __syncthreads();
    if (threadIdx.x == 0) {
        float acc = 0.f;
        for (int t = 0; t < blockDim.x; ++t) { float v = totals[t]; totals[t] = acc; acc += v; }
    }
    __syncthreads();
    float offset = totals[threadIdx.x];
    for (int i = begin; i < end; ++i) out[i] += offset;
}

torch::Tensor cumsum_cuda(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.dim() == 2 && (dim == 1 || dim == -1), "this kernel scans the last dim of a 2-D tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int threads = 256;
    row_cumsum_kernel<<<xc.size(0), threads, threads * sizeof(float)>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                                                         xc.size(1));
    return y;
}
"""

cumsum_ext = load_inline(name="row_cumsum", cpp_sources="torch::Tensor cumsum_cuda(torch::Tensor x, int64_t dim);",
                         cuda_sources=cumsum_source, functions=["cumsum_cuda"])


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return cumsum_ext.cumsum_cuda(x, self.dim)
