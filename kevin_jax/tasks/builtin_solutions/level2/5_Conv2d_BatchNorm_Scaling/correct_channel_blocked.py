import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

conv_bn_source = r"""
#include <torch/extension.h>

#define CO_BLOCK 8

// Direct 2D convolution (stride 1, no padding), blocked over output channels: a thread computes one output pixel for
// CO_BLOCK output channels (blockIdx.y picks the group), the group's weights in shared memory as [ci][kh][kw][co], so
// every input value is loaded once per group and multiplied into CO_BLOCK accumulators with two float4 reads.
__global__ void conv2d_blocked_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ y, int N, int C_in, int H,
                                      int W, int C_out, int K, int H_out, int W_out) {
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
        if (co < C_out) y[((long)n * C_out + co) * plane + rem] = acc[c] + b[co];
    }
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

// Training-mode BatchNorm statistics, spread over many blocks: block (c, s) sums y and y^2 over the batch images
// s, s + gridDim.y, ... of channel c; the block totals go to double accumulators.
__global__ void channel_partial_sums_kernel(const float* __restrict__ y, double* sums, double* sq_sums, int N, int C,
                                            int HW) {
    __shared__ float scratch[32];
    int c = blockIdx.x;
    float s = 0.0f, sq = 0.0f;
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
        const float* plane = y + ((long)n * C + c) * HW;
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            float v = plane[i];
            s += v;
            sq += v * v;
        }
    }
    s = block_sum(s, scratch);
    sq = block_sum(sq, scratch);
    if (threadIdx.x == 0) {
        atomicAdd(&sums[c], (double)s);
        atomicAdd(&sq_sums[c], (double)sq);
    }
}

// Per channel: y_out = ((y - mean) * inv_std * gamma + beta) * scale = y * mul + add.
__global__ void channel_affine_kernel(const double* sums, const double* sq_sums, const float* __restrict__ gamma,
                                      const float* __restrict__ beta, float* mul, float* add, int C, double count,
                                      float eps, float scale) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double mean = sums[c] / count;
    double var = sq_sums[c] / count - mean * mean;   // biased, as BatchNorm normalises with it
    if (var < 0.0) var = 0.0;
    float inv_std = (float)(1.0 / sqrt(var + (double)eps));
    mul[c] = inv_std * gamma[c] * scale;
    add[c] = (beta[c] - (float)mean * inv_std * gamma[c]) * scale;
}

__global__ void normalize_scale_kernel(float* __restrict__ y, const float* __restrict__ mul,
                                       const float* __restrict__ add, int C, int HW, long total) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        int c = (i / HW) % C;
        y[i] = y[i] * mul[c] + add[c];
    }
}

torch::Tensor conv_bn_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor gamma,
                                 torch::Tensor beta, double eps, double scale) {
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
    conv2d_blocked_kernel<<<grid, threads, smem>>>(xc.data_ptr<float>(), wc.data_ptr<float>(),
                                                   b.contiguous().data_ptr<float>(), y.data_ptr<float>(), N, C_in, H,
                                                   W, C_out, K, H_out, W_out);
    int HW = H_out * W_out;
    auto sums = torch::zeros({2, C_out}, xc.options().dtype(torch::kFloat64));
    auto affine = torch::empty({2, C_out}, xc.options());
    dim3 stats_grid(C_out, N < 64 ? N : 64);
    channel_partial_sums_kernel<<<stats_grid, 512>>>(y.data_ptr<float>(), sums.data_ptr<double>(),
                                                     sums.data_ptr<double>() + C_out, N, C_out, HW);
    channel_affine_kernel<<<(C_out + 127) / 128, 128>>>(sums.data_ptr<double>(), sums.data_ptr<double>() + C_out,
                                                        gamma.contiguous().data_ptr<float>(),
                                                        beta.contiguous().data_ptr<float>(), affine.data_ptr<float>(),
                                                        affine.data_ptr<float>() + C_out, C_out,
                                                        (double)pixels, (float)eps, (float)scale);
    long total = pixels * C_out;
    long blocks = (total + 255) / 256;
    if (blocks > 65536) blocks = 65536;
    normalize_scale_kernel<<<(int)blocks, 256>>>(y.data_ptr<float>(), affine.data_ptr<float>(),
                                                 affine.data_ptr<float>() + C_out, C_out, HW, total);
    return y;
}
"""

conv_bn_cpp = ("torch::Tensor conv_bn_scale_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, "
               "torch::Tensor gamma, torch::Tensor beta, double eps, double scale);")

conv_bn_ext = load_inline(
    name="builtin_l2_conv_bn_scale_channel_blocked",
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
        # Training mode, as the reference: normalise with the statistics of this batch. (The running statistics are
        # not updated here; they do not affect this output.)
        return conv_bn_ext.conv_bn_scale_cuda(x, self.conv.weight, self.conv.bias, self.bn.weight, self.bn.bias,
                                              self.bn.eps, self.scaling_factor)
