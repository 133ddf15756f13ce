# Written for kevin-jax's tests in KernelBench's task format (not KernelBench code): forward reads module globals
# (lower, upper), dropout active in training mode, non-tensor init inputs, an *_OLD.py file name.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, lower, upper, p):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.norm = nn.GroupNorm(groups, out_channels)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        y = self.norm(self.conv(x))
        y = torch.minimum(y, torch.tensor(lower, device=y.device))
        return self.drop(y.clamp(lower, upper))


batch_size = 64
in_channels = 3
out_channels = 16
depth, height, width = 16, 32, 32
kernel_size = 3
groups = 8
lower = 0.0
upper = 1.0
p = 0.2


def get_inputs():
    return [torch.rand(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups, lower, upper, p]
