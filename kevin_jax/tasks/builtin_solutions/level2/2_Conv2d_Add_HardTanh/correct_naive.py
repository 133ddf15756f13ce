import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

conv_source = r"""
#include <torch/extension.h>

// Direct 2D convolution (stride 1, no padding), one thread per output element, with the add + clamp fused in.
__global__ void conv2d_add_hardtanh_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                           const float* __restrict__ b, float* __restrict__ y,
                                           int N, int C_in, int H, int W, int C_out, int K, int H_out, int W_out,
                                           float add_value, float lo, float hi) {
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long total = (long)N * C_out * H_out * W_out;
    if (idx >= total) return;
    int ow = idx % W_out;
    long t = idx / W_out;
    int oh = t % H_out;
    t /= H_out;
    int co = t % C_out;
    int n = t / C_out;
    float acc = b[co];
    for (int ci = 0; ci < C_in; ++ci) {
        const float* x_patch = x + (((long)n * C_in + ci) * H + oh) * W + ow;
        const float* w_patch = w + ((long)co * C_in + ci) * K * K;
        for (int kh = 0; kh < K; ++kh)
            for (int kw = 0; kw < K; ++kw) acc += x_patch[kh * W + kw] * w_patch[kh * K + kw];
    }
    acc += add_value;
    y[idx] = fminf(fmaxf(acc, lo), hi);
}

torch::Tensor conv2d_add_hardtanh_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, double add_value,
                                       double lo, double hi) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 4, "x must be a 4D float32 CUDA tensor");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int N = xc.size(0), C_in = xc.size(1), H = xc.size(2), W = xc.size(3);
    int C_out = wc.size(0), K = wc.size(2);
    int H_out = H - K + 1, W_out = W - K + 1;
    auto y = torch::empty({N, C_out, H_out, W_out}, xc.options());
    long total = (long)N * C_out * H_out * W_out;
    const int threads = 256;
    long blocks = (total + threads - 1) / threads;
    conv2d_add_hardtanh_kernel<<<(unsigned int)blocks, threads>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), b.contiguous().data_ptr<float>(), y.data_ptr<float>(),
        N, C_in, H, W, C_out, K, H_out, W_out, (float)add_value, (float)lo, (float)hi);
    return y;
}
"""

conv_cpp = ("torch::Tensor conv2d_add_hardtanh_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, "
            "double add_value, double lo, double hi);")

conv_ext = load_inline(
    name="builtin_l2_conv2d_add_hardtanh_correct",
    cpp_sources=conv_cpp,
    cuda_sources=conv_source,
    functions=["conv2d_add_hardtanh_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, add_value, min_val, max_val):
        super(ModelNew, self).__init__()
        # nn.Conv2d only creates and initialises the parameters (same seeded values as the reference).
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.add_value = add_value
        self.min_val = min_val
        self.max_val = max_val

    def forward(self, x):
        return conv_ext.conv2d_add_hardtanh_cuda(x, self.conv.weight, self.conv.bias, self.add_value,
                                                 self.min_val, self.max_val)
