import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Multiplies A by the transpose of B: C = A @ B.T
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """
        Args:
            A (torch.Tensor): Tensor of shape (M, K).
            B (torch.Tensor): Tensor of shape (N, K).

        Returns:
            torch.Tensor: Tensor of shape (M, N).
        """
        return torch.matmul(A, B.T)


M = 2048
K = 2048
N = 1024


def get_inputs():
    A = torch.randn(M, K)
    B = torch.randn(N, K)
    return [A, B]


def get_init_inputs():
    return []
