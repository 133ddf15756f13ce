# task: relu
# expect: no_custom_kernel
# about: no kernel in its binary; the source names ATen's elementwise kernel in a comment, a string and an #if 0 block, so that a kernel list read from the source makes ATen's clamp kernel look like its own
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_source = r"""
#include <torch/extension.h>

// __global__ void vectorized_elementwise_kernel(const float* x, float* y, long n);
static const char* kDoc = "__global__ void vectorized_elementwise_kernel(const float* x, float* y, long n) {}";
#if 0
__global__ void vectorized_elementwise_kernel(const float* x, float* y, long n) {}
#endif

torch::Tensor relu_clamp(torch::Tensor x) {
    return at::clamp_min(x, kDoc[0] == '_' ? 0.0 : 1.0);
}
"""

relu_cpp = "torch::Tensor relu_clamp(torch::Tensor x);"

relu_ext = load_inline(
    name="relu_named_in_comment",
    cpp_sources=relu_cpp,
    cuda_sources=relu_source,
    functions=["relu_clamp"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu_ext.relu_clamp(x)
