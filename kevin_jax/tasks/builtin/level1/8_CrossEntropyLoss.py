import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Computes the mean cross-entropy loss of logits against integer class targets.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """
        Args:
            logits (torch.Tensor): Unnormalized scores of shape (batch_size, num_classes).
            targets (torch.Tensor): int64 class indices of shape (batch_size,).

        Returns:
            torch.Tensor: A scalar tensor with the mean loss.
        """
        return torch.nn.functional.cross_entropy(logits, targets)


batch_size = 32768
num_classes = 2048


def get_inputs():
    logits = torch.randn(batch_size, num_classes) * 2.0
    targets = torch.randint(0, num_classes, (batch_size,))
    return [logits, targets]


def get_init_inputs():
    return []
