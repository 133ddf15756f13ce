import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gelu_source = r"""
#include <torch/extension.h>

// One thread per element, but the threads of a block walk DOWN a column of the (rows, cols) view: thread x takes
// row blockIdx.x * blockDim.x + threadIdx.x of column blockIdx.y. Neighbouring threads touch addresses a whole row
// apart, so every warp-wide load and store is split into 32 separate memory transactions (uncoalesced).
__global__ void gelu_tanh_colwise_kernel(const float* __restrict__ x, float* __restrict__ out, long rows, long cols) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    for (long c = blockIdx.y; c < cols; c += gridDim.y) {
        long i = r * cols + c;
        const float k0 = 0.7978845608028654f;  // sqrt(2 / pi)
        const float k1 = 0.044715f;
        float v = x[i];
        float inner = k0 * (v + k1 * v * v * v);
        out[i] = 0.5f * v * (1.0f + tanhf(inner));
    }
}

torch::Tensor gelu_tanh_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    if (n == 0) return out;
    long cols = xc.dim() > 0 ? xc.size(-1) : 1;
    long rows = n / cols;
    const int threads = 256;
    dim3 grid((unsigned int)((rows + threads - 1) / threads), (unsigned int)(cols < 65535 ? cols : 65535));
    gelu_tanh_colwise_kernel<<<grid, threads>>>(xc.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    return out;
}
"""

gelu_cpp = "torch::Tensor gelu_tanh_cuda(torch::Tensor x);"

gelu = load_inline(
    name="builtin_l1_gelu_tanh_uncoalesced",
    cpp_sources=gelu_cpp,
    cuda_sources=gelu_source,
    functions=["gelu_tanh_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu.gelu_tanh_cuda(x)
