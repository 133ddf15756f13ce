import torch
import torch.nn as nn


class Model(nn.Module):
    """A 128x256 @ 256x256 matmul (small: for CPU-mode tests of the evaluator)."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


M, K, N = 128, 256, 256


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
