import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

conv_bn_source = r"""
#include <torch/extension.h>

// Direct 2D convolution (stride 1, no padding), one thread per output element.
__global__ void conv2d_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                              float* __restrict__ y, int N, int C_in, int H, int W, int C_out, int K, int H_out,
                              int W_out) {
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
    y[idx] = acc;
}

__device__ float block_sum(float v, float* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    float result = scratch[0];
    __syncthreads();
    return result;
}

// Training-mode BatchNorm statistics: one block per channel, mean then biased variance over (N, H, W).
__global__ void channel_stats_kernel(const float* __restrict__ y, float* __restrict__ mean, float* __restrict__ inv_std,
                                     int N, int C, int HW, float eps) {
    __shared__ float scratch[32];
    int c = blockIdx.x;
    long count = (long)N * HW;
    float s = 0.0f;
    for (int n = 0; n < N; ++n) {
        const float* plane = y + ((long)n * C + c) * HW;
        for (int i = threadIdx.x; i < HW; i += blockDim.x) s += plane[i];
    }
    float m = block_sum(s, scratch) / count;
    float sq = 0.0f;
    for (int n = 0; n < N; ++n) {
        const float* plane = y + ((long)n * C + c) * HW;
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            float d = plane[i] - m;
            sq += d * d;
        }
    }
    float var = block_sum(sq, scratch) / count;
    if (threadIdx.x == 0) {
        mean[c] = m;
        inv_std[c] = rsqrtf(var + eps);
    }
}

__global__ void running_stats_kernel(const float* __restrict__ running_mean, const float* __restrict__ running_var,
                                     float* __restrict__ mean, float* __restrict__ inv_std, int C, float eps) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        mean[c] = running_mean[c];
        inv_std[c] = rsqrtf(running_var[c] + eps);
    }
}

__global__ void normalize_scale_kernel(float* __restrict__ y, const float* __restrict__ mean,
                                       const float* __restrict__ inv_std, const float* __restrict__ gamma,
                                       const float* __restrict__ beta, int C, int HW, long total, float scale) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        int c = (i / HW) % C;
        y[i] = ((y[i] - mean[c]) * inv_std[c] * gamma[c] + beta[c]) * scale;
    }
}

torch::Tensor conv_bn_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor gamma,
                                 torch::Tensor beta, torch::Tensor running_mean, torch::Tensor running_var,
                                 double eps, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 4, "x must be a 4D float32 CUDA tensor");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    int N = xc.size(0), C_in = xc.size(1), H = xc.size(2), W = xc.size(3);
    int C_out = wc.size(0), K = wc.size(2);
    int H_out = H - K + 1, W_out = W - K + 1;
    auto y = torch::empty({N, C_out, H_out, W_out}, xc.options());
    long total = (long)N * C_out * H_out * W_out;
    conv2d_kernel<<<(unsigned int)((total + 255) / 256), 256>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), b.contiguous().data_ptr<float>(), y.data_ptr<float>(),
        N, C_in, H, W, C_out, K, H_out, W_out);
    auto mean = torch::empty({C_out}, xc.options());
    auto inv_std = torch::empty({C_out}, xc.options());
    int HW = H_out * W_out;
    // BUG: eval-mode BatchNorm (running statistics, 0 and 1 at initialisation), but the model is in training mode.
    running_stats_kernel<<<1, 32>>>(running_mean.contiguous().data_ptr<float>(),
                                    running_var.contiguous().data_ptr<float>(), mean.data_ptr<float>(),
                                    inv_std.data_ptr<float>(), C_out, (float)eps);
    long blocks = (total + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    normalize_scale_kernel<<<(int)blocks, 256>>>(y.data_ptr<float>(), mean.data_ptr<float>(),
                                                 inv_std.data_ptr<float>(), gamma.contiguous().data_ptr<float>(),
                                                 beta.contiguous().data_ptr<float>(), C_out, HW, total, (float)scale);
    return y;
}
"""

conv_bn_cpp = ("torch::Tensor conv_bn_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, "
               "torch::Tensor gamma, torch::Tensor beta, torch::Tensor running_mean, torch::Tensor running_var, "
               "double eps, double scale);")

conv_bn_ext = load_inline(
    name="builtin_l2_conv_bn_scale_wrong_running_stats",
    cpp_sources=conv_bn_cpp,
    cuda_sources=conv_bn_source,
    functions=["conv_bn_scale_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scaling_factor):
        super(ModelNew, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        return conv_bn_ext.conv_bn_scale_cuda(x, self.conv.weight, self.conv.bias, self.bn.weight, self.bn.bias,
                                              self.bn.running_mean, self.bn.running_var, self.bn.eps,
                                              self.scaling_factor)
