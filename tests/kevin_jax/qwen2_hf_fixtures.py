"""Test helpers: random tiny Hugging Face Qwen2 checkpoints (torch, CPU) to compare kevin_jax against."""
from __future__ import annotations

import os

import numpy as np


def random_hf_model(seed: int = 0, *, vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
                    rms_norm_eps=1e-6, scale=0.15):
    """A transformers Qwen2ForCausalLM (fp32, eager attention) with every parameter random, biases and norms
    included (HF's own init leaves biases at 0 and norms at 1, which would hide layout bugs)."""
    import torch
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, rms_norm_eps=rms_norm_eps,
        rope_parameters={"rope_theta": rope_theta, "rope_type": "default"},
        tie_word_embeddings=tie_word_embeddings, max_position_embeddings=1024, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * scale
            param.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return model


def save_random_hf_model(directory: str, seed: int = 0, *, max_shard_size: str | None = None, dtype=None, **shape):
    import torch

    model = random_hf_model(seed, **shape)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return model


def hf_logits_and_hidden(model, tokens: np.ndarray, attention_mask: np.ndarray | None = None,
                         position_ids: np.ndarray | None = None):
    import torch

    with torch.no_grad():
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = torch.as_tensor(attention_mask)
        if position_ids is not None:
            kwargs["position_ids"] = torch.as_tensor(position_ids)
        out = model(torch.as_tensor(tokens), output_hidden_states=True, **kwargs)
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


def list_files(directory: str) -> list[str]:
    return sorted(os.listdir(directory))
