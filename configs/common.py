"""The run config with Kevin-32B's recipe as the baseline; every config file starts from `base()`.

The defaults are the section dataclasses' own (kevin_jax.run_config.default_config: one ConfigDict per section with
exactly the fields of the dataclass that reads it, in kevin_jax.run_config.SECTIONS), so `--config.<section>.<field>`
works for every field and an unknown field is an error. Most of Kevin's numbers are those defaults (8 tasks x 16
trajectories x 4 turns, gamma 0.4, AdamW lr 2e-6, ...); base() adds where the recipe departs from them: the
dataclasses default to sizes that suit small runs and tests. This file must not import jax: launch/train.py sets the
GPU placement environment from the config before JAX starts.

Ablation switches are plain overrides, e.g.:
  --config.env.num_turns=1 --config.reward.return_aggregation=single_turn  single-turn training (configs/single_turn.py)
  --config.reward.gamma=0.8 --config.reward.return_aggregation=max         return discount / sum vs max of later scores
  --config.env.num_trajectories=8                                           parallel trajectories per task
  --config.reward.correct_weight=0.0 --config.reward.speedup_transform=log  score weights
  --config.advantage.baseline=turn_mean                                     advantage baseline per turn
  --config.rl.loss_aggregation=token_mean                                   how token losses combine (or sequence_mean)
  --config.rl.kl_coef=0.01                                                  KL to the starting policy
"""
from ml_collections import ConfigDict

from kevin_jax import run_config


def base() -> ConfigDict:
    """Kevin-32B's recipe: the dataclass defaults, and where the recipe departs from them on purpose."""
    c = run_config.default_config()
    # The recipe's policy is an HF checkpoint (QwQ-32B; --config.model.hf_checkpoint), not a random init.
    c.model.shape = ""
    # Refinement prompts carry up to three earlier attempts (code, summary, feedback) of KernelBench programs.
    c.env.max_prompt_tokens = 16384
    # The sampler sized for the recipe (the dataclass defaults suit small runs and tests): Kevin's 8 tasks x 16
    # trajectories decode together, within QwQ's 40k context (>= the prompt budget + 22k responses), long prompts
    # prefill in fewer, larger calls, and the KV pool takes a smaller share of the free GPU memory (the GPU is shared
    # with cuda_eval's workers).
    c.sampler.max_slots = 128
    c.sampler.max_seq_len = 40960
    c.sampler.prefill_tokens = 8192
    c.sampler.prefill_chunk = 2048
    c.sampler.kv_cache_fraction = 0.3
    return c
