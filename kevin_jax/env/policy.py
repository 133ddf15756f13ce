"""Contract 2 (docs/ARCHITECTURE.md): the policy as the environment sees it.

The sampler implements `Policy`: `generate` samples a list of prompts with one seed. The round loop
(kevin_jax.env.episode) hands each pipeline group's round to a `PolicyStream` (`open_stream`): a policy with a
`stream()` (the sampler: one continuous decode batch that rounds join as they become ready, so that it stays full
while a round's longest responses finish), else `CallPerRequest`, one `generate` call per round. Either way a round's
tokens are those `generate` draws for its prompts and seed. Tests use a scripted fake (`ScriptedPolicyFake`, in the
tests) that replays recorded answers.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable

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


class PolicyStream(Protocol):
    """Requests sampled together. `add` queues one (its prompts, their token limit, its seed, an owner handed back
    with its answers); while `busy`, each `advance` does some sampling and returns the requests it completed as
    (owner, generations) pairs; `close` ends the stream (what is still queued is dropped). `continuous`: requests
    added while others run share their batch (else they run one after the other)."""
    continuous: bool

    def add(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], seed: int,
            owner: Any) -> None: ...

    @property
    def busy(self) -> bool: ...

    def advance(self) -> list[tuple[Any, list[Generation]]]: ...

    def close(self) -> None: ...


class CallPerRequest:
    """A PolicyStream of one `generate` call per request, in the order added (a policy without a stream of its own,
    or env.stream_rounds=False)."""

    continuous = False

    def __init__(self, policy: Policy):
        self.policy = policy
        self._queue: collections.deque = collections.deque()

    def add(self, prompts, max_new_tokens, seed, owner) -> None:
        self._queue.append((list(prompts), max_new_tokens, seed, owner))

    @property
    def busy(self) -> bool:
        return bool(self._queue)

    def advance(self) -> list[tuple[Any, list[Generation]]]:
        prompts, max_new_tokens, seed, owner = self._queue.popleft()
        generations = self.policy.generate(prompts, max_new_tokens, seed)
        if len(generations) != len(prompts):
            raise RuntimeError(f"policy.generate returned {len(generations)} results for {len(prompts)} inputs")
        return [(owner, generations)]

    def close(self) -> None:
        self._queue.clear()


def open_stream(policy: Policy, continuous: bool = True) -> PolicyStream:
    """The policy's own stream (continuous=True and it has `stream()`), else one generate call per request."""
    stream = getattr(policy, "stream", None) if continuous else None
    return stream() if stream is not None else CallPerRequest(policy)
