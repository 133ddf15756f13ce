import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies Layer Normalization over the last dimension, with a learnable scale and shift.
    """
    def __init__(self, normalized_shape: int):
        super(Model, self).__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, features).

        Returns:
            torch.Tensor: Normalized tensor, same shape as x.
        """
        return self.ln(x)


batch_size = 8192
features = 8192


def get_inputs():
    x = torch.randn(batch_size, features) * 3.0 + 1.0
    return [x]


def get_init_inputs():
    return [features]
