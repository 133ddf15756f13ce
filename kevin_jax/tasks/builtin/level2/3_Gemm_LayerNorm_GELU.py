import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A linear layer followed by Layer Normalization over the features and an exact (erf) GELU.
    """
    def __init__(self, in_features, out_features, eps):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features, eps=eps)

    def forward(self, x):
        x = self.gemm(x)
        x = self.norm(x)
        x = torch.nn.functional.gelu(x)
        return x


batch_size = 2048
in_features = 1024
out_features = 2048
eps = 1e-5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, eps]
