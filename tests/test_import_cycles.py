"""No import cycle in kevin_jax or cuda_eval: every `import` / `from ... import` in a package file, at module level or
inside a function, is an edge of the module graph, and the graph must be acyclic (an import made at call time to
dodge a circle still counts: it hides the circle, it does not remove it)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kevin_jax", "cuda_eval")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            # task and solution programs are data the evaluator runs, not modules of the package
            if {"builtin", "builtin_solutions"} & set(path.relative_to(ROOT / package).parts):
                continue
            out[_module_name(path)] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package modules one import statement loads (explicit names only; parent packages are not added)."""
    names: set[str] = set()
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        # `from a.b import c`: c is a module (a.b.c) or a name defined in a.b
        candidates = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix
                      for alias in node.names]
    else:
        return names
    for name in candidates:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            names.add(name)
    return names


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = set()
        for node in ast.walk(tree):
            edges |= _imported(node, name, path.name == "__init__.py", known)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}       # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert len(graph) > 40 and "kevin_jax.train" in graph and "cuda_eval.api" in graph
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    inside = {name: {e for e in edges if e.split(".")[0] == package}
              for name, edges in import_graph().items() if name.split(".")[0] == package}
    cycle = find_cycle(inside)
    assert cycle is None, f"import cycle in {package}: " + " -> ".join(cycle)
