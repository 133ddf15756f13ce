# Written for kevin-jax's tests in KernelBench's task format (not KernelBench code): helper classes beside Model, a
# lambda attribute, a causal mask buffer, RNG-free but attention-shaped.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class TanhGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class CausalAttention(nn.Module):
    def __init__(self, dim, heads, max_len):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = F.softmax(att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        return self.out((att @ v).transpose(1, 2).contiguous().view(b, t, d))


class Model(nn.Module):
    def __init__(self, dim, heads, max_len):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalAttention(dim, heads, max_len)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.ModuleDict(dict(up=nn.Linear(dim, 4 * dim), act=TanhGELU(), down=nn.Linear(4 * dim, dim)))
        self.mlp_forward = lambda x: self.mlp.down(self.mlp.act(self.mlp.up(x)))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp_forward(self.ln2(x))


batch_size = 16
max_len = 256
seq_len = 256
dim = 384
heads = 6


def get_inputs():
    return [torch.rand(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim, heads, max_len]
