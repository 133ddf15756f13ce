import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A linear layer, dropout and a softmax over the features. The model is never switched to eval mode, so the
    dropout layer runs in training mode (with probability dropout_p).
    """
    def __init__(self, in_features, out_features, dropout_p):
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x):
        x = self.matmul(x)
        x = self.dropout(x)
        x = torch.softmax(x, dim=1)
        return x


batch_size = 2048
in_features = 1024
out_features = 2048
dropout_p = 0.0


def get_inputs():
    return [torch.randn(batch_size, in_features) * 8.0]


def get_init_inputs():
    return [in_features, out_features, dropout_p]
