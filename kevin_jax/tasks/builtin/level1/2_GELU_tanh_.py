import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies the tanh approximation of GELU element-wise.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of any shape.

        Returns:
            torch.Tensor: GELU(x) with approximate="tanh", same shape as x.
        """
        return torch.nn.functional.gelu(x, approximate="tanh")


batch_size = 4096
dim = 16384


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
