import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

hinge_source = r"""
#include <torch/extension.h>

// Each block reduces a grid-strided share of max(0, 1 - p * t) and adds it to a double accumulator.
__global__ void hinge_sum_kernel(const float* __restrict__ pred, const float* __restrict__ target, double* acc, long n) {
    __shared__ float scratch[32];
    float s = 0.0f;
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        s += 1.0f - pred[i] * target[i];  // BUG: the clamp at zero is missing
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffff, s, offset);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffff, s, offset);
        if (lane == 0) atomicAdd(acc, (double)s);
    }
}

__global__ void finalize_mean_kernel(const double* acc, float* out, long n) { out[0] = (float)(acc[0] / (double)n); }

torch::Tensor hinge_loss_cuda(torch::Tensor pred, torch::Tensor target) {
    TORCH_CHECK(pred.is_cuda() && target.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(pred.numel() == target.numel(), "predictions and targets must have the same number of elements");
    auto p = pred.contiguous();
    auto t = target.contiguous().to(torch::kFloat32);
    long n = p.numel();
    auto acc = torch::zeros({1}, p.options().dtype(torch::kFloat64));
    auto out = torch::empty({}, p.options());
    hinge_sum_kernel<<<1024, 256>>>(p.data_ptr<float>(), t.data_ptr<float>(), acc.data_ptr<double>(), n);
    finalize_mean_kernel<<<1, 1>>>(acc.data_ptr<double>(), out.data_ptr<float>(), n);
    return out;
}
"""

hinge_cpp = "torch::Tensor hinge_loss_cuda(torch::Tensor pred, torch::Tensor target);"

hinge_ext = load_inline(
    name="builtin_l1_hinge_loss_wrong_clamp",
    cpp_sources=hinge_cpp,
    cuda_sources=hinge_source,
    functions=["hinge_loss_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return hinge_ext.hinge_loss_cuda(predictions, targets)
