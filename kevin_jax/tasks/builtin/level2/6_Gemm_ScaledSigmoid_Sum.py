import torch
import torch.nn as nn


class ScaledSigmoid(nn.Module):
    """
    A helper module: sigmoid(x) * scale.
    """
    def __init__(self, scale):
        super(ScaledSigmoid, self).__init__()
        self.scale = scale

    def forward(self, x):
        return torch.sigmoid(x) * self.scale


class Model(nn.Module):
    """
    A linear layer, a scaled sigmoid (a helper module) and a sum over the features.
    """
    def __init__(self, in_features, out_features, scale):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.act = ScaledSigmoid(scale)

    def forward(self, x):
        x = self.gemm(x)
        x = self.act(x)
        x = torch.sum(x, dim=1, keepdim=True)
        return x


batch_size = 2048
in_features = 1024
out_features = 2048
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
