import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Computes alpha * x + y on large tensors (an axpy).
    """
    def __init__(self, alpha: float):
        super(Model, self).__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Tensor of shape (rows, cols).
            y (torch.Tensor): Tensor of shape (rows, cols).

        Returns:
            torch.Tensor: alpha * x + y, same shape.
        """
        return self.alpha * x + y


rows = 32768
cols = 4096
alpha = 1.75


def get_inputs():
    x = torch.rand(rows, cols)
    y = torch.rand(rows, cols)
    return [x, y]


def get_init_inputs():
    return [alpha]
