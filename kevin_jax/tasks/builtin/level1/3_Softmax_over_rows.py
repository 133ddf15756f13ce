import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Computes a softmax over the last dimension of a 2D tensor.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, num_features).

        Returns:
            torch.Tensor: Softmax of x along dim 1, same shape as x.
        """
        return torch.softmax(x, dim=1)


batch_size = 4096
num_features = 16384


def get_inputs():
    x = torch.randn(batch_size, num_features) * 4.0
    return [x]


def get_init_inputs():
    return []
