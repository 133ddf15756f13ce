"""Contract 2 (docs/ARCHITECTURE.md): the policy as the environment sees it.

The sampler implements `Policy`; the environment calls `generate` once per round with the prompts of all live
trajectories. Tests use a scripted fake (`ScriptedPolicyFake`, in the tests) that replays recorded answers.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence, runtime_checkable

STOP_REASONS = ("eos", "stop", "length")


@dataclasses.dataclass
class Generation:
    tokens: list[int]        # exactly the sampled ids (the loss uses these, never a re-tokenised text)
    logprobs: list[float]    # log-prob of each sampled id under the sampling distribution
    stop_reason: str         # "eos" | "stop" | "length"

    def __post_init__(self):
        if len(self.tokens) != len(self.logprobs):
            raise ValueError(f"Generation has {len(self.tokens)} tokens but {len(self.logprobs)} log-probs")
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"Generation.stop_reason must be one of {STOP_REASONS}, got {self.stop_reason!r}")


@runtime_checkable
class Policy(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                 seed: int) -> list[Generation]: ...
