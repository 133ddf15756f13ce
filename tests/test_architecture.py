"""The layout of cuda_eval is its architecture: docs/ARCHITECTURE.md's map names every module (and nothing that is
gone), only worker/ runs candidate code and nothing outside it imports it (the launchers, scripts and benchmarks
neither), the worker reaches nothing of the trusted side (no sandbox, no build, no orchestrator, no judge), the judge
is imported by nobody, the protocol belongs to neither side, and kevin_jax and launch/ reach the evaluator only
through cuda_eval.api.
In kevin_jax, RL does not import the evaluation (the evaluation reads RL's checkpoints and advantages). The import
graph is test_import_cycles.py's (function-level imports count)."""
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


def script_imports(folder: str) -> dict[str, set[str]]:
    """Every module each .py file under ROOT/folder imports (at any level; `from a import b` counts as a.b too)."""
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        out[path.relative_to(ROOT).as_posix()] = names
    return out


# A benchmark of the worker's own code, run in a process of its own with no trusted code in it: measuring the tracer
# the worker runs every candidate call under is its purpose.
MEASURES_THE_WORKER = {"benchmarks/tracer_overhead.py"}


@pytest.mark.parametrize("folder", ["launch", "scripts", "benchmarks"])
def test_launchers_scripts_and_benchmarks_import_no_worker(folder):
    found = script_imports(folder)
    assert len(found) >= 3, found
    bad = {f: sorted(n for n in names if n.startswith("cuda_eval.worker"))
           for f, names in found.items() if f not in MEASURES_THE_WORKER}
    assert not {f: n for f, n in bad.items() if n}, "imports the candidate's side"


def test_the_script_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "x.py").write_text("def main():\n    from cuda_eval.worker import record\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert "cuda_eval.worker.record" in script_imports("launch")["launch/x.py"]


def test_the_launchers_reach_cuda_eval_only_through_the_api():
    bad = {f: sorted(n for n in names if n.startswith("cuda_eval") and n not in ("cuda_eval", "cuda_eval.api")
                     and not n.startswith("cuda_eval.api."))
           for f, names in script_imports("launch").items()}
    assert not {f: n for f, n in bad.items() if n}


def reached(graph: dict[str, set[str]], prefix: str) -> set[str]:
    """Every module the modules under `prefix` import, directly or through others."""
    seen, todo = set(), [m for m in graph if m.startswith(prefix)]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_worker_imports_no_sandbox(graph):
    """The worker's run-time build starts the build as a process (compile/runtime_build.py) instead of importing it."""
    seen = reached(graph, "cuda_eval.worker")
    assert "cuda_eval.protocol.harness" in seen     # the walk follows the worker's imports
    assert not sorted(m for m in seen if m.startswith("cuda_eval.sandbox")), "the worker reaches the sandbox"


# What the candidate's worker may reach: its own code, the protocol both sides speak, the profiler, and the static
# policy's lists of operations (static/checks.py, read by the tracer, with the parser lock it takes).
WORKER_MAY_REACH = ("cuda_eval.worker", "cuda_eval.protocol", "cuda_eval.profile")
SHARED_POLICY = {"cuda_eval", "cuda_eval.static.checks", "cuda_eval.static.pysource"}


def test_the_worker_reaches_nothing_of_the_trusted_side(graph):
    """Nothing of the trainer's process (orchestrator/, compile/, sandbox/, cluster/, api, contract) nor the judge."""
    seen = reached(graph, "cuda_eval.worker")
    bad = sorted(m for m in seen if not m.startswith(WORKER_MAY_REACH) and m not in SHARED_POLICY)
    assert not bad, f"the worker reaches trusted code: {bad}"


def test_only_the_judge_imports_the_judge(graph):
    """The judge is a process of its own (`python -m cuda_eval.judge`): started, never imported."""
    outside = {m: sorted(e for e in edges if e.startswith("cuda_eval.judge"))
               for m, edges in graph.items() if not m.startswith("cuda_eval.judge")}
    assert not {m: e for m, e in outside.items() if e}, "imports the judge's code"


def test_the_protocol_belongs_to_neither_side(graph):
    """protocol/ is what the judge and the worker both speak: it imports neither of them, nor the trainer's side."""
    seen = reached(graph, "cuda_eval.protocol")
    assert "cuda_eval.protocol.wire" in seen
    bad = sorted(m for m in seen if not m.startswith("cuda_eval.protocol") and m not in SHARED_POLICY)
    assert not bad, f"the protocol reaches one side: {bad}"


# The script that writes the affine trials' exception list runs the judge's own trials (judge/affine.py) on each task.
RUNS_THE_JUDGES_TRIALS = {"scripts/affine_exceptions.py"}


@pytest.mark.parametrize("folder", ["launch", "scripts", "benchmarks"])
def test_launchers_scripts_and_benchmarks_import_no_judge(folder):
    """The judge runs as a process the GPU pool starts, with the judge's settings: a launcher or benchmark that
    imported it would judge outside it."""
    bad = {f: sorted(n for n in names if n.startswith("cuda_eval.judge"))
           for f, names in script_imports(folder).items() if f not in RUNS_THE_JUDGES_TRIALS}
    assert not {f: n for f, n in bad.items() if n}, "imports the judge's code"


def test_rl_does_not_import_the_evaluation(graph):
    bad = {m: sorted(e for e in edges if e.startswith("kevin_jax.evaluation"))
           for m, edges in graph.items() if m.startswith("kevin_jax.rl")}
    assert len(bad) >= 5 and not any(bad.values()), {m: e for m, e in bad.items() if e}


def test_the_static_reading_imports_no_torch():
    """static/ reads the candidate as text in the trainer's process (JAX there; torch lives in the workers)."""
    for path in sorted((PACKAGE / "static").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] == "torch"], f"{path.name} imports torch"
