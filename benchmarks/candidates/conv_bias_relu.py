import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The convolution stays cuDNN's (called from the host wrapper); the relu + bias epilogue is one fused kernel.
epilogue_source = r"""
#include <torch/extension.h>

__global__ void relu_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int hw, int channels) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        int c = (int)((i / hw) % channels);
        float v = y[i];
        y[i] = fmaxf(v, 0.f) + bias[c];
    }
}

torch::Tensor conv_relu_bias(torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias, torch::Tensor bias) {
    auto y = at::conv2d(x, weight, conv_bias).contiguous();
    int64_t n = y.numel();
    int hw = y.size(2) * y.size(3);
    int channels = y.size(1);
    const int threads = 256;
    relu_bias_kernel<<<(n + threads - 1) / threads, threads>>>(y.data_ptr<float>(), bias.data_ptr<float>(), n, hw, channels);
    return y;
}
"""

epilogue_cpp = ("torch::Tensor conv_relu_bias(torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias, "
                "torch::Tensor bias);")

fused = load_inline(name="conv_relu_bias", cpp_sources=epilogue_cpp, cuda_sources=epilogue_source,
                    functions=["conv_relu_bias"], extra_cuda_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return fused.conv_relu_bias(x, self.conv.weight, self.conv.bias, self.bias)
