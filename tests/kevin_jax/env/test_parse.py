"""Parsing responses: thought, code, summary; malformed text becomes a format error and nothing raises."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kevin_jax.env.parse import MAX_SUMMARY_CHARS, UNTERMINATED_THOUGHT, extract_summary, parse_response, split_thought

CODE = "import torch\nfrom torch.utils.cpp_extension import load_inline\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


def block(code=CODE):
    return f"```python\n{code}```"


CODE_WITH_COMMENT_SUMMARY = CODE + "# Summary: inside the code\n"
CODE_WITH_SUMMARY_VARIABLE = CODE + "summary = 3\n"


def test_response_starting_inside_the_thought():
    # QwQ's generation prompt already holds "<think>\n": the response only closes it.
    text = f"Okay, so I need to fuse.\n</think>\n\nThe plan.\n{block()}\n\nSummary: fused two ops."
    p = parse_response(text, prompt_opens_thought=True)
    assert p.thought == "Okay, so I need to fuse."
    assert p.thought_complete
    assert p.code.strip() == CODE.strip()
    assert p.summary == "fused two ops."
    assert p.format_error is None
    assert "Okay, so" not in p.answer and "ModelNew" in p.answer


def test_explicit_think_tags():
    p = parse_response(f"<think>reasoning</think>{block()}\nSummary: x", prompt_opens_thought=False)
    assert (p.thought, p.thought_complete, p.format_error) == ("reasoning", True, None)
    assert p.code is not None


def test_unterminated_thought_is_a_format_error_even_with_code_inside():
    for text, opens in ((f"<think>let me write it {block()} and more", False), (f"still thinking {block()}", True)):
        p = parse_response(text, prompt_opens_thought=opens)
        assert not p.thought_complete
        assert p.code is None
        assert p.format_error == UNTERMINATED_THOUGHT
        assert p.to_dict()["thought_complete"] is False


def test_code_inside_a_closed_thought_does_not_count():
    p = parse_response(f"draft:\n{block()}\n</think>\nI give up, no code.", prompt_opens_thought=True)
    assert p.code is None
    assert p.format_error


def test_no_tags_without_an_opened_thought_means_no_thought():
    p = parse_response(f"{block()}\nSummary: s", prompt_opens_thought=False)
    assert p.thought is None and p.thought_complete and p.code is not None


def test_no_code_block_is_a_format_error():
    p = parse_response("</think>I would use shared memory.", prompt_opens_thought=True)
    assert p.code is None and p.format_error


def test_split_thought_keeps_text_before_an_opening_tag_in_the_answer():
    thought, complete, answer = split_thought("intro <think>t</think> outro", False)
    assert (thought, complete, answer) == ("t", True, "intro  outro")


@pytest.mark.parametrize("answer,expected", [
    (f"{block()}\nSummary: used shared memory tiles.", "used shared memory tiles."),
    (f"{block()}\n\nI replaced the matmul with a tiled kernel.", "I replaced the matmul with a tiled kernel."),
    (f"**Summary**: fused bias and ReLU.\n\n{block()}\n", "fused bias and ReLU."),
    (f"{block()}\n## Summary\n- vectorized loads\n- one pass", "- vectorized loads\n- one pass"),
    (f"{block()}\nSummary of changes: warp shuffles.", "warp shuffles."),
    (f"{block(CODE_WITH_COMMENT_SUMMARY)}\ntrailing words", "trailing words"),
    ("no code and no summary heading", ""),
])
def test_summary_rules(answer, expected):
    assert extract_summary(answer) == expected


def test_summary_is_capped():
    s = extract_summary(f"{block()}\nSummary: " + "x" * 10_000)
    assert len(s) <= MAX_SUMMARY_CHARS + 4 and s.endswith("[…]")


def test_summary_ignores_headings_inside_code_blocks_after_the_real_one():
    answer = f"Summary: the real one.\n\n{block(CODE_WITH_SUMMARY_VARIABLE)}"
    assert extract_summary(answer) == "the real one."


pieces = st.sampled_from(["<think>", "</think>", "```", "```python\n", "```cuda\n", "\n", "Summary:", "**Summary**",
                          "class ModelNew(nn.Module):\n    pass\n", "import torch\n", "load_inline", " ", "\r\n",
                          "\x00", "é", "```py"])
texts = st.lists(st.one_of(pieces, st.text(max_size=20)), max_size=30).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts, st.booleans())
def test_parser_never_raises_and_code_xor_format_error(text, opens):
    p = parse_response(text, prompt_opens_thought=opens)
    assert (p.code is None) == (p.format_error is not None)
    assert isinstance(p.summary, str) and len(p.summary) <= MAX_SUMMARY_CHARS + 4
    d = p.to_dict()
    assert set(d) == {"thought", "thought_complete", "code", "summary", "format_error"}
    if not p.thought_complete and not p.answer.strip():
        assert p.format_error == UNTERMINATED_THOUGHT


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.booleans())
def test_parser_never_raises_on_arbitrary_unicode(text, opens):
    p = parse_response(text, prompt_opens_thought=opens)
    assert (p.code is None) == (p.format_error is not None)
