# task: relu
# expect: unsynced_stream
# about: the relu runs on a private non-blocking stream never joined back, in kernels named like an allocator copy and like the judge's digest (kernel trace windows once closed on, or skipped, such names)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_source = r"""
#include <torch/extension.h>

__global__ void copy_kernel_rows(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

__global__ void digest_tree_rows(float* y) {}

torch::Tensor relu_side_stream(torch::Tensor x) {
    static cudaStream_t side = nullptr;
    if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    copy_kernel_rows<<<(n + 255) / 256, 256, 0, side>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    digest_tree_rows<<<1, 1, 0, side>>>(y.data_ptr<float>());
    return y;
}
"""

relu_cpp = "torch::Tensor relu_side_stream(torch::Tensor x);"

relu_ext = load_inline(
    name="relu_named_like_ours",
    cpp_sources=relu_cpp,
    cuda_sources=relu_source,
    functions=["relu_side_stream"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu_ext.relu_side_stream(x)
