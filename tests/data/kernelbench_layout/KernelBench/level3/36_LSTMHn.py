# Written for kevin-jax's tests in KernelBench's task format (not KernelBench code): several tensor inputs (the
# sequence and both initial states), a tuple state returned partially.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size, dropout=0.0):
        super().__init__()
        self.rnn = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden_size, output_size)  # unused by forward, as in the real task

    def forward(self, x, h0, c0):
        _, (h_n, _) = self.rnn(x, (h0, c0))
        return h_n


batch_size = 8
sequence_length = 256
input_size = 64
hidden_size = 128
num_layers = 4
output_size = 10
dropout = 0.0


def get_inputs():
    return [torch.rand(batch_size, sequence_length, input_size),
            torch.rand(num_layers, batch_size, hidden_size),
            torch.rand(num_layers, batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size, dropout]
