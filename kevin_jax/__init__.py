"""kevin-jax: multi-turn RL that teaches an LLM to write fast, correct CUDA kernels (see docs/ARCHITECTURE.md)."""
