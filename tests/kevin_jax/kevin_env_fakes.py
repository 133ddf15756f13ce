"""Test fakes and helpers for the environment tests (tasks, prompts, parse, episode): the built-in tokenizer, a
scripted policy and an evaluator fake. Fakes live only in tests and say so in their names."""
from __future__ import annotations

import copy
import functools
import re
from typing import Callable, Sequence

from cuda_eval.api import EvalResult

from kevin_jax.env.policy import Generation


@functools.lru_cache(maxsize=None)
def chatml_tokenizer(with_template: bool = True):
    """The built-in tokenizer (kevin_jax.model.tokenizer: byte-level BPE, QwQ's special tokens and chat template,
    whose generation prompt opens <think>) as a transformers tokenizer; without its template on request."""
    from kevin_jax.model.tokenizer import load_tokenizer

    hf = load_tokenizer().hf
    if not with_template:
        hf = copy.deepcopy(hf)
        hf.chat_template = None
    return hf


def judge_by_marker(request) -> dict:
    """Verdict from markers in the answer: WRONG or "// BUG:" (the built-in wrong solutions) -> incorrect,
    COMPILE_ERROR -> fails to compile, HACK -> flagged, SPEEDUP=<x> -> that speedup; an answer without a ModelNew
    block is a format error."""
    response = request.response
    if "class ModelNew" not in response:
        return dict(format_ok=False, format_error="no code block", compiled=None, correct=None, speedup=None,
                    feedback="Format error: no code block.")
    if "COMPILE_ERROR" in response:
        return dict(compiled=False, correct=None, speedup=None, compile_log="error: expected ';'",
                    feedback="Compilation failed: error: expected ';'")
    if "WRONG" in response or "// BUG:" in response:
        return dict(correct=False, speedup=None, feedback="Output mismatch: max abs error 3.2 in trial 1.")
    match = re.search(r"SPEEDUP=([0-9.]+)", response)
    speedup = float(match.group(1)) if match else 1.0
    if "HACK" in response:
        return dict(correct=True, speedup=speedup, hack_flags=[{"code": "torch_op", "reason": "torch.matmul"}],
                    feedback="Rejected: calls torch.matmul in forward.")
    return dict(correct=True, speedup=speedup, feedback=f"Correct. Speedup {speedup:.2f}x over PyTorch eager.")


class EvaluatorFake:
    """Stands in for cuda_eval.api.Evaluator: `judge(request) -> dict of EvalResult fields` (defaults: a correct,
    well formed kernel at 1x). Records every batch."""

    def __init__(self, judge: Callable = judge_by_marker):
        self.judge = judge
        self.batches: list[list] = []

    def evaluate(self, requests: Sequence) -> list[EvalResult]:
        self.batches.append(list(requests))
        results = []
        for r in requests:
            fields = {"mode": "full", "format_ok": True, "compiled": True, "correct": True, "speedup": 1.0,
                      **self.judge(r)}
            results.append(EvalResult(request_id=r.request_id, task_id=r.task_id, **fields))
        return results


class ScriptedPolicyFake:
    """Replays recorded answers. `script(prompt_text, turn) -> response text`, where turn is the number of earlier
    attempts shown in the prompt (counted from its "Attempt N:" headers). Encodes the response (+ <|im_end|>),
    truncates at max_new_tokens (stop_reason "length"), and gives each token a fixed, distinct log-prob."""

    def __init__(self, tokenizer, script: Callable[[str, int], str]):
        self.tokenizer = tokenizer
        self.script = script
        self.calls: list[dict] = []

    def generate(self, prompts, max_new_tokens, seed):
        self.calls.append({"prompts": [list(p) for p in prompts], "max_new_tokens": max_new_tokens, "seed": seed})
        out = []
        for i, prompt in enumerate(prompts):
            text = self.tokenizer.decode(list(prompt), skip_special_tokens=False, clean_up_tokenization_spaces=False)
            turn = len(re.findall(r"^Attempt \d+:$", text, re.MULTILINE))
            limit = max_new_tokens if isinstance(max_new_tokens, int) else max_new_tokens[i]
            tokens = self.tokenizer(self.script(text, turn), add_special_tokens=False)["input_ids"]
            tokens.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
            stop = "eos"
            if len(tokens) > limit:
                tokens, stop = tokens[:limit], "length"
            out.append(Generation(tokens, [-0.001 * (k + 1) for k in range(len(tokens))], stop))
        return out


def scripted_answer(code: str, thought: str = "Let me think about the kernel.", summary: str = "a change") -> str:
    """A QwQ-style answer: starts inside the thought (the template opened it), then the code and a summary."""
    return f"{thought}\n</think>\n\nHere is the new code.\n\n```python\n{code}\n```\n\nSummary: {summary}"
