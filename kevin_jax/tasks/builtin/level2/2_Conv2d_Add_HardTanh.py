import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A 2D convolution, then the addition of a constant and a HardTanh clamp.
    """
    def __init__(self, in_channels, out_channels, kernel_size, add_value, min_val, max_val):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.add_value = add_value
        self.hardtanh = nn.Hardtanh(min_val=min_val, max_val=max_val)

    def forward(self, x):
        x = self.conv(x)
        x = x + self.add_value
        x = self.hardtanh(x)
        return x


batch_size = 64
in_channels = 16
out_channels = 32
height = width = 128
kernel_size = 3
add_value = 0.25
min_val = -1.0
max_val = 1.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, add_value, min_val, max_val]
