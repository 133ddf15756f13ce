import torch
import torch.nn as nn


class Model(nn.Module):
    """BatchNorm2d left in training mode: normalises with the batch statistics."""

    def __init__(self, num_features: int):
        super(Model, self).__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


batch_size = 32
features = 64
height = 128
width = 128


def get_inputs():
    x = torch.randn(batch_size, features, height, width)
    return [x]


def get_init_inputs():
    return [features]
