# task: cross_entropy
# about: int64 targets kept as int64 by the harness; one block per row computes logsumexp - logit[target]
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ce_source = r"""
#include <torch/extension.h>

__global__ void cross_entropy_kernel(const float* __restrict__ logits, const int64_t* __restrict__ targets,
                                     float* __restrict__ loss, int classes, float inv_batch) {
    __shared__ float red[256];
    const float* row = logits + (long)blockIdx.x * classes;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) m = fmaxf(m, row[c]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    float sum = 0.f;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) sum += expf(row[c] - m);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float row_loss = logf(red[0]) + m - row[targets[blockIdx.x]];
        atomicAdd(loss, row_loss * inv_batch);
    }
}

torch::Tensor cross_entropy(torch::Tensor logits, torch::Tensor targets) {
    TORCH_CHECK(targets.scalar_type() == torch::kInt64, "targets must stay int64");
    auto lc = logits.contiguous();
    auto tc = targets.contiguous();
    auto loss = torch::zeros({}, lc.options());
    int batch = lc.size(0), classes = lc.size(1);
    cross_entropy_kernel<<<batch, 256>>>(
        lc.data_ptr<float>(), tc.data_ptr<int64_t>(), loss.data_ptr<float>(), classes, 1.0f / batch);
    return loss;
}
"""

ce = load_inline(name="honest_cross_entropy", cpp_sources="torch::Tensor cross_entropy(torch::Tensor logits, torch::Tensor targets);",
                 cuda_sources=ce_source, functions=["cross_entropy"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, predictions, targets):
        return ce.cross_entropy(predictions, targets)
