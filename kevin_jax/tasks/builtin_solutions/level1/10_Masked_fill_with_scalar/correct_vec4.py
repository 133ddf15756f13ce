import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

masked_fill_source = r"""
#include <torch/extension.h>
#include <cstdint>

__device__ __forceinline__ float masked_fill_op(float v, unsigned char m, float value) {
    return m ? value : v;
}

// 16-byte accesses: each thread loads and stores a float4 (four neighbouring elements) per iteration of a grid-stride
// loop, a quarter of the memory instructions of one float per thread; the last n % 4 elements (or everything, if a
// pointer is not 16-byte aligned) go through the scalar tail kernel.
__global__ void masked_fill_vec4_kernel(const float4* __restrict__ x4, const uchar4* __restrict__ mask4, float4* __restrict__ out4, float value, long n4) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        uchar4 m = mask4[i];
        v.x = masked_fill_op(v.x, m.x, value);
        v.y = masked_fill_op(v.y, m.y, value);
        v.z = masked_fill_op(v.z, m.z, value);
        v.w = masked_fill_op(v.w, m.w, value);
        out4[i] = v;
    }
}

__global__ void masked_fill_tail_kernel(const float* __restrict__ x, const bool* __restrict__ mask, float* __restrict__ out, float value, long start, long n) {
    long i = start + (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = masked_fill_op(x[i], (unsigned char)mask[i], value);
}

torch::Tensor masked_fill_cuda(torch::Tensor x, torch::Tensor mask, double value) {
    TORCH_CHECK(x.is_cuda() && mask.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(mask.scalar_type() == torch::kBool, "mask must be a bool tensor");
    TORCH_CHECK(x.sizes() == mask.sizes(), "x and mask must have the same shape");
    auto xc = x.contiguous();
    auto mc = mask.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    if (n == 0) return out;
    bool aligned = reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0 && reinterpret_cast<uintptr_t>(out.data_ptr<float>()) % 16 == 0 && reinterpret_cast<uintptr_t>(mc.data_ptr<bool>()) % 4 == 0;
    long n4 = aligned ? n / 4 : 0;
    const int threads = 256;
    if (n4 > 0) {
        long blocks = (n4 + threads - 1) / threads;
        if (blocks > 65536) blocks = 65536;
        masked_fill_vec4_kernel<<<(int)blocks, threads>>>(reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<const uchar4*>(mc.data_ptr<bool>()), reinterpret_cast<float4*>(out.data_ptr<float>()), (float)value, n4);
    }
    long rest = n - n4 * 4;
    if (rest > 0)
        masked_fill_tail_kernel<<<(unsigned int)((rest + threads - 1) / threads), threads>>>(xc.data_ptr<float>(), mc.data_ptr<bool>(), out.data_ptr<float>(), (float)value, n4 * 4, n);
    return out;
}
"""

masked_fill_cpp = "torch::Tensor masked_fill_cuda(torch::Tensor x, torch::Tensor mask, double value);"

masked_fill_ext = load_inline(
    name="builtin_l1_masked_fill_vec4",
    cpp_sources=masked_fill_cpp,
    cuda_sources=masked_fill_source,
    functions=["masked_fill_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
        return masked_fill_ext.masked_fill_cuda(x, mask, value)
