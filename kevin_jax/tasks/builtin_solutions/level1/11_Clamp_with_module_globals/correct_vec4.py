import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The reference reads these bounds from its own module; this program is a separate module, so it defines them too.
clamp_min = -0.75
clamp_max = 1.25

clamp_source = r"""
#include <torch/extension.h>
#include <cstdint>

__device__ __forceinline__ float clamp_op(float v, float lo, float hi) {
    return fminf(fmaxf(v, lo), hi);
}

// 16-byte accesses: each thread loads and stores a float4 (four neighbouring elements) per iteration of a grid-stride
// loop, a quarter of the memory instructions of one float per thread; the last n % 4 elements (or everything, if a
// pointer is not 16-byte aligned) go through the scalar tail kernel.
__global__ void clamp_vec4_kernel(const float4* __restrict__ x4, float4* __restrict__ out4, float lo, float hi, long n4) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = clamp_op(v.x, lo, hi);
        v.y = clamp_op(v.y, lo, hi);
        v.z = clamp_op(v.z, lo, hi);
        v.w = clamp_op(v.w, lo, hi);
        out4[i] = v;
    }
}

__global__ void clamp_tail_kernel(const float* __restrict__ x, float* __restrict__ out, float lo, float hi, long start, long n) {
    long i = start + (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = clamp_op(x[i], lo, hi);
}

torch::Tensor clamp_cuda(torch::Tensor x, double lo, double hi) {
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
        clamp_vec4_kernel<<<(int)blocks, threads>>>(reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<float4*>(out.data_ptr<float>()), (float)lo, (float)hi, n4);
    }
    long rest = n - n4 * 4;
    if (rest > 0)
        clamp_tail_kernel<<<(unsigned int)((rest + threads - 1) / threads), threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), (float)lo, (float)hi, n4 * 4, n);
    return out;
}
"""

clamp_cpp = "torch::Tensor clamp_cuda(torch::Tensor x, double lo, double hi);"

clamp_ext = load_inline(
    name="builtin_l1_clamp_vec4",
    cpp_sources=clamp_cpp,
    cuda_sources=clamp_source,
    functions=["clamp_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return clamp_ext.clamp_cuda(x, clamp_min, clamp_max)
