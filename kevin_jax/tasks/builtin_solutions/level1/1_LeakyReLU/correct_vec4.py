import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

leaky_relu_source = r"""
#include <torch/extension.h>
#include <cstdint>

__device__ __forceinline__ float leaky_relu_op(float v, float slope) {
    return v > 0.0f ? v : v * slope;
}

// 16-byte accesses: each thread loads and stores a float4 (four neighbouring elements) per iteration of a grid-stride
// loop, a quarter of the memory instructions of one float per thread; the last n % 4 elements (or everything, if a
// pointer is not 16-byte aligned) go through the scalar tail kernel.
__global__ void leaky_relu_vec4_kernel(const float4* __restrict__ x4, float4* __restrict__ out4, float slope, long n4) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = leaky_relu_op(v.x, slope);
        v.y = leaky_relu_op(v.y, slope);
        v.z = leaky_relu_op(v.z, slope);
        v.w = leaky_relu_op(v.w, slope);
        out4[i] = v;
    }
}

__global__ void leaky_relu_tail_kernel(const float* __restrict__ x, float* __restrict__ out, float slope, long start, long n) {
    long i = start + (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = leaky_relu_op(x[i], slope);
}

torch::Tensor leaky_relu_cuda(torch::Tensor x, double slope) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    if (n == 0) return out;
    bool aligned = reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0 && reinterpret_cast<uintptr_t>(out.data_ptr<float>()) % 16 == 0;
    long n4 = aligned ? n / 4 : 0;
    const int threads = 256;
    if (n4 > 0) {
        long blocks = (n4 + threads - 1) / threads;
        if (blocks > 65536) blocks = 65536;
        leaky_relu_vec4_kernel<<<(int)blocks, threads>>>(reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<float4*>(out.data_ptr<float>()), (float)slope, n4);
    }
    long rest = n - n4 * 4;
    if (rest > 0)
        leaky_relu_tail_kernel<<<(unsigned int)((rest + threads - 1) / threads), threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), (float)slope, n4 * 4, n);
    return out;
}
"""

leaky_relu_cpp = "torch::Tensor leaky_relu_cuda(torch::Tensor x, double slope);"

leaky_relu = load_inline(
    name="builtin_l1_leaky_relu_vec4",
    cpp_sources=leaky_relu_cpp,
    cuda_sources=leaky_relu_source,
    functions=["leaky_relu_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float):
        super(ModelNew, self).__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return leaky_relu.leaky_relu_cuda(x, self.negative_slope)
