# task: batchnorm_train
# about: training-mode BatchNorm: per-channel batch mean/variance (biased), then normalise with weight and bias
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

bn_source = r"""
#include <torch/extension.h>

// One block per channel: sum and sum of squares in double over (N, H, W).
__global__ void channel_stats_kernel(const float* __restrict__ x, float* __restrict__ mean, float* __restrict__ invstd,
                                     int N, int C, int HW, float eps) {
    int c = blockIdx.x;
    double s = 0.0, ss = 0.0;
    for (int n = 0; n < N; ++n) {
        const float* plane = x + ((long)n * C + c) * HW;
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            float v = plane[i];
            s += v;
            ss += (double)v * v;
        }
    }
    __shared__ double rs[1024], rss[1024];
    rs[threadIdx.x] = s;
    rss[threadIdx.x] = ss;
    __syncthreads();
    for (int step = blockDim.x / 2; step > 0; step >>= 1) {
        if (threadIdx.x < step) {
            rs[threadIdx.x] += rs[threadIdx.x + step];
            rss[threadIdx.x] += rss[threadIdx.x + step];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double count = (double)N * HW;
        double m = rs[0] / count;
        double var = rss[0] / count - m * m;
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(var + eps));
    }
}

__global__ void normalize_kernel(const float* __restrict__ x, float* __restrict__ y, const float* __restrict__ mean,
                                 const float* __restrict__ invstd, const float* __restrict__ w,
                                 const float* __restrict__ b, long total, int C, int HW) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= total) return;
    int c = (i / HW) % C;
    y[i] = (x[i] - mean[c]) * invstd[c] * w[c] + b[c];
}

torch::Tensor bn_train(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    auto xc = x.contiguous();
    int N = xc.size(0), C = xc.size(1), HW = xc.size(2) * xc.size(3);
    auto mean = torch::empty({C}, xc.options());
    auto invstd = torch::empty({C}, xc.options());
    auto y = torch::empty_like(xc);
    cudaStream_t stream = 0;
    channel_stats_kernel<<<C, 1024, 0, stream>>>(xc.data_ptr<float>(), mean.data_ptr<float>(), invstd.data_ptr<float>(),
                                                 N, C, HW, (float)eps);
    long total = xc.numel();
    normalize_kernel<<<(total + 255) / 256, 256, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
        mean.data_ptr<float>(), invstd.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), total, C, HW);
    return y;
}
"""

bn_ext = load_inline(name="honest_bn_train",
                     cpp_sources="torch::Tensor bn_train(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);",
                     cuda_sources=bn_source, functions=["bn_train"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, num_features: int):
        super(ModelNew, self).__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)  # parameters (weight, bias) and eps only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bn_ext.bn_train(x, self.bn.weight, self.bn.bias, self.bn.eps)
