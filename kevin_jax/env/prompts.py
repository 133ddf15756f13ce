"""What the model is told: the first-turn prompt, the refinement prompts, and their rendering into token ids.

Following Kevin and KernelBench:
- First turn: the task (replace PyTorch operators by raw CUDA kernels via load_inline, class ModelNew, torch.nn only
  for parameters/containers/init, full code and no tests, the answer is evaluated, end with a short summary), the target
  GPU, a one-shot example (our element-wise add, env/one_shot.py) and the reference source.
- Refinement turns: the same base prompt without the example, then every previous attempt in order, each as its
  kernel code, the model's own summary and one feedback branch (EvalResult.feedback: format / compile / runtime /
  correctness error, or correct with its speedup), then the instruction to reason again and write complete new code.
  Chains of thought are never carried: an `Attempt` only holds code, summary and feedback.

Each turn is one user message rendered with the tokenizer's chat template (QwQ/Qwen2 ChatML; its generation prompt
opens a <think> block), or a plain "User:/Assistant:" fallback for tokenizers without one. Budgeting counts the real
tokens of the rendered prompt: when it is over `max_prompt_tokens`, the earliest attempts are dropped first.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from kevin_jax.env import one_shot

NO_CODE = "(no code block was found in this answer)"
NO_SUMMARY = "(no summary)"

_STATEMENT = """\
You write custom CUDA kernels to replace the PyTorch operators in a given architecture and make it faster on an \
{gpu_name} GPU.

You may replace any subset of the operators: fuse several of them into one kernel (for example a matmul and its \
activation), change the algorithm (for example an online softmax), and use shared memory, warp-level primitives, \
vectorized memory access or any other technique you know.

Rules:
- Write raw CUDA kernels (__global__ functions) and compile them from the Python file with \
torch.utils.cpp_extension.load_inline.
- Name the optimized architecture ModelNew. It takes the same constructor arguments and forward inputs as Model and \
returns the same outputs.
- In ModelNew, torch.nn may only be used for parameters (nn.Parameter), containers and initialisation; the \
computation itself must be done by your kernels.
- Inputs and outputs are CUDA tensors.
- Output the complete Python file in a single ```python code block: real code, not pseudocode, with no testing code \
and no example usage.

Your code will be compiled, checked for correctness against Model on random inputs and timed; you will see the result \
and get the chance to improve it, so make sure a correct version works first. After the code block, end your answer \
with a short summary of your changes, starting with "Summary:".
"""

_EXAMPLE = """
Here is an example. The given architecture:
```python
{model}```
An optimized version with a custom CUDA kernel:
```python
{model_new}```
Summary: {summary}
"""

_TASK = """
You are given the following architecture:
```python
{source}
```
"""

_FIRST_INSTRUCTION = """
Optimize the architecture named Model with custom CUDA operators. Reason about it first, then write the complete \
ModelNew code followed by a short "Summary:" of your changes."""

_HISTORY_HEADER = """
Here are your previous attempts at this task, oldest first, each with the summary you wrote and the result of its \
evaluation:
"""

_ATTEMPT = """
Attempt {index}:
```python
{code}
```
Summary: {summary}
Evaluation: {feedback}
"""

_REFINE_INSTRUCTION = """
Reason again, using the evaluation results: fix what failed, or make the correct kernel faster. Then write the \
complete new ModelNew code (the whole file, not a diff) in a single ```python block, followed by a short "Summary:" \
of your changes."""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One earlier turn as the next prompt shows it: never the chain of thought."""
    code: str | None      # the extracted program; None when the answer had none
    summary: str          # the model's own summary ("" if it wrote none)
    feedback: str         # EvalResult.feedback


def base_prompt(task_source: str, gpu_name: str) -> str:
    return _STATEMENT.format(gpu_name=gpu_name) + _TASK.format(source=task_source.strip("\n"))


def first_turn_text(task_source: str, gpu_name: str, one_shot_example: bool = True) -> str:
    text = _STATEMENT.format(gpu_name=gpu_name)
    if one_shot_example:
        text += _EXAMPLE.format(model=one_shot.EXAMPLE_MODEL, model_new=one_shot.EXAMPLE_MODEL_NEW,
                                summary=one_shot.EXAMPLE_SUMMARY)
    return text + _TASK.format(source=task_source.strip("\n")) + _FIRST_INSTRUCTION


def refinement_text(task_source: str, gpu_name: str, attempts: Sequence[Attempt], first_index: int = 1) -> str:
    """`first_index` numbers the attempts shown (it is > 1 when earlier ones were dropped for the budget)."""
    if not attempts:
        raise ValueError("a refinement prompt needs at least one previous attempt")
    text = base_prompt(task_source, gpu_name) + _HISTORY_HEADER
    for i, a in enumerate(attempts):
        text += _ATTEMPT.format(index=first_index + i, code=(a.code or NO_CODE).strip("\n"),
                                summary=a.summary.strip() or NO_SUMMARY, feedback=a.feedback.strip())
    return text + _REFINE_INSTRUCTION


class PromptTooLongError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class RenderedPrompt:
    text: str
    token_ids: list[int]
    attempts_shown: int
    attempts_dropped: int


def hf_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer behind `tokenizer`: kevin_jax.model.tokenizer.Tokenizer wraps one in `.hf`."""
    return getattr(tokenizer, "hf", tokenizer)


class PromptRenderer:
    """Renders prompt texts with a tokenizer (a transformers tokenizer, or kevin_jax's wrapper of one: chat template
    when it has one) and enforces the token budget."""

    def __init__(self, tokenizer: Any, max_prompt_tokens: int, gpu_name: str, one_shot_example: bool = True):
        if max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens must be positive, got {max_prompt_tokens}")
        tokenizer = hf_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.gpu_name = gpu_name
        self.one_shot_example = one_shot_example
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.generation_prefix = self._generation_prefix()
        # QwQ's template ends the generation prompt with "<think>\n": the response then starts inside the thought.
        self.opens_thought = self.generation_prefix.rfind("<think>") > self.generation_prefix.rfind("</think>")

    def render_text(self, content: str) -> str:
        if self.has_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                      add_generation_prompt=True, tokenize=False)
        return f"User:\n{content}\n\nAssistant:\n"

    def encode(self, text: str) -> list[int]:
        # The rendered text already holds every special token the template wants; add none.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def first_turn(self, task_source: str) -> RenderedPrompt:
        text = self.render_text(first_turn_text(task_source, self.gpu_name, self.one_shot_example))
        ids = self.encode(text)
        if len(ids) > self.max_prompt_tokens:
            raise PromptTooLongError(f"the first-turn prompt has {len(ids)} tokens, over max_prompt_tokens="
                                     f"{self.max_prompt_tokens}")
        return RenderedPrompt(text, ids, 0, 0)

    def refinement(self, task_source: str, attempts: Sequence[Attempt]) -> RenderedPrompt:
        """All attempts if they fit, else the latest ones that fit (earliest dropped first)."""
        sizes = []
        for dropped in range(len(attempts)):
            text = self.render_text(refinement_text(task_source, self.gpu_name, attempts[dropped:], dropped + 1))
            ids = self.encode(text)
            if len(ids) <= self.max_prompt_tokens:
                return RenderedPrompt(text, ids, len(attempts) - dropped, dropped)
            sizes.append(len(ids))
        raise PromptTooLongError(f"even the latest attempt alone gives a {sizes[-1] if sizes else 0}-token prompt, "
                                 f"over max_prompt_tokens={self.max_prompt_tokens}")

    def _generation_prefix(self) -> str:
        """The text the renderer appends after the user message to start the assistant's turn."""
        probe = "x"
        if not self.has_chat_template:
            return "Assistant:\n"
        with_prompt = self.render_text(probe)
        without = self.tokenizer.apply_chat_template([{"role": "user", "content": probe}],
                                                     add_generation_prompt=False, tokenize=False)
        return with_prompt[len(without):] if with_prompt.startswith(without) else with_prompt
