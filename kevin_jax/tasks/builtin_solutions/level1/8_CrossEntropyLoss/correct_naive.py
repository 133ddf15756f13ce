import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cross_entropy_source = r"""
#include <torch/extension.h>

__device__ float block_reduce(float v, float* scratch, bool is_max) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_xor_sync(0xffffffff, v, offset);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
        for (int offset = 16; offset > 0; offset >>= 1) {
            float other = __shfl_xor_sync(0xffffffff, v, offset);
            v = is_max ? fmaxf(v, other) : v + other;
        }
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    float result = scratch[0];
    __syncthreads();
    return result;
}

// One block per row: loss_row = logsumexp(logits_row) - logits_row[target]; the block adds it to a double total.
__global__ void cross_entropy_rows_kernel(const float* __restrict__ logits, const int64_t* __restrict__ targets,
                                          double* total, int num_classes) {
    __shared__ float scratch[32];
    const float* row = logits + (long)blockIdx.x * num_classes;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < num_classes; i += blockDim.x) m = fmaxf(m, row[i]);
    float row_max = block_reduce(m, scratch, true);
    float s = 0.0f;
    for (int i = threadIdx.x; i < num_classes; i += blockDim.x) s += expf(row[i] - row_max);
    float row_sum = block_reduce(s, scratch, false);
    if (threadIdx.x == 0) {
        float loss = logf(row_sum) + row_max - row[targets[blockIdx.x]];
        atomicAdd(total, (double)loss);
    }
}

__global__ void finalize_mean_kernel(const double* total, float* out, long rows) {
    out[0] = (float)(total[0] / (double)rows);
}

torch::Tensor cross_entropy_cuda(torch::Tensor logits, torch::Tensor targets) {
    TORCH_CHECK(logits.is_cuda() && targets.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && targets.scalar_type() == torch::kInt64,
                "logits must be float32 and targets int64");
    auto lg = logits.contiguous();
    auto tg = targets.contiguous();
    long rows = lg.size(0);
    int num_classes = lg.size(1);
    auto total = torch::zeros({1}, lg.options().dtype(torch::kFloat64));
    auto out = torch::empty({}, lg.options());
    cross_entropy_rows_kernel<<<rows, 256>>>(lg.data_ptr<float>(), tg.data_ptr<int64_t>(), total.data_ptr<double>(),
                                             num_classes);
    finalize_mean_kernel<<<1, 1>>>(total.data_ptr<double>(), out.data_ptr<float>(), rows);
    return out;
}
"""

cross_entropy_cpp = "torch::Tensor cross_entropy_cuda(torch::Tensor logits, torch::Tensor targets);"

cross_entropy_ext = load_inline(
    name="builtin_l1_cross_entropy_correct",
    cpp_sources=cross_entropy_cpp,
    cuda_sources=cross_entropy_source,
    functions=["cross_entropy_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy_ext.cross_entropy_cuda(logits, targets)
