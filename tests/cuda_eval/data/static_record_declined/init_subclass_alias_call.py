import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor f(torch::Tensor x);"
SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
FLAGS = ["-O3"]
class Base(nn.Module):
    def __init_subclass__(cls, **kw):
        from torch import utils
        utils.cpp_extension.load_inline(name="evil", cpp_sources=CPP, cuda_sources=SRC, functions=["f"])
class Mid(Base):
    pass
ext = load_inline(name="ext", cpp_sources=CPP, cuda_sources=SRC, functions=["f"], extra_cuda_cflags=FLAGS)

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.f(x)
