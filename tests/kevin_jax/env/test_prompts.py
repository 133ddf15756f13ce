"""Prompt texts (Kevin/KernelBench content), chat-template rendering and the token budget."""
import pytest
from kevin_env_fakes import chatml_tokenizer

from kevin_jax.env import one_shot
from kevin_jax.env.prompts import (NO_CODE, Attempt, PromptRenderer, PromptTooLongError, first_turn_text,
                                   refinement_text)
from kevin_jax.tasks import load_builtin_tasks

TASK = load_builtin_tasks().by_id()["L1/1_LeakyReLU"]


def attempt(i, size=1):
    return Attempt(code=f"class ModelNew:  # attempt {i}\n" + "    x = 1\n" * size, summary=f"summary {i}",
                   feedback=f"feedback {i}")


def test_first_turn_says_what_kevin_and_kernelbench_say():
    text = first_turn_text(TASK.source, "NVIDIA H200")
    assert TASK.source.strip() in text
    for needle in ("ModelNew", "load_inline", "NVIDIA H200", "torch.nn may only be used for parameters",
                   "containers", "initialisation", "no testing code", "Summary:", "compiled", "timed",
                   "__global__"):
        assert needle in text, needle
    assert one_shot.EXAMPLE_MODEL_NEW.strip() in text and one_shot.EXAMPLE_MODEL.strip() in text
    without = first_turn_text(TASK.source, "NVIDIA H200", one_shot_example=False)
    assert one_shot.EXAMPLE_MODEL_NEW.strip() not in without and TASK.source.strip() in without


def test_refinement_has_base_prompt_then_attempts_in_order_then_instruction():
    attempts = [attempt(1), Attempt(None, "", "Format error: no code block."), attempt(3)]
    text = refinement_text(TASK.source, "NVIDIA H100", attempts)
    assert TASK.source.strip() in text and "NVIDIA H100" in text
    assert one_shot.EXAMPLE_MODEL_NEW.strip() not in text  # the one-shot example is for the first turn only
    positions = [text.index(s) for s in ("Attempt 1:", "attempt 1", "summary 1", "feedback 1", "Attempt 2:", NO_CODE,
                                         "Format error", "Attempt 3:", "summary 3", "feedback 3", "Reason again")]
    assert positions == sorted(positions)
    assert text.index(TASK.source.strip()) < text.index("Attempt 1:")
    with pytest.raises(ValueError):
        refinement_text(TASK.source, "NVIDIA H100", [])


def test_chat_template_rendering_and_token_ids():
    tok = chatml_tokenizer()
    r = PromptRenderer(tok, 100_000, "NVIDIA H100")
    assert r.has_chat_template and r.opens_thought
    assert r.generation_prefix == "<|im_start|>assistant\n<think>\n"
    p = r.first_turn(TASK.source)
    assert p.text.startswith("<|im_start|>user\n") and p.text.endswith("<|im_start|>assistant\n<think>\n")
    assert p.token_ids == tok(p.text, add_special_tokens=False)["input_ids"]
    templ = tok.apply_chat_template([{"role": "user", "content": first_turn_text(TASK.source, "NVIDIA H100")}],
                                    add_generation_prompt=True, tokenize=True)
    templ = templ["input_ids"] if hasattr(templ, "keys") else templ
    assert p.token_ids == list(templ)
    assert tok.decode(p.token_ids, skip_special_tokens=False) == p.text


def test_plain_fallback_without_a_chat_template():
    tok = chatml_tokenizer(with_template=False)
    r = PromptRenderer(tok, 100_000, "NVIDIA H100")
    assert not r.has_chat_template and not r.opens_thought
    p = r.first_turn(TASK.source)
    assert p.text.startswith("User:\n") and p.text.endswith("\n\nAssistant:\n")


def test_budget_drops_earliest_attempts_first_counting_real_tokens():
    tok = chatml_tokenizer()
    attempts = [attempt(i, size=40) for i in range(1, 5)]
    full = PromptRenderer(tok, 100_000, "NVIDIA H100").refinement(TASK.source, attempts)
    assert (full.attempts_shown, full.attempts_dropped) == (4, 0)
    two = PromptRenderer(tok, 100_000, "NVIDIA H100").refinement(TASK.source, attempts[2:])
    budget = len(two.token_ids)  # exactly enough for the last two attempts (renumbered 3 and 4)
    r = PromptRenderer(tok, budget, "NVIDIA H100")
    p = r.refinement(TASK.source, attempts)
    assert (p.attempts_shown, p.attempts_dropped) == (2, 2)
    assert len(p.token_ids) <= budget
    assert "attempt 1" not in p.text and "attempt 2" not in p.text
    assert "Attempt 3:" in p.text and "attempt 3" in p.text and "Attempt 4:" in p.text and "Attempt 1:" not in p.text


def test_budget_errors():
    tok = chatml_tokenizer()
    first = PromptRenderer(tok, 100_000, "NVIDIA H100").first_turn(TASK.source)
    with pytest.raises(PromptTooLongError, match="first-turn"):
        PromptRenderer(tok, len(first.token_ids) - 1, "NVIDIA H100").first_turn(TASK.source)
    small = PromptRenderer(tok, len(first.token_ids), "NVIDIA H100")
    with pytest.raises(PromptTooLongError, match="latest attempt"):
        small.refinement(TASK.source, [attempt(1, size=2000)])
    with pytest.raises(ValueError):
        PromptRenderer(tok, 0, "NVIDIA H100")


def test_renderer_accepts_kevin_jax_tokenizer_wrapper():
    from kevin_jax.model.tokenizer import load_tokenizer

    wrapped = load_tokenizer()
    r = PromptRenderer(wrapped, 100_000, "NVIDIA H100")
    p = r.first_turn(TASK.source)
    assert p.token_ids == wrapped.encode_chat([{"role": "user", "content": first_turn_text(TASK.source,
                                                                                           "NVIDIA H100")}])
