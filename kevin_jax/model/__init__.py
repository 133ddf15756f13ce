"""The kevin_jax policy model: Qwen2/QwQ-32B in Flax NNX, HF checkpoint import/export, tokenizer."""
