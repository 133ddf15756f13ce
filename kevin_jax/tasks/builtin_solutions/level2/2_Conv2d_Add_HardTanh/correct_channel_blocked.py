import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

conv_source = r"""
#include <torch/extension.h>

#define CO_BLOCK 8

// Direct 2D convolution (stride 1, no padding) with the add + clamp fused in, blocked over output channels: a thread
// computes one output pixel for CO_BLOCK output channels (blockIdx.y picks the group). The group's weights sit in
// shared memory as [ci][kh][kw][co], so every input value is loaded once per group and multiplied into CO_BLOCK
// accumulators with two float4 shared-memory reads (one thread per output element would load it CO_BLOCK times and
// read a weight from memory for every multiply-add).
__global__ void conv2d_add_hardtanh_blocked_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                   const float* __restrict__ b, float* __restrict__ y,
                                                   int N, int C_in, int H, int W, int C_out, int K, int H_out,
                                                   int W_out, float add_value, float lo, float hi) {
    extern __shared__ float4 w_shared4[];
    float* w_shared = reinterpret_cast<float*>(w_shared4);
    int co0 = blockIdx.y * CO_BLOCK;
    int taps = C_in * K * K;
    for (int t = threadIdx.x; t < taps * CO_BLOCK; t += blockDim.x) {
        int c = t % CO_BLOCK, tap = t / CO_BLOCK;   // tap = (ci * K + kh) * K + kw
        w_shared[t] = co0 + c < C_out ? w[(long)(co0 + c) * taps + tap] : 0.0f;
    }
    __syncthreads();
    long pix = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long plane = (long)H_out * W_out;
    if (pix >= (long)N * plane) return;
    int n = pix / plane;
    int rem = pix % plane;
    int oh = rem / W_out, ow = rem % W_out;
    float acc[CO_BLOCK];
#pragma unroll
    for (int c = 0; c < CO_BLOCK; ++c) acc[c] = 0.0f;
    const float* x_n = x + (long)n * C_in * H * W + (long)oh * W + ow;
    for (int ci = 0; ci < C_in; ++ci) {
        const float* x_patch = x_n + (long)ci * H * W;
        for (int kh = 0; kh < K; ++kh) {
            for (int kw = 0; kw < K; ++kw) {
                float v = x_patch[kh * W + kw];
                const float4* wv = w_shared4 + ((ci * K + kh) * K + kw) * (CO_BLOCK / 4);
                float4 w0 = wv[0], w1 = wv[1];
                acc[0] += v * w0.x; acc[1] += v * w0.y; acc[2] += v * w0.z; acc[3] += v * w0.w;
                acc[4] += v * w1.x; acc[5] += v * w1.y; acc[6] += v * w1.z; acc[7] += v * w1.w;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < CO_BLOCK; ++c) {
        int co = co0 + c;
        if (co < C_out) {
            float v = acc[c] + b[co] + add_value;
            y[((long)n * C_out + co) * plane + rem] = fminf(fmaxf(v, lo), hi);
        }
    }
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
    long pixels = (long)N * H_out * W_out;
    if (pixels == 0 || C_out == 0) return y;
    size_t smem = (size_t)C_in * K * K * CO_BLOCK * sizeof(float);
    TORCH_CHECK(smem <= 48 * 1024, "too many input channels x taps for the shared-memory weight tile");
    const int threads = 256;
    dim3 grid((unsigned int)((pixels + threads - 1) / threads), (unsigned int)((C_out + CO_BLOCK - 1) / CO_BLOCK));
    conv2d_add_hardtanh_blocked_kernel<<<grid, threads, smem>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), b.contiguous().data_ptr<float>(), y.data_ptr<float>(),
        N, C_in, H, W, C_out, K, H_out, W_out, (float)add_value, (float)lo, (float)hi);
    return y;
}
"""

conv_cpp = ("torch::Tensor conv2d_add_hardtanh_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, "
            "double add_value, double lo, double hi);")

conv_ext = load_inline(
    name="builtin_l2_conv2d_add_hardtanh_channel_blocked",
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
