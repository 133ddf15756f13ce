import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

axpy_source = r"""
#include <torch/extension.h>

// out = alpha * x + y with 16-byte loads; a scalar loop handles the tail when n is not a multiple of 4.
__global__ void axpy_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out,
                            float alpha, long n) {
    long n4 = n / 4;
    long stride = (long)gridDim.x * blockDim.x;
    long tid = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const float4* y4 = reinterpret_cast<const float4*>(y);
    float4* out4 = reinterpret_cast<float4*>(out);
    for (long i = tid; i < n4; i += stride) {
        float4 a = x4[i], b = y4[i];
        out4[i] = make_float4(alpha * a.x + b.x, alpha * a.y + b.y, alpha * a.z + b.z, alpha * a.w + b.w);
    }
    for (long i = n4 * 4 + tid; i < n; i += stride) out[i] = alpha * x[i] + y[i];
}

torch::Tensor axpy_cuda(torch::Tensor x, torch::Tensor y, double alpha) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(x.sizes() == y.sizes(), "x and y must have the same shape");
    auto xc = x.contiguous();
    auto yc = y.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    const int threads = 256;
    long blocks = (n / 4 + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > 65536) blocks = 65536;
    axpy_kernel<<<(int)blocks, threads>>>(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(),
                                          (float)alpha, n);
    return out;
}
"""

axpy_cpp = "torch::Tensor axpy_cuda(torch::Tensor x, torch::Tensor y, double alpha);"

axpy_ext = load_inline(
    name="builtin_l1_axpy_correct",
    cpp_sources=axpy_cpp,
    cuda_sources=axpy_source,
    functions=["axpy_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super(ModelNew, self).__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return axpy_ext.axpy_cuda(x, y, self.alpha)
