"""The candidate program inside a model response (the trainer's process: kevin_jax's parser uses the same rule).

Extraction rule (documented in docs/ARCHITECTURE.md): fenced blocks are ```python / ```py / ```python3 / ``` (no
language) ... ```; only complete (closed) blocks count. Kevin-style answers put the final program after the
reasoning, so blocks after the last `</think>` are preferred; if there are none there, any block in the response is
considered (a model that forgets to close its think section still gets graded). Among the considered blocks the LAST
one that defines `class ModelNew` wins. `extract_code` never raises.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

_FENCE_OPEN = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+.\-]*)[^\n`]*$")
_PYTHON_LANGS = {"", "python", "py", "python3", "py3"}
_MODEL_NEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Extraction:
    code: str | None
    error: str | None   # None when code was found

    @property
    def ok(self) -> bool:
        return self.code is not None


@dataclasses.dataclass(frozen=True)
class _Block:
    start: int           # character offset of the opening fence line
    lang: str
    code: str
    closed: bool


def _fenced_blocks(text: str) -> list[_Block]:
    blocks = []
    lines = text.splitlines(keepends=True)
    offset = 0
    i = 0
    offsets = []
    for line in lines:
        offsets.append(offset)
        offset += len(line)
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i].rstrip("\r\n"))
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        body = []
        j = i + 1
        closed = False
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped and stripped[0] == fence[0] and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed = True
                break
            body.append(lines[j])
            j += 1
        blocks.append(_Block(offsets[i], lang, "".join(body), closed))
        i = j + 1
    return blocks


def extract_code(response: str) -> Extraction:
    """The candidate program in `response`, or a format error saying what is missing. Never raises."""
    try:
        return _extract(response)
    except Exception as e:  # noqa: BLE001 - a format verdict, whatever the input
        return Extraction(None, f"could not parse the response ({type(e).__name__})")


def _extract(response: Any) -> Extraction:
    if not isinstance(response, str):
        return Extraction(None, f"the response is not text ({type(response).__name__})")
    if not response.strip():
        return Extraction(None, "empty response")
    blocks = [b for b in _fenced_blocks(response) if b.lang in _PYTHON_LANGS]
    if not blocks:
        return Extraction(None, "no ```python code block in the response")
    complete = [b for b in blocks if b.closed]
    if not complete:
        return Extraction(None, "the ```python code block is not closed (response truncated?)")
    think_end = response.rfind("</think>")
    after = [b for b in complete if b.start > think_end] if think_end >= 0 else complete
    for pool in (after, complete):
        with_model = [b for b in pool if _MODEL_NEW.search(b.code)]
        if with_model:
            code = with_model[-1].code
            return Extraction(code if code.endswith("\n") else code + "\n", None)
    return Extraction(None, "the code block does not define class ModelNew")
