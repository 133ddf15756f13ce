import torch
import torch.nn as nn


class Model(nn.Module):
    """Row sums of a small matrix (for CPU-mode tests of the evaluator)."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=1, keepdim=True)


rows = 256
cols = 300


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
