import torch
import torch.nn as nn


class Model(nn.Module):
    """A large square fp32 matmul (KernelBench level 1 style): several ms on an H100, the "over 5 ms" case."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


N = 4096


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
