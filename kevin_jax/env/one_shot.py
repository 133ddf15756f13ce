"""The one-shot example shown in the first turn: an element-wise addition and a CUDA version of it (our own, in
KernelBench's format). The answer ends with a "Summary:" line, the format the parser reads (env/parse.py)."""

EXAMPLE_MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Adds two tensors element-wise.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


size = 4096


def get_inputs():
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    return [a, b]


def get_init_inputs():
    return []
'''

EXAMPLE_MODEL_NEW = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_source = r"""
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    long n = a.numel();
    const int threads = 256;
    long blocks = (n + threads - 1) / threads;
    add_kernel<<<blocks, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

add_cpp = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

add_ext = load_inline(
    name="one_shot_add",
    cpp_sources=add_cpp,
    cuda_sources=add_source,
    functions=["add_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return add_ext.add_cuda(a.contiguous(), b.contiguous())
'''

EXAMPLE_SUMMARY = "replaced the element-wise addition with a custom CUDA kernel that computes one element per thread."
