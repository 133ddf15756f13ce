"""How many candidate programs could skip the record stage: every load_inline/load call a module-level statement
whose arguments are literals or module-level literal strings, so that the build specs can be read from the source
without running it (no torch import, no candidate code). A lead for the compile-CPU cost, not a feature.

    python benchmarks/load_inline_static_share.py     # the candidates of benchmarks/compile_cost.py; no compiler

Prints the share and the programs that would still need the record stage, with the reason.
"""
from __future__ import annotations

import ast
import importlib.util
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
LOADERS = ("load_inline", "load")


def _literal(node: ast.AST, names: set[str]) -> bool:
    """A value known without running anything: constants, lists/tuples of them, names bound to them at module level,
    `+` of those, f-strings without fields."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_literal(e, names) for e in node.elts)
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal(node.left, names) and _literal(node.right, names)
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) for v in node.values)
    return False


def _is_loader(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Name) and f.id in LOADERS) or (isinstance(f, ast.Attribute) and f.attr in LOADERS)


def static_reason(code: str) -> str | None:
    """None if every loader call can be read statically, else why not."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return "syntax error"
    names: set[str] = set()
    top_calls = []
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.Expr)) else None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and _literal(stmt.value, names):
            names.add(stmt.targets[0].id)
        if isinstance(value, ast.Call) and _is_loader(value):
            top_calls.append(value)
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and _is_loader(c)]
    if not calls:
        return "no load_inline call"
    if len(top_calls) != len(calls):
        return "a load_inline call inside a function or class (e.g. __init__)"
    for c in calls:
        if not all(_literal(a, names) for a in c.args) or not all(_literal(k.value, names) for k in c.keywords):
            return "an argument computed at run time"
    return None


def main() -> int:
    spec = importlib.util.spec_from_file_location("compile_cost", REPO / "benchmarks" / "compile_cost.py")
    compile_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compile_cost)
    cands = compile_cost.candidates(None)
    reasons = {c["id"]: static_reason(c["code"]) for c in cands}
    with_loader = {k: v for k, v in reasons.items() if v not in ("no load_inline call", "syntax error")}
    static = sum(v is None for v in with_loader.values())
    print(f"{static} of {len(with_loader)} programs that call load_inline could be recorded statically "
          f"({static / max(1, len(with_loader)):.0%}); {len(cands) - len(with_loader)} of {len(cands)} candidates "
          f"have no load_inline call or do not parse")
    for k, v in sorted(with_loader.items()):
        if v is not None:
            print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
