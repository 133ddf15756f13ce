import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

axpy_source = r"""
#include <torch/extension.h>

// One thread per element, but the threads of a block walk DOWN a column of the (rows, cols) view: thread x takes
// row blockIdx.x * blockDim.x + threadIdx.x of column blockIdx.y. Neighbouring threads touch addresses a whole row
// apart, so every warp-wide load and store is split into 32 separate memory transactions (uncoalesced).
__global__ void axpy_colwise_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, float alpha, long rows, long cols) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    for (long c = blockIdx.y; c < cols; c += gridDim.y) {
        long i = r * cols + c;
        out[i] = alpha * x[i] + y[i];
    }
}

torch::Tensor axpy_cuda(torch::Tensor x, torch::Tensor y, double alpha) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && y.scalar_type() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(x.sizes() == y.sizes(), "x and y must have the same shape");
    auto xc = x.contiguous();
    auto yc = y.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    if (n == 0) return out;
    long cols = xc.dim() > 0 ? xc.size(-1) : 1;
    long rows = n / cols;
    const int threads = 256;
    dim3 grid((unsigned int)((rows + threads - 1) / threads), (unsigned int)(cols < 65535 ? cols : 65535));
    axpy_colwise_kernel<<<grid, threads>>>(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), (float)alpha, rows, cols);
    return out;
}
"""

axpy_cpp = "torch::Tensor axpy_cuda(torch::Tensor x, torch::Tensor y, double alpha);"

axpy_ext = load_inline(
    name="builtin_l1_axpy_uncoalesced",
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
