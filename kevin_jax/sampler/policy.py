"""`SamplerPolicy`: Contract 2's Policy (kevin_jax.env.policy) on top of a kevin_jax Qwen2 model.

    policy = SamplerPolicy(model, SamplerConfig(temperature=0.9), tokenizer=tok, mesh=mesh)
    generations = policy.generate(prompt_token_lists, max_new_tokens=16384, seed=step)
    policy.set_model(updated_model)          # after an optimiser step: same graph, new parameters, nothing recompiles
    stream = policy.stream()                 # requests decoded in one continuous batch (kevin_jax.env.policy)

Generation.logprobs are log-probs under the sampling distribution (temperature, top-k/top-p): what
Qwen2ForCausalLM.token_logprobs(..., temperature=T) recomputes when top_k=0 and top_p=1. `sample` also returns the
temperature-1 policy log-probs (see kevin_jax.sampler.sampling).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flax import nnx

from kevin_jax.env.policy import Generation
from kevin_jax.model import qwen2
from kevin_jax.sampler.config import SamplerConfig
from kevin_jax.sampler.engine import GenerateStats, SampleResult, SamplerEngine, SamplerStream, params_of


class StopStringCheck:
    """Host check for stop strings: decodes the newly generated tokens (plus a look-back window, so that a string
    split across decode calls is found) and, on a match, keeps the tokens up to the one that completes it."""

    def __init__(self, tokenizer, stop_strings: Sequence[str]):
        if not stop_strings:
            raise ValueError("StopStringCheck needs at least one stop string")
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        # A token holds at least one byte, so this many tokens cover any stop string.
        self.lookback = max(len(s.encode("utf-8")) for s in self.stop_strings) + 2

    def _found(self, ids) -> bool:
        text = self.tokenizer.decode(ids)
        return any(s in text for s in self.stop_strings)

    def __call__(self, index: int, tokens: list[int], added: int) -> int | None:
        start = max(0, len(tokens) - added - self.lookback)
        if not self._found(tokens[start:]):
            return None
        for end in range(start + 1, len(tokens) + 1):
            if self._found(tokens[start:end]):
                return end
        return len(tokens)


class SamplerPolicy:
    """Implements kevin_jax.env.policy.Policy. Holds the model (its parameters are read at each call, not copied)."""

    def __init__(self, model: qwen2.Qwen2ForCausalLM, config: SamplerConfig = SamplerConfig(), *, tokenizer=None,
                 mesh=None):
        stop_ids = config.stop_ids or (tuple(tokenizer.stop_ids) if tokenizer is not None else ())
        if config.stop_strings and tokenizer is None:
            raise ValueError("sampler.stop_strings needs a tokenizer (SamplerPolicy(..., tokenizer=...))")
        self.config = config
        self.tokenizer = tokenizer
        self.engine = SamplerEngine(model, config, mesh=mesh, stop_ids=stop_ids)
        self._stop_check = StopStringCheck(tokenizer, config.stop_strings) if config.stop_strings else None
        self.model = model
        self.last_stats: GenerateStats | None = None

    def set_model(self, model: qwen2.Qwen2ForCausalLM) -> None:
        """Samples from `model` from now on; it must have the same graph (architecture, options) as before."""
        if nnx.split(model)[0] != self.engine.graphdef:
            raise ValueError("set_model: the new model's graph (architecture or ModelOptions) differs from the one "
                             "this policy was built for; build a new SamplerPolicy")
        self.model = model

    def release_memory(self) -> None:
        """Frees the KV pool (e.g. before the training step); the next generate allocates it again."""
        self.engine.release_memory()

    def sample(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
               seed: int) -> list[SampleResult]:
        """Like generate, with policy log-probs and prompt lengths; statistics land in `last_stats`."""
        results, stats = self.engine.generate(params_of(self.model), prompts, max_new_tokens, seed,
                                              stop_check=self._stop_check)
        self.last_stats = stats
        return results

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                 seed: int) -> list[Generation]:
        return [_generation(r) for r in self.sample(prompts, max_new_tokens, seed)]

    def stream(self) -> "PolicyStreamOfSampler":
        """kevin_jax.env.policy.PolicyStream over one SamplerStream of the current model: requests join one
        continuous decode batch; each one's tokens are those `generate` draws for its prompts and seed."""
        stream = PolicyStreamOfSampler(self.engine.stream(params_of(self.model), stop_check=self._stop_check))
        self.last_stats = stream.stats
        return stream


class PolicyStreamOfSampler:
    """A SamplerStream as the environment drives it (kevin_jax.env.policy.PolicyStream)."""
    continuous = True

    def __init__(self, stream: SamplerStream):
        self.stream = stream

    @property
    def stats(self) -> GenerateStats:
        return self.stream.stats

    def add(self, prompts, max_new_tokens, seed, owner: Any) -> None:
        self.stream.add(prompts, max_new_tokens, seed, owner)

    @property
    def busy(self) -> bool:
        return self.stream.busy

    @property
    def live(self) -> int:
        return self.stream.live

    def advance(self) -> list[tuple[Any, list[Generation]]]:
        return [(r.owner, [_generation(x) for x in r.results()]) for r in self.stream.step()]

    def close(self) -> None:
        self.stream.close()


def _generation(r: SampleResult) -> Generation:
    return Generation(tokens=r.tokens, logprobs=r.logprobs, stop_reason=r.stop_reason)
