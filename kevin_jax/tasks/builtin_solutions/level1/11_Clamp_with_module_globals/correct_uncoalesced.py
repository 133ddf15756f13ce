import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The reference reads these bounds from its own module; this program is a separate module, so it defines them too.
clamp_min = -0.75
clamp_max = 1.25

clamp_source = r"""
#include <torch/extension.h>

// One thread per element, but the threads of a block walk DOWN a column of the (rows, cols) view: thread x takes
// row blockIdx.x * blockDim.x + threadIdx.x of column blockIdx.y. Neighbouring threads touch addresses a whole row
// apart, so every warp-wide load and store is split into 32 separate memory transactions (uncoalesced).
__global__ void clamp_colwise_kernel(const float* __restrict__ x, float* __restrict__ out, float lo, float hi, long rows, long cols) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    for (long c = blockIdx.y; c < cols; c += gridDim.y) {
        long i = r * cols + c;
        out[i] = fminf(fmaxf(x[i], lo), hi);
    }
}

torch::Tensor clamp_cuda(torch::Tensor x, double lo, double hi) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    if (n == 0) return out;
    long cols = xc.dim() > 0 ? xc.size(-1) : 1;
    long rows = n / cols;
    const int threads = 256;
    dim3 grid((unsigned int)((rows + threads - 1) / threads), (unsigned int)(cols < 65535 ? cols : 65535));
    clamp_colwise_kernel<<<grid, threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), (float)lo, (float)hi, rows, cols);
    return out;
}
"""

clamp_cpp = "torch::Tensor clamp_cuda(torch::Tensor x, double lo, double hi);"

clamp_ext = load_inline(
    name="builtin_l1_clamp_uncoalesced",
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
