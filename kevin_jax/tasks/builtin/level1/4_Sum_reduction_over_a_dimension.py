import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Sums a 3D tensor over one dimension, keeping that dimension with size 1.
    """
    def __init__(self, dim: int):
        """
        Args:
            dim (int): The dimension to reduce over.
        """
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim1, dim2).

        Returns:
            torch.Tensor: x summed over self.dim with keepdim=True.
        """
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 128
dim1 = 2048
dim2 = 512
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, dim1, dim2)
    return [x]


def get_init_inputs():
    return [reduce_dim]
