import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_source = r"""
#include <torch/extension.h>

__device__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}

__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

// Block-wide reductions: every thread gets the result. blockDim.x must be a multiple of 32.
__device__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int num_warps = blockDim.x >> 5;
    if (warp == 0) {
        v = lane < num_warps ? scratch[lane] : -INFINITY;
        v = warp_max(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    float result = scratch[0];
    __syncthreads();
    return result;
}

__device__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    int num_warps = blockDim.x >> 5;
    if (warp == 0) {
        v = lane < num_warps ? scratch[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    float result = scratch[0];
    __syncthreads();
    return result;
}

// One block per row.
__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float scratch[32];
    const float* row = x + (long)blockIdx.x * cols;
    float* out_row = out + (long)blockIdx.x * cols;

    float local_max = -INFINITY;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) local_max = fmaxf(local_max, row[i]);
    float row_max = block_max(local_max, scratch);

    float local_sum = 0.0f;
    for (int i = threadIdx.x; i < cols / 2; i += blockDim.x) local_sum += __expf(row[i] - row_max);  // BUG: half the row
    float inv_sum = 1.0f / block_sum(local_sum, scratch);

    for (int i = threadIdx.x; i < cols; i += blockDim.x) out_row[i] = __expf(row[i] - row_max) * inv_sum;
}

torch::Tensor softmax_rows_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() == 2, "x must be a 2D float32 CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    int rows = xc.size(0), cols = xc.size(1);
    softmax_rows_kernel<<<rows, 256>>>(xc.data_ptr<float>(), out.data_ptr<float>(), cols);
    return out;
}
"""

softmax_cpp = "torch::Tensor softmax_rows_cuda(torch::Tensor x);"

softmax_ext = load_inline(
    name="builtin_l1_softmax_rows_wrong_partial",
    cpp_sources=softmax_cpp,
    cuda_sources=softmax_source,
    functions=["softmax_rows_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_ext.softmax_rows_cuda(x)
