import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer (GEMM + bias) followed by ReLU."""

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        return torch.relu(x)


batch_size = 4096
in_features = 2048
out_features = 2048


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
