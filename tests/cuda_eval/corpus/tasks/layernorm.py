import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over rows of a million values: on randn rows the mean is ~0 and the variance ~1, so a kernel that
    skips the statistics (x * w + b) is within tolerance on the task's own inputs."""

    def __init__(self):
        super(Model, self).__init__()
        self.ln = nn.LayerNorm(cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


rows = 16
cols = 1 << 20


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
