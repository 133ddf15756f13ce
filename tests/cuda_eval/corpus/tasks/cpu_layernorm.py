import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over rows of 262144 values (for CPU-mode tests of the evaluator): on randn rows the mean is ~0
    and the variance ~1, so x * w + b is within tolerance there."""

    def __init__(self):
        super(Model, self).__init__()
        self.ln = nn.LayerNorm(cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


rows = 2
cols = 1 << 18


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
