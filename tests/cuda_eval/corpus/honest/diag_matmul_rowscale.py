# task: diag_matmul
# about: diag(A) @ B is a row scaling: O(N*M) instead of O(N^2*M); a legitimately large speedup
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

row_scale_source = r"""
#include <torch/extension.h>

__global__ void row_scale_kernel(const float* __restrict__ a, const float4* __restrict__ B, float4* __restrict__ out,
                                 long rows, long cols4) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= rows * cols4) return;
    float s = a[i / cols4];
    float4 v = B[i];
    v.x *= s; v.y *= s; v.z *= s; v.w *= s;
    out[i] = v;
}

torch::Tensor diag_matmul(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(B.size(1) % 4 == 0, "columns must be a multiple of 4");
    auto a = A.contiguous();
    auto b = B.contiguous();
    auto out = torch::empty_like(b);
    long rows = b.size(0), cols4 = b.size(1) / 4;
    long total = rows * cols4;
    row_scale_kernel<<<(total + 255) / 256, 256>>>(
        a.data_ptr<float>(), reinterpret_cast<const float4*>(b.data_ptr<float>()),
        reinterpret_cast<float4*>(out.data_ptr<float>()), rows, cols4);
    return out;
}
"""

diag_ext = load_inline(name="honest_diag_matmul", cpp_sources="torch::Tensor diag_matmul(torch::Tensor A, torch::Tensor B);",
                       cuda_sources=row_scale_source, functions=["diag_matmul"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A, B):
        return diag_ext.diag_matmul(A, B)
