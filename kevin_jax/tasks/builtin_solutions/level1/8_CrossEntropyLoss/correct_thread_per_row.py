import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cross_entropy_source = r"""
#include <torch/extension.h>

// One thread per row: max, then the sum of exponentials, each a sequential loop over the row; the row's loss
// logsumexp - logit[target] goes to a double total. Threads of a warp read 32 different rows, a whole row apart
// (uncoalesced).
__global__ void cross_entropy_thread_per_row_kernel(const float* __restrict__ logits,
                                                    const int64_t* __restrict__ targets, double* total, long rows,
                                                    int num_classes) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = logits + r * num_classes;
    float row_max = -INFINITY;
    for (int i = 0; i < num_classes; ++i) row_max = fmaxf(row_max, row[i]);
    float sum = 0.0f;
    for (int i = 0; i < num_classes; ++i) sum += expf(row[i] - row_max);
    float loss = logf(sum) + row_max - row[targets[r]];
    atomicAdd(total, (double)loss);
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
    const int threads = 128;
    cross_entropy_thread_per_row_kernel<<<(unsigned int)((rows + threads - 1) / threads), threads>>>(
        lg.data_ptr<float>(), tg.data_ptr<int64_t>(), total.data_ptr<double>(), rows, num_classes);
    finalize_mean_kernel<<<1, 1>>>(total.data_ptr<double>(), out.data_ptr<float>(), rows);
    return out;
}
"""

cross_entropy_cpp = "torch::Tensor cross_entropy_cuda(torch::Tensor logits, torch::Tensor targets);"

cross_entropy_ext = load_inline(
    name="builtin_l1_cross_entropy_thread_per_row",
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
