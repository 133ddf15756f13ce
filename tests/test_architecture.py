"""The layout of cuda_eval is its architecture: docs/ARCHITECTURE.md's map names every module (and nothing that is
gone), only worker/ runs candidate code and nothing outside it imports it, and kevin_jax reaches the evaluator only
through cuda_eval.api. The import graph is test_import_cycles.py's (function-level imports count)."""
import ast
import re
from pathlib import Path

import pytest

from test_import_cycles import import_graph

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cuda_eval"
NAME = re.compile(r"[\w.]+/?(?:, [\w.]+/?)*")


def mapped_paths(text: str) -> set[str]:
    """The paths the "Layout" block names under cuda_eval/ ("judge/job.py", "sandbox/native_src/"): a name column
    indented two spaces per folder level, then the description; deeper-indented lines continue a description."""
    block = text.split("## Layout\n```\n", 1)[1].split("```", 1)[0].splitlines()
    start = block.index(next(line for line in block if line.startswith("cuda_eval/ ")))
    folders, paths = [], set()
    for line in block[start + 1:]:
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            break                      # the next top-level folder
        match = NAME.match(line.lstrip(" "))
        if indent % 2 or indent > 2 * (len(folders) + 1) or not match:
            continue                   # a description's continuation line
        depth = indent // 2 - 1
        del folders[depth:]
        names = [n.strip() for n in match.group(0).split(",")]
        paths.update("".join(folders) + n for n in names)
        if len(names) == 1 and names[0].endswith("/"):
            folders.append(names[0])
    return paths


def package_paths() -> set[str]:
    """Every module and folder of cuda_eval as the map names them (package __init__ files are their folder)."""
    out = set()
    for path in PACKAGE.rglob("*"):
        rel = path.relative_to(PACKAGE)
        if "__pycache__" in rel.parts or "native_src" in rel.parts[:-1]:
            continue
        if path.is_dir():
            out.add(rel.as_posix() + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            out.add(rel.as_posix())
    return out - {"__init__.py"}


def test_the_map_reader_reads_folders_and_continuations():
    text = ("## Layout\n```\ncuda_eval/   the evaluator\n  api.py     the door\n  judge/     trusted\n"
            "    job.py   one job,\n             continued\n    a.py, b.py  two\n  top.py   again\n"
            "launch/    not ours\n```\n")
    assert mapped_paths(text) == {"api.py", "judge/", "judge/job.py", "judge/a.py", "judge/b.py", "top.py"}


def test_every_module_is_on_the_map():
    mapped, present = mapped_paths((ROOT / "docs" / "ARCHITECTURE.md").read_text()), package_paths()
    assert len(present) > 40, sorted(present)
    assert not present - mapped, f"cuda_eval modules missing from docs/ARCHITECTURE.md: {sorted(present - mapped)}"
    assert not mapped - present, f"docs/ARCHITECTURE.md names modules that do not exist: {sorted(mapped - present)}"


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_only_the_worker_imports_the_worker(graph):
    outside = {m: sorted(e for e in edges if e.startswith("cuda_eval.worker"))
               for m, edges in graph.items() if not m.startswith("cuda_eval.worker")}
    assert not {m: e for m, e in outside.items() if e}, "trusted code imports the candidate's side"


def test_the_judge_imports_only_trusted_and_shared_code(graph):
    allowed = ("cuda_eval.judge", "cuda_eval.protocol", "cuda_eval.profile")
    bad = {m: sorted(e for e in edges if e.startswith("cuda_eval") and not e.startswith(allowed))
           for m, edges in graph.items() if m.startswith("cuda_eval.judge")}
    assert len(bad) >= 3 and not any(bad.values()), bad


def test_kevin_jax_reaches_cuda_eval_only_through_the_api(graph):
    bad = {m: sorted(e for e in edges if e.startswith("cuda_eval") and e not in ("cuda_eval", "cuda_eval.api"))
           for m, edges in graph.items() if m.startswith("kevin_jax")}
    assert not any(bad.values()), {m: e for m, e in bad.items() if e}


def test_the_static_reading_imports_no_torch():
    """static/ reads the candidate as text in the trainer's process (JAX there; torch lives in the workers)."""
    for path in sorted((PACKAGE / "static").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] == "torch"], f"{path.name} imports torch"
