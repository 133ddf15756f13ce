import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Replaces the elements of x where a boolean mask is True by a scalar value.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): float32 tensor of shape (batch_size, dim).
            mask (torch.Tensor): bool tensor, same shape as x.
            value (float): the fill value (a Python float, not a tensor).

        Returns:
            torch.Tensor: x with x[mask] = value, as a new tensor.
        """
        return x.masked_fill(mask, value)


batch_size = 8192
dim = 8192
fill_value = -0.5


def get_inputs():
    x = torch.randn(batch_size, dim)
    mask = torch.rand(batch_size, dim) < 0.3
    return [x, mask, fill_value]


def get_init_inputs():
    return []
