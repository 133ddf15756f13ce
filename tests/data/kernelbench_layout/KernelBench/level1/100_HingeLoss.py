# Written for kevin-jax's tests in KernelBench's task format (not KernelBench code): +-1 float targets drawn with
# randint, a heavy-tailed input from torch.distributions (an extra import), large shapes.
import torch
import torch.nn as nn
from torch.distributions import Pareto


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, scores, labels):
        margins = 1.0 - scores * labels
        return margins.clamp_min(0.0).mean()


batch_size = 32768
features = 32768


def get_inputs():
    scores = Pareto(0.01, 1.5).sample((batch_size, features))
    labels = torch.randint(0, 2, (batch_size,)).float() * 2 - 1
    return [scores, labels]


def get_init_inputs():
    return []
