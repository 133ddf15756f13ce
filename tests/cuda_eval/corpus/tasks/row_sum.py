import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum over dimension `dim`, keeping it (size 1)."""

    def __init__(self, dim: int):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 8192
dim1 = 8192
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, dim1)
    return [x]


def get_init_inputs():
    return [reduce_dim]
