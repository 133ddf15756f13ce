"""Parsing candidate programs from several threads at once (the compile pool's workers, the evaluator's caller)."""
from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()
_ATTEMPTS = 3


def lock() -> threading.Lock:
    """The lock parse() holds: for compile() of a tree, which walks the same AST state."""
    return _LOCK


def parse(code: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse under one process-wide lock. CPython 3.11's AST constructor keeps a recursion depth that parses
    running at the same time corrupt ("SystemError: AST constructor recursion depth mismatch", python/cpython#106905):
    the compile pool's threads hit it in CI (docs/LOG.md, "static record"). A parse of someone else's, outside the lock,
    can still collide: such a SystemError is retried. Raises what ast.parse raises."""
    for attempt in range(_ATTEMPTS):
        try:
            with _LOCK:
                return ast.parse(code, filename)
        except SystemError:
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
