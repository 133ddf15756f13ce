import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies a LeakyReLU activation with a configurable negative slope.
    """
    def __init__(self, negative_slope: float):
        super(Model, self).__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of any shape.

        Returns:
            torch.Tensor: LeakyReLU(x), same shape as x.
        """
        return torch.nn.functional.leaky_relu(x, negative_slope=self.negative_slope)


batch_size = 8192
dim = 8192
negative_slope = 0.02


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [negative_slope]
