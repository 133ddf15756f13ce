"""Optional supervised warm start before RL: teach a randomly initialised policy the answer format on the built-in
reference solutions (kevin_jax/tasks/builtin_solutions), so that the small configs' policies write real kernels from
step 1 and every part of the loop (compile, run, time, reward, update) does real work.

Each example is a task's first-turn prompt (the environment's own renderer) followed by a QwQ-style answer: a short
thought starting with "Okay", the solution in a ```python block, and a summary, ended by the end-of-turn token. The
loss is the mean negative log-likelihood of the answer tokens (prompt masked), optimised with Adam. It runs only on a
fresh run, before step 1; its result is what the first checkpoint builds on, so resuming never repeats it.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kevin_jax import parallel
from kevin_jax.env.prompts import PromptRenderer
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl.loss import RLConfig
from kevin_jax.rl.state import put_global, to_host
from kevin_jax.tasks import Task, builtin_solutions

log = logging.getLogger(__name__)

THOUGHT = "Okay, I will replace the operators with a custom CUDA kernel that computes the same result."


@dataclasses.dataclass
class WarmStartConfig:
    """Supervised warm start (config section `warm_start`).

    steps: Adam steps on the examples (0 = no warm start).
    learning_rate: Adam learning rate.
    batch_size: examples per step (a seeded random choice each step).
    solution_tasks: comma-separated task ids whose correct built-in solutions are used; "" = every training task
      that has one.
    answer_every_prompt: pair the chosen solutions with the first-turn prompt of EVERY training task (for tiny models
      that cannot tell prompts apart anyway: they learn one answer); False = each solution with its own task.
    """
    steps: int = 0
    learning_rate: float = 1e-3
    batch_size: int = 8
    solution_tasks: str = ""
    answer_every_prompt: bool = False

    def __post_init__(self):
        if self.steps < 0 or self.learning_rate <= 0 or self.batch_size <= 0:
            raise ValueError("warm_start.steps must be >= 0, warm_start.learning_rate and batch_size positive")


def answer_text(code: str, summary: str = "a custom CUDA kernel replaces the PyTorch operators.") -> str:
    return f"{THOUGHT}\n</think>\n\n```python\n{code.strip()}\n```\n\nSummary: {summary}"


def examples(config: WarmStartConfig, train_tasks: Sequence[Task], renderer: PromptRenderer,
             end_token: int) -> list[rl_batch.Sample]:
    by_id = {t.task_id: t for t in train_tasks}
    wanted = [s.strip() for s in config.solution_tasks.split(",") if s.strip()]
    unknown = [t for t in wanted if t not in by_id]
    if unknown:
        raise ValueError(f"warm_start.solution_tasks names task(s) not in the training split: {unknown}")
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


def warm_start(graphdef, params, config: WarmStartConfig, samples: Sequence[rl_batch.Sample], mesh,
               rl: RLConfig, seed: int) -> tuple[Any, dict]:
    """Adam on the mean answer NLL; every step uses a seeded random batch of the examples."""
    tx = optax.adam(config.learning_rate)
    opt_state = jax.jit(tx.init)(params)
    batch_sharding = parallel.batch_sharding(mesh, 2)
    divisor = mesh.shape["data"] * mesh.shape["fsdp"]
    per_step = min(len(samples), config.batch_size)

    def loss_fn(p, mb):
        with parallel.activation_sharding(mesh):
            logp = nnx.merge(graphdef, p).token_logprobs(mb["tokens"], mb["positions"], mb["segment_ids"],
                                                         mb["targets"], chunk_size=rl.logprob_chunk)
        return -jnp.sum(jnp.where(mb["loss_mask"], mb["loss_weights"] * logp, 0.0))

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))

    @jax.jit
    def apply_fn(p, o, grads, scale):
        updates, o = tx.update(jax.tree.map(lambda g: g * scale, grads), o, p)
        return optax.apply_updates(p, updates), o

    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5F7]))
    first = last = float("nan")
    for i in range(config.steps):
        chosen = [samples[j] for j in sorted(rng.choice(len(samples), per_step, replace=False))]
        mbs, _ = rl_batch.micro_batches(chosen, rl, divisor)
        total_loss, grads = 0.0, None
        for mb in mbs:
            loss, g = grad_fn(params, {k: put_global(v, batch_sharding) for k, v in mb.items()})
            grads = g if grads is None else add(grads, g)
            total_loss = total_loss + loss
        # the mean over the step's examples of each example's mean answer-token NLL
        params, opt_state = apply_fn(params, opt_state, grads, jnp.float32(1.0 / len(chosen)))
        if i == 0 or i == config.steps - 1 or (i + 1) % max(1, config.steps // 5) == 0:
            last = float(to_host(total_loss)) / len(chosen)
            first = last if i == 0 else first
            log.info("warm start step %d/%d: answer NLL %.4f", i + 1, config.steps, last)
    return params, {"warm_start/first_nll": first, "warm_start/last_nll": last,
                    "warm_start/examples": float(len(samples))}
