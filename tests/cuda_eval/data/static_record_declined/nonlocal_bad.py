import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor f(torch::Tensor x);"
SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
FLAGS = ["-O3"]
def helper():
    nonlocal zz
ext = load_inline(name="ext", cpp_sources=CPP, cuda_sources=SRC, functions=["f"], extra_cuda_cflags=FLAGS)

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.f(x)
