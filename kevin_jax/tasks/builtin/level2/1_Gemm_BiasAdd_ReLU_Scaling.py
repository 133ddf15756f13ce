import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A linear layer, then an extra learnable bias (drawn at random in __init__), ReLU and a constant scaling.
    """
    def __init__(self, in_features, out_features, bias_shape, scaling_factor):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.1)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.gemm(x)
        x = x + self.bias
        x = torch.relu(x)
        x = x * self.scaling_factor
        return x


batch_size = 1024
in_features = 2048
out_features = 2048
bias_shape = (out_features,)
scaling_factor = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, bias_shape, scaling_factor]
