import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor f(torch::Tensor x);"
SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
FLAGS = ["-O3"]
ext = load_inline(name="ext", cpp_sources=CPP, cuda_sources=SRC, functions=["f"], extra_cuda_cflags=FLAGS)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        from torch import utils
        self.more = utils.cpp_extension.load_inline(name="more", cpp_sources=CPP, cuda_sources=SRC, functions=["f"])
    def forward(self, x):
        return ext.f(x)
