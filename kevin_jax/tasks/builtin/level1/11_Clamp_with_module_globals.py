import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Clamps a tensor to [clamp_min, clamp_max]; the bounds are module-level constants read by forward.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of any shape.

        Returns:
            torch.Tensor: x clamped to [clamp_min, clamp_max].
        """
        return torch.clamp(x, min=clamp_min, max=clamp_max)


batch_size = 8192
dim = 8192
clamp_min = -0.75
clamp_max = 1.25


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
