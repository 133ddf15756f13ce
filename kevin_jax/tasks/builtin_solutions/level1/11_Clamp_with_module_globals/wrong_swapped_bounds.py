import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The reference reads these bounds from its own module; this program is a separate module, so it defines them too.
clamp_min = -0.75
clamp_max = 1.25

clamp_source = r"""
#include <torch/extension.h>

__global__ void clamp_kernel(const float* __restrict__ x, float* __restrict__ out, float lo, float hi, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = fmaxf(fminf(x[i], lo), hi);  // BUG: bounds applied in swapped roles
}

torch::Tensor clamp_cuda(torch::Tensor x, double lo, double hi) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    const int threads = 256;
    long blocks = (n + threads - 1) / threads;
    if (blocks > 65536) blocks = 65536;
    clamp_kernel<<<(int)blocks, threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), (float)lo, (float)hi, n);
    return out;
}
"""

clamp_cpp = "torch::Tensor clamp_cuda(torch::Tensor x, double lo, double hi);"

clamp_ext = load_inline(
    name="builtin_l1_clamp_wrong_order",
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
