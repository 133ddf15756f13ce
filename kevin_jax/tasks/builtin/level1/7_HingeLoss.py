import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Computes the mean hinge loss for binary classification with targets in {-1, +1}.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """
        Args:
            predictions (torch.Tensor): Scores of shape (batch_size, num_outputs).
            targets (torch.Tensor): Labels in {-1, +1}, same shape as predictions.

        Returns:
            torch.Tensor: A scalar tensor, mean(clamp(1 - predictions * targets, min=0)).
        """
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


batch_size = 16384
num_outputs = 4096


def get_inputs():
    predictions = torch.randn(batch_size, num_outputs)
    targets = torch.randint(0, 2, (batch_size, num_outputs)).float() * 2 - 1
    return [predictions, targets]


def get_init_inputs():
    return []
