import torch
import torch.nn as nn


class Model(nn.Module):
    """diag(A) @ B: the reference materialises the N x N diagonal matrix and runs a full matmul."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B


N = 4096
M = 4096


def get_inputs():
    A = torch.randn(N)
    B = torch.randn(N, M)
    return [A, B]


def get_init_inputs():
    return []
