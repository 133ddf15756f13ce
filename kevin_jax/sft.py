"""Supervised fine-tuning of the policy on (prompt, response) examples: the trainer's warm start and launch/sft.py.

Examples come from JSONL files, one JSON object per line, in one of three forms:
- corpus records (kevin_jax/data/warm_start_corpus.jsonl, written by scripts/make_warm_start_corpus.py):
  {"task_id": "L1/1_LeakyReLU", "attempts": [{"code", "summary", "feedback"}, ...], "response": "...",
   "quality": "correct" | "wrong" | "compile_error", ...}. The prompt is the environment's own: the first-turn prompt
  of the task (no attempts) or its refinement prompt with those attempts (env.prompts.PromptRenderer), so the
  policy learns exactly the multi-turn format RL shows it;
- {"prompt": "<user message>", "response": "..."}: the prompt rendered as one user turn with the chat template;
- {"messages": [{"role": ..., "content": ...}, ..., {"role": "assistant", "content": "<response>"}]}: the
  conversation before the last (assistant) message is the prompt, rendered with the chat template.
The response is the text the model writes after the generation prompt (for QwQ's template: inside the opened
<think>, so "thought </think> answer"), followed by the end-of-turn token. The loss is the mean negative
log-likelihood of the response tokens (prompt tokens masked: rl.batch puts the loss only on response targets),
averaged over the step's examples, optimised with Adam (clipped, warm-up then cosine decay, as the warm_start
section says: `learning_rate_schedule` and the RL update's own kevin_jax.rl.state.optimizer).

The warm start (config section `warm_start`) is this fine-tuning before RL, so that the small configs' randomly
initialised policies write real kernels from step 1 and every part of the loop (compile, run, time, reward, update)
does real work. Its examples come from one of two sources:
- corpus="" : the built-in correct reference solutions (kevin_jax/tasks/builtin_solutions), each as the answer to
  its task's first-turn prompt (or to every training task's prompt, answer_every_prompt): one answer format only;
- corpus="builtin" or a JSONL path: the data above (the shipped warm-start corpus has, per built-in task, correct,
  wrong and failing-to-compile first answers and refinement turns after compile-error and wrong-output feedback), so
  the warm policy samples a mix of good and bad kernels and knows the multi-turn format. Records of tasks outside
  the training split are left out (no held-out task is trained on).
It runs only on a fresh run, before step 1 (kevin_jax.policy_init.starting_params); its result is what the first
checkpoint builds on, so resuming never repeats it. launch/sft.py runs it standalone
(kevin_jax.policy_init.run_sft) and writes an HF checkpoint directory that train.py starts from with
--config.model.shape= --config.model.hf_checkpoint=<workdir> --config.warm_start.steps=0.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kevin_jax import logs, parallel
from kevin_jax.multihost import to_host
from kevin_jax.env.prompts import Attempt, PromptRenderer, PromptTooLongError
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl.loss import RLConfig
from kevin_jax.rl.state import Updater, init_state, optimizer
from kevin_jax.run_config import WarmStartConfig
from kevin_jax.tasks import Task, builtin_solutions

log = logging.getLogger(__name__)

BUILTIN_CORPUS = Path(__file__).resolve().parent / "data" / "warm_start_corpus.jsonl"
QUALITIES = ("correct", "wrong", "compile_error")
THOUGHT = "Okay, I will replace the operators with a custom CUDA kernel that computes the same result."
ROLES = ("system", "user", "assistant")


class SFTDataError(ValueError):
    """A bad SFT data file: the message names the file and, where it applies, the line."""


def answer_text(code: str, summary: str = "a custom CUDA kernel replaces the PyTorch operators.") -> str:
    """A QwQ-style answer (written after the template's opening <think>): thought, code block, summary."""
    return f"{THOUGHT}\n</think>\n\n```python\n{code.strip()}\n```\n\nSummary: {summary}"


# ---------------------------------------------------------------------------------------------------- data
@dataclasses.dataclass(frozen=True)
class Example:
    """One supervised example; exactly one of task_id, prompt and messages says what the prompt is."""
    response: str
    task_id: str | None = None
    attempts: tuple[Attempt, ...] = ()
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] = ()     # (role, content) before the response
    quality: str = ""
    kind: str = ""                                 # "first_turn" | "refinement" for corpus records
    where: str = ""                                # "file:line", for error messages

    @property
    def label(self) -> str:
        return f"{self.kind or 'example'}/{self.quality or 'unlabelled'}"


def resolve_path(path: str | os.PathLike) -> Path:
    """"builtin" = the shipped warm-start corpus; anything else is a file path."""
    return BUILTIN_CORPUS if str(path) == "builtin" else Path(path).expanduser()


def _text(obj: Mapping, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise SFTDataError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    return value


def _example(obj: Any, where: str) -> Example:
    if not isinstance(obj, dict):
        raise SFTDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    forms = [k for k in ("task_id", "prompt", "messages") if k in obj]
    if len(forms) != 1:
        raise SFTDataError(f"{where}: a record needs exactly one of 'task_id' (corpus record), 'prompt' (with "
                           f"'response') or 'messages' (chat, the last one the assistant's); found {forms or 'none'}")
    quality, kind = obj.get("quality", ""), obj.get("kind", "")
    if quality and quality not in QUALITIES:
        raise SFTDataError(f"{where}: unknown quality {quality!r}; known: {QUALITIES}")
    if forms == ["messages"]:
        messages = obj["messages"]
        if not isinstance(messages, list) or len(messages) < 2:
            raise SFTDataError(f"{where}: 'messages' must be a list of at least two messages (a prompt and the "
                               f"assistant's response)")
        pairs = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise SFTDataError(f"{where}: messages[{i}] must be {{'role': one of {ROLES}, 'content': str}}")
            pairs.append((m["role"], m["content"]))
        if pairs[-1][0] != "assistant":
            raise SFTDataError(f"{where}: the last message must be the assistant's (the response to learn)")
        if "response" in obj:
            raise SFTDataError(f"{where}: give the response as the last message, not also as 'response'")
        return Example(pairs[-1][1], messages=tuple(pairs[:-1]), quality=quality, kind=kind, where=where)
    response = _text(obj, "response", where)
    if not response.strip():
        raise SFTDataError(f"{where}: empty 'response'")
    if forms == ["prompt"]:
        return Example(response, prompt=_text(obj, "prompt", where), quality=quality, kind=kind, where=where)
    attempts = obj.get("attempts", [])
    if not isinstance(attempts, list):
        raise SFTDataError(f"{where}: 'attempts' must be a list")
    parsed = []
    for i, a in enumerate(attempts):
        if not isinstance(a, dict) or set(a) != {"code", "summary", "feedback"}:
            raise SFTDataError(f"{where}: attempts[{i}] must be {{'code', 'summary', 'feedback'}}")
        if a["code"] is not None and not isinstance(a["code"], str):
            raise SFTDataError(f"{where}: attempts[{i}].code must be a string or null")
        parsed.append(Attempt(a["code"], _text(a, "summary", f"{where}: attempts[{i}]"),
                              _text(a, "feedback", f"{where}: attempts[{i}]")))
    return Example(response, task_id=_text(obj, "task_id", where), attempts=tuple(parsed), quality=quality,
                   kind=kind or ("refinement" if parsed else "first_turn"), where=where)


def read_jsonl(path: str | os.PathLike) -> list[Example]:
    """Every example of a JSONL file ("builtin" = the shipped corpus); blank lines are skipped. Raises
    SFTDataError naming the file (missing, a directory, empty) or the line (bad JSON, bad record)."""
    file = resolve_path(path)
    if not file.exists():
        raise SFTDataError(f"SFT data file {file} does not exist")
    if not file.is_file():
        raise SFTDataError(f"SFT data path {file} is not a file")
    out = []
    with open(file, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{file}:{number}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SFTDataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            out.append(_example(obj, where))
    if not out:
        raise SFTDataError(f"SFT data file {file} has no examples (it is empty)")
    return out


# ---------------------------------------------------------------------------------------------------- rendering
def prompt_tokens(example: Example, renderer: PromptRenderer, task_sources: Mapping[str, str]) -> list[int]:
    """The prompt of an example rendered exactly as the environment renders prompts (same renderer, template)."""
    if example.task_id is not None:
        source = task_sources[example.task_id]
        if example.attempts:
            rendered = renderer.refinement(source, example.attempts)
            if rendered.attempts_dropped:
                log.info("%s: %d earlier attempt(s) dropped to fit max_prompt_tokens=%d, as the environment "
                         "would", example.where, rendered.attempts_dropped, renderer.max_prompt_tokens)
            return rendered.token_ids
        return renderer.first_turn(source).token_ids
    if example.prompt is not None:
        ids = renderer.encode(renderer.render_text(example.prompt))
    else:
        messages = [{"role": r, "content": c} for r, c in example.messages]
        if renderer.has_chat_template:
            text = renderer.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:   # the renderer's plain fallback format, one block per message
            text = "".join(f"{r.capitalize()}:\n{c}\n\n" for r, c in example.messages) + "Assistant:\n"
        ids = renderer.encode(text)
    if len(ids) > renderer.max_prompt_tokens:
        raise PromptTooLongError(f"the prompt has {len(ids)} tokens, over max_prompt_tokens="
                                 f"{renderer.max_prompt_tokens}")
    return ids


def to_samples(examples: Sequence[Example], renderer: PromptRenderer, end_token: int,
               task_sources: Mapping[str, str], max_response_tokens: int | None = None) -> list[rl_batch.Sample]:
    """Update samples: prompt tokens, response tokens + end token, each response token weighted 1/len(response)
    (so that the summed loss is the example's mean response NLL). Corpus records need their task in
    `task_sources` (the caller drops records of held-out tasks first). An example whose prompt cannot fit
    max_prompt_tokens (even with its earliest attempts dropped, as the environment drops them) or whose response
    is over `max_response_tokens` is one the run would never see: it is left out with a warning naming it; none
    left is an error."""
    out, skipped = [], []
    for ex in examples:
        if ex.task_id is not None and ex.task_id not in task_sources:
            raise SFTDataError(f"{ex.where}: task {ex.task_id!r} is not among the {len(task_sources)} tasks given")
        try:
            prompt = prompt_tokens(ex, renderer, task_sources)
        except PromptTooLongError as e:
            skipped.append(f"{ex.where}: {e}")
            continue
        response = renderer.encode(ex.response) + [end_token]
        if max_response_tokens is not None and len(response) > max_response_tokens:
            skipped.append(f"{ex.where}: the response has {len(response)} tokens, over {max_response_tokens} "
                           f"(env.max_response_tokens)")
            continue
        out.append(rl_batch.Sample(prompt, response, [0.0] * len(response), 1.0, 1.0 / len(response)))
    if skipped:
        log.warning("SFT: %d of %d examples do not fit the run's token limits and are left out, e.g.\n  %s",
                    len(skipped), len(examples), "\n  ".join(skipped[:3]))
    if not out:
        raise SFTDataError(f"none of the {len(examples)} examples fits the run's token limits:\n  "
                           + "\n  ".join(skipped[:5]))
    return out


# ---------------------------------------------------------------------------------------------------- training
def response_nll_fn(graphdef, mesh, rl: RLConfig):
    """loss(params, micro_batch) = -sum over response targets of weight * log p (prompt and padding masked).
    Unpacked rows (rl.pack=False) are one sequence then padding, as in the RL update: promised to the model so that
    it uses cuDNN flash attention on GPU. Without the promise it fell back to blockwise pure-JAX attention beyond
    4096 tokens: warm-start steps at 0.3-0.6% MFU and a 17 GiB buffer (docs/LOG.md, "the warm start ran without flash
    attention")."""
    def loss_fn(params, mb):
        with parallel.activation_sharding(mesh):
            logp = nnx.merge(graphdef, params).token_logprobs(mb["tokens"], mb["positions"], mb["segment_ids"],
                                                              mb["targets"], chunk_size=rl.logprob_chunk,
                                                              right_padded=not rl.pack)
        return -jnp.sum(jnp.where(mb["loss_mask"], mb["loss_weights"] * logp, 0.0))
    return loss_fn


def _nll_loss(graphdef, mesh, rl: RLConfig):
    """response_nll_fn as the updater's loss: (loss, {"loss": loss})."""
    nll = response_nll_fn(graphdef, mesh, rl)

    def loss(params, mb, first):
        value = nll(params, mb)
        return value, {"loss": value}
    return loss


def learning_rate_schedule(config: WarmStartConfig) -> optax.Schedule:
    """A linear warm-up over warmup_fraction of the steps (at least one, at most max_warmup_steps), then a cosine
    decay to final_learning_rate_fraction of the peak (WarmStartConfig says why)."""
    warmup = max(1, min(config.max_warmup_steps, int(config.warmup_fraction * config.steps)))
    return optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, warmup, max(config.steps, warmup + 1),
                                              end_value=config.learning_rate * config.final_learning_rate_fraction)


def batch_order(lengths: Sequence[int], batch_size: int, steps: int, seed: int,
                length_buckets: int = 0) -> list[list[int]]:
    """The example indices of each of `steps` batches, seeded.

    length_buckets=0: each step an independent random choice of `batch_size` examples.
    length_buckets=K > 0: epochs of the shuffled examples; each run of K x batch_size of them is sorted by length and
    cut into batches (an incomplete batch is dropped: its examples come in the next epoch's order), and an epoch's
    batches are shuffled. Examples of similar length share a batch, so the rows of a micro-batch, right-padded to the
    next power of two of its longest, carry less padding (docs/LOG.md, "length-bucketed warm-start batches"). With
    fewer than two batches' worth of examples there is nothing to bucket: random batches."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5F7]))
    n, per_step = len(lengths), min(len(lengths), batch_size)
    if length_buckets <= 0 or n < per_step * 2:
        return [sorted(rng.choice(n, per_step, replace=False).tolist()) for _ in range(steps)]
    order: list[list[int]] = []
    while len(order) < steps:
        perm, epoch = rng.permutation(n), []
        for start in range(0, n, per_step * length_buckets):
            run = sorted(perm[start:start + per_step * length_buckets].tolist(), key=lambda j: (lengths[j], j))
            epoch += [sorted(run[k:k + per_step]) for k in range(0, len(run) - per_step + 1, per_step)]
        order += [epoch[i] for i in rng.permutation(len(epoch))]
    return order[:steps]


def fine_tune(graphdef, params, samples: Sequence[rl_batch.Sample], mesh, rl: RLConfig, config: WarmStartConfig,
              seed: int, log_prefix: str = "sft") -> tuple[Any, dict]:
    """Adam on the mean response NLL for config.steps steps (config: the optimiser and its schedule, the batches);
    every step uses a seeded batch of config.batch_size samples (batch_order: random, or length-bucketed with
    config.length_buckets), packed into micro-batches with the RL update's layout
    (rl.micro_batch_tokens, rl.pack, rl.row_len) and accumulated by the RL update's Updater (kevin_jax.rl.state) with
    this loss.
    Each log line also gives the seconds per step since the previous line, real tokens per second, the share of
    padded tokens, the share of wall time spent on the host building batches, and MFU (model FLOPs of the real
    tokens; n/a on CPU), so that a slow warm start shows where its time goes.
    Returns (params, {prefix/first_nll, prefix/last_nll, prefix/examples, and the last interval's
    prefix/seconds_per_step, tokens_per_second, padding_fraction, host_fraction, mfu (where the peak is known)})."""
    if not samples:
        raise ValueError("fine_tune: no samples")
    steps, schedule = config.steps, learning_rate_schedule(config)
    tx = optimizer(schedule, grad_clip_norm=config.grad_clip_norm)
    # donate_state=False: the caller's parameters stay valid (the first step would otherwise consume them)
    updater = Updater(graphdef, tx, schedule, rl, mesh,
                      loss=_nll_loss(graphdef, mesh, rl), donate_state=False)
    state = init_state(params, tx)
    divisor = mesh.shape["data"] * mesh.shape["fsdp"]
    batches = batch_order([len(s) for s in samples], config.batch_size, steps, seed, config.length_buckets)
    flops = logs.FlopModel.of(nnx.merge(graphdef, params).config)
    peak = logs.peak_flops(jax.devices()[0].device_kind)

    first = last = float("nan")
    speed: dict[str, float] = {}
    since, steps_since, real, padded, host_s, model_flops = time.perf_counter(), 0, 0, 0, 0.0, 0.0
    for i in range(steps):
        t_host = time.perf_counter()
        chosen = [samples[j] for j in batches[i]]
        mbs, layout = rl_batch.micro_batches(chosen, rl, divisor)
        device_mbs = [updater.device_batch(mb) for mb in mbs]
        host_s += time.perf_counter() - t_host
        lengths = [len(s) for s in chosen]
        real, padded = real + sum(lengths), padded + layout.padded_tokens
        model_flops += flops.train(lengths)
        grads, parts = updater.accumulate(state["params"], device_mbs)
        total_loss = sum(part["loss"] for part in parts)
        # the mean over the step's examples of each example's mean response-token NLL
        state, _ = updater.apply(state, grads, scale=1.0 / len(chosen))
        steps_since += 1
        if i == 0 or i == steps - 1 or (i + 1) % max(1, steps // 5) == 0:
            last = float(to_host(total_loss)) / len(chosen)      # waits for the step: the interval's time is real
            first = last if i == 0 else first
            elapsed = time.perf_counter() - since
            speed = {"seconds_per_step": elapsed / steps_since, "tokens_per_second": real / elapsed,
                     "padding_fraction": 1.0 - real / padded, "host_fraction": host_s / elapsed,
                     "mfu": logs.mfu(model_flops, elapsed, mesh.devices.size, peak)}
            log.info("%s step %d/%d: answer NLL %.4f, %.2f s/step%s, %.0f tokens/s, %.0f%% padding, %.0f%% host, "
                     "MFU %s", log_prefix, i + 1, steps, last, speed["seconds_per_step"],
                     " (with compiles)" if i == 0 else "", speed["tokens_per_second"],
                     100 * speed["padding_fraction"], 100 * speed["host_fraction"],
                     f"{speed['mfu']:.1%}" if np.isfinite(speed["mfu"]) else "n/a (CPU)")
            since, steps_since, real, padded, host_s, model_flops = time.perf_counter(), 0, 0, 0, 0.0, 0.0
    return state["params"], {f"{log_prefix}/first_nll": first, f"{log_prefix}/last_nll": last,
                             f"{log_prefix}/examples": float(len(samples)),
                             **{f"{log_prefix}/{k}": v for k, v in speed.items() if np.isfinite(v)}}  # no MFU on CPU


# ---------------------------------------------------------------------------------------------------- warm start
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


def corpus_examples(config: WarmStartConfig, by_id: dict, wanted: list[str]) -> list[Example]:
    """The corpus' examples for these training tasks (records of other tasks dropped, with a log line)."""
    examples = read_jsonl(config.corpus)
    def usable(e: Example) -> bool:
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


def warm_start_examples(config: WarmStartConfig, train_tasks: Sequence[Task], renderer: PromptRenderer,
                        end_token: int, max_response_tokens: int | None = None) -> list[rl_batch.Sample]:
    """The update samples of the warm start on these training tasks (see the module docstring for the sources)."""
    by_id = {t.task_id: t for t in train_tasks}
    wanted = _wanted_tasks(config, by_id)
    if not config.corpus:
        return _builtin_solution_examples(config, by_id, wanted, renderer, end_token)
    return to_samples(corpus_examples(config, by_id, wanted), renderer, end_token,
                      {t: task.source for t, task in by_id.items()}, max_response_tokens)


def warm_start(graphdef, params, config: WarmStartConfig, samples: Sequence[rl_batch.Sample], mesh,
               rl: RLConfig, seed: int) -> tuple[Any, dict]:
    """Adam on the mean answer NLL (fine_tune); scalars warm_start/{first,last}_nll, examples and the speed
    report."""
    return fine_tune(graphdef, params, samples, mesh, rl, config, seed, log_prefix="warm_start")
