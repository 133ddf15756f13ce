# task: relu
# verdict: timeout
# about: a kernel spins forever
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

bad_source = r"""
#include <torch/extension.h>

__global__ void relu_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

__global__ void abs_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fabsf(x[i]);
}

__global__ void spin_kernel(volatile int* flag) {
    while (*flag == 0) { }
}

// The wild pointer arrives as an argument: a null pointer the device compiler can see is undefined behaviour it may
// optimise away (the store vanished on the H200 run of 2026-11-21 and the candidate passed as correct).
__global__ void wild_write_kernel(const float* y, float* wild, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) wild[i * 7919] = y[i];
}

torch::Tensor relu_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}

torch::Tensor abs_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    abs_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}

torch::Tensor spin_forever(torch::Tensor x) {
    auto flag = torch::zeros({1}, x.options().dtype(torch::kInt32));
    spin_kernel<<<1, 1>>>(flag.data_ptr<int>());
    return relu_forward(x);
}

torch::Tensor write_through_null(torch::Tensor x) {
    auto y = relu_forward(x);
    long n = x.numel();
    float* wild = reinterpret_cast<float*>(static_cast<uintptr_t>(x.dim() > 8 ? 1 : 0) << 12);  // page 0: never mapped
    wild_write_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), wild, n);
    return y;
}

torch::Tensor host_segfault(torch::Tensor x) {
    volatile int* p = nullptr;
    *p = 42;
    return x;
}
"""

bad_ext = load_inline(
    name="bad_toolkit",
    cpp_sources="""
torch::Tensor relu_forward(torch::Tensor x);
torch::Tensor abs_forward(torch::Tensor x);
torch::Tensor spin_forever(torch::Tensor x);
torch::Tensor write_through_null(torch::Tensor x);
torch::Tensor host_segfault(torch::Tensor x);
""",
    cuda_sources=bad_source,
    functions=["relu_forward", "abs_forward", "spin_forever", "write_through_null", "host_segfault"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return bad_ext.spin_forever(x)
