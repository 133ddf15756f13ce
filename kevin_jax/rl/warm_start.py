"""Optional supervised warm start before RL (config section `warm_start`), so that the small configs' randomly
initialised policies write real kernels from step 1 and every part of the loop (compile, run, time, reward, update)
does real work.

Two sources of examples:
- corpus="" : the built-in correct reference solutions (kevin_jax/tasks/builtin_solutions), each as the answer to
  its task's first-turn prompt (or to every training task's prompt, answer_every_prompt): one answer format only;
- corpus="builtin" or a JSONL path: kevin_jax.sft's data (the shipped warm-start corpus has, per built-in task,
  correct, wrong and failing-to-compile first answers and refinement turns after compile-error and wrong-output
  feedback), so the warm policy samples a mix of good and bad kernels and knows the multi-turn format. Records of
  tasks outside the training split are left out (no held-out task is trained on).
Every prompt is the environment's own (env.prompts.PromptRenderer); the loss and loop are kevin_jax.sft.fine_tune.
It runs only on a fresh run, before step 1; its result is what the first checkpoint builds on, so resuming never
repeats it. launch/sft.py runs the same thing standalone and writes an HF checkpoint that train.py can start from.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Sequence

from kevin_jax import sft
from kevin_jax.env.prompts import PromptRenderer
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl.loss import RLConfig
from kevin_jax.sft import THOUGHT, answer_text  # noqa: F401  (re-exported: the answer format of the warm start)
from kevin_jax.tasks import Task, builtin_solutions

log = logging.getLogger(__name__)


@dataclasses.dataclass
class WarmStartConfig:
    """Supervised warm start (config section `warm_start`).

    steps: Adam steps on the examples (0 = no warm start).
    learning_rate: Adam learning rate.
    batch_size: examples per step (a seeded random choice each step).
    corpus: "" = the built-in correct solutions, first turn only; "builtin" = the shipped warm-start corpus
      (kevin_jax/data/warm_start_corpus.jsonl: correct, wrong and non-compiling answers, refinement turns); or the
      path of a JSONL file in any form kevin_jax.sft reads.
    solution_tasks: comma-separated task ids whose examples are used; "" = every training task that has one.
    answer_every_prompt: pair the chosen solutions with the first-turn prompt of EVERY training task (for tiny models
      that cannot tell prompts apart anyway: they learn one answer); False = each solution with its own task.
      Only with corpus="".
    """
    steps: int = 0
    learning_rate: float = 1e-3
    batch_size: int = 8
    corpus: str = ""
    solution_tasks: str = ""
    answer_every_prompt: bool = False

    def __post_init__(self):
        if self.steps < 0 or self.learning_rate <= 0 or self.batch_size <= 0:
            raise ValueError("warm_start.steps must be >= 0, warm_start.learning_rate and batch_size positive")
        if self.corpus and self.answer_every_prompt:
            raise ValueError("warm_start.answer_every_prompt applies to the built-in solutions only (corpus=\"\"); "
                             f"got corpus={self.corpus!r}")


def _wanted_tasks(config: WarmStartConfig, by_id: dict) -> list[str]:
    wanted = [s.strip() for s in config.solution_tasks.split(",") if s.strip()]
    unknown = [t for t in wanted if t not in by_id]
    if unknown:
        raise ValueError(f"warm_start.solution_tasks names task(s) not in the training split: {unknown}")
    return wanted


def _builtin_solution_examples(config: WarmStartConfig, by_id: dict, wanted: list[str], renderer: PromptRenderer,
                               end_token: int) -> list[rl_batch.Sample]:
    solutions = [s for s in builtin_solutions() if s.expected_correct and s.task_id in by_id
                 and (not wanted or s.task_id in wanted)]
    if not solutions:
        raise ValueError("warm_start: no built-in correct solution for the chosen training tasks")
    out = []
    for sol in solutions:
        prompts = list(by_id.values()) if config.answer_every_prompt else [by_id[sol.task_id]]
        answer = renderer.encode(answer_text(sol.source)) + [end_token]
        for task in prompts:
            prompt = renderer.first_turn(task.source).token_ids
            out.append(rl_batch.Sample(prompt, answer, [0.0] * len(answer), 1.0, 1.0 / len(answer)))
    return out


def corpus_examples(config: WarmStartConfig, by_id: dict, wanted: list[str]) -> list[sft.Example]:
    """The corpus' examples for these training tasks (records of other tasks dropped, with a log line)."""
    examples = sft.read_jsonl(config.corpus)
    def usable(e: sft.Example) -> bool:
        return e.task_id is None or (e.task_id in by_id and (not wanted or e.task_id in wanted))

    kept = [e for e in examples if usable(e)]
    dropped = collections.Counter(e.task_id for e in examples if not usable(e))
    if dropped:
        log.info("warm start: %d corpus record(s) of %d task(s) outside the training split / solution_tasks left "
                 "out: %s", sum(dropped.values()), len(dropped), sorted(dropped))
    if not kept:
        raise ValueError(f"warm_start: no example of corpus {config.corpus!r} is for a training task")
    counts = collections.Counter(e.label for e in kept)
    log.info("warm start corpus %s: %d examples (%s)", config.corpus, len(kept),
             ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return kept


def examples(config: WarmStartConfig, train_tasks: Sequence[Task], renderer: PromptRenderer,
             end_token: int, max_response_tokens: int | None = None) -> list[rl_batch.Sample]:
    by_id = {t.task_id: t for t in train_tasks}
    wanted = _wanted_tasks(config, by_id)
    if not config.corpus:
        return _builtin_solution_examples(config, by_id, wanted, renderer, end_token)
    return sft.to_samples(corpus_examples(config, by_id, wanted), renderer, end_token,
                          {t: task.source for t, task in by_id.items()}, max_response_tokens)


def warm_start(graphdef, params, config: WarmStartConfig, samples: Sequence[rl_batch.Sample], mesh,
               rl: RLConfig, seed: int) -> tuple[Any, dict]:
    """Adam on the mean answer NLL (kevin_jax.sft.fine_tune); scalars warm_start/{first,last}_nll, examples and
    the speed report."""
    return sft.fine_tune(graphdef, params, samples, mesh, rl, steps=config.steps, learning_rate=config.learning_rate,
                         batch_size=config.batch_size, seed=seed, log_prefix="warm_start")
