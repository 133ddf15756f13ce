# Written for kevin-jax's tests in KernelBench's task format (not KernelBench code): two 32768 x 32768 fp32 inputs
# (4 GiB each), as the largest real level-1 tasks have.
import torch
import torch.nn as nn
from torch.distributions import Pareto


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predicted, observed):
        diff = predicted - observed
        return (diff * diff).mean()


rows = 32768
cols = 32768


def get_inputs():
    heavy = Pareto(0.01, 1.5)
    return [heavy.sample((rows, cols)), heavy.sample((rows, cols))]


def get_init_inputs():
    return []
