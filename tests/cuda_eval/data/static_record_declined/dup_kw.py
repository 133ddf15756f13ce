import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor f(torch::Tensor x);"
SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
FLAGS = ["-O3"]
ext = load_inline(name="ext", name="e2", cpp_sources=CPP)

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.f(x)
