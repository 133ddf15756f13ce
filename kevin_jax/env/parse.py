"""Reading a model response: the thought, the answer's code block and the summary.

Rules (decided here; tests in tests/kevin_jax/env/test_parse.py):
- Thought: the text inside <think>…</think>. QwQ's chat template ends the generation prompt with "<think>\\n", so
  the response usually starts inside the thought and only has the closing tag: text before the first "</think>"
  (with no "<think>" before it) is the thought. With no tags at all, the whole response is an unterminated thought
  when the prompt opened one (`prompt_opens_thought`), else there is no thought. A thought still open at the end of
  the response (the length limit hit) is `thought_complete=False` and leaves no answer: a format error.
- Answer: everything outside the thought. Only the answer is searched for code, and only the answer is sent to the
  evaluator, so code written inside the reasoning never counts.
- Code: `cuda_eval.api.extract_code(answer)` (the evaluator's own rule: the last complete ```python block that
  defines ModelNew); its error is the format error.
- Summary: the text after the last "Summary:" heading outside code blocks (also "**Summary**:", "## Summary",
  "Summary of changes:"), up to the next code block; without such a heading, the text after the last code block.
  Capped at `max_summary_chars` (the next prompts carry it).
`parse_response` never raises: malformed responses become a format error.
"""
from __future__ import annotations

import dataclasses
import re

from cuda_eval.api import extract_code

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MAX_SUMMARY_CHARS = 2000
UNTERMINATED_THOUGHT = ("the response ended inside its <think> reasoning (probably the length limit): there is no "
                        "final answer with a code block")
_FENCE_RE = re.compile(r"```[^\n]*\n.*?(?:```|\Z)", re.DOTALL)
_SUMMARY_RE = re.compile(r"^[ \t#>*_-]*summary(?:[ \t]+of(?:[ \t]+the)?[ \t]+changes)?[ \t*_]*:?[ \t*_]*",
                         re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ParsedResponse:
    thought: str | None        # None: the response had no thought section
    thought_complete: bool     # False: a thought was opened and never closed
    answer: str                # the text outside the thought (what the evaluator sees)
    code: str | None
    summary: str
    format_error: str | None   # None: well formed

    def to_dict(self) -> dict:
        """The `parsed` record of a trajectory turn (Contract 4); the answer is re-derivable from response_text."""
        return {"thought": self.thought, "thought_complete": self.thought_complete, "code": self.code,
                "summary": self.summary, "format_error": self.format_error}


def split_thought(text: str, prompt_opens_thought: bool) -> tuple[str | None, bool, str]:
    """(thought, thought_complete, answer)."""
    open_at, close_at = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if close_at >= 0 and (open_at < 0 or open_at > close_at):  # started inside the thought
        return text[:close_at].strip(), True, text[close_at + len(THINK_CLOSE):]
    if open_at >= 0:
        close_at = text.find(THINK_CLOSE, open_at + len(THINK_OPEN))
        if close_at < 0:
            return text[open_at + len(THINK_OPEN):].strip(), False, text[:open_at]
        return (text[open_at + len(THINK_OPEN):close_at].strip(), True,
                text[:open_at] + text[close_at + len(THINK_CLOSE):])
    if prompt_opens_thought:
        return text.strip(), False, ""
    return None, True, text


def extract_summary(answer: str, max_chars: int = MAX_SUMMARY_CHARS) -> str:
    fences = [m.span() for m in _FENCE_RE.finditer(answer)]
    # Text segments outside code blocks, with their start offsets.
    segments, pos = [], 0
    for start, end in fences:
        segments.append((pos, answer[pos:start]))
        pos = end
    segments.append((pos, answer[pos:]))
    summary = None
    for offset, segment in reversed(segments):
        headings = list(_SUMMARY_RE.finditer(segment))
        if headings:
            summary = segment[headings[-1].end():]  # a segment ends where the next code block starts
            break
    if summary is None:
        summary = answer[fences[-1][1]:] if fences else ""
    summary = summary.strip()
    if len(summary) > max_chars:
        summary = summary[:max_chars].rstrip() + " […]"
    return summary


def parse_response(text: str, prompt_opens_thought: bool = False,
                   max_summary_chars: int = MAX_SUMMARY_CHARS) -> ParsedResponse:
    thought, thought_complete, answer = split_thought(text, prompt_opens_thought)
    extraction = extract_code(answer)
    code = extraction.code
    format_error = None if code is not None else (extraction.error or "no code block found")
    if not thought_complete and not answer.strip():
        code, format_error = None, UNTERMINATED_THOUGHT
    summary = extract_summary(answer, max_summary_chars)
    return ParsedResponse(thought, thought_complete, answer, code, summary, format_error)
