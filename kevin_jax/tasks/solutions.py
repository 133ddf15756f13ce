"""Reference CUDA solutions of the built-in tasks (kevin_jax/tasks/builtin_solutions/).

For every built-in task `level<L>/<id>_<Name>.py` there is a folder `builtin_solutions/level<L>/<id>_<Name>/` with
complete ModelNew programs (load_inline + real __global__ kernels): files named `correct_*.py` compute the reference's
output; files named `wrong_*.py` compile and run but compute something else (their first `// BUG:` comment says
what). They serve the device check of the scripted policy (benchmarks/env_scripted.py), the evaluator's honest corpus
and warm-start data.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from kevin_jax.tasks.kernelbench import BUILTIN_DIR, TASK_FILE_RE

SOLUTIONS_DIR = Path(__file__).resolve().parent / "builtin_solutions"


@dataclasses.dataclass(frozen=True)
class Solution:
    task_id: str          # "L1/1_LeakyReLU"
    kind: Literal["correct", "wrong"]
    name: str             # file stem, e.g. "correct_naive"
    path: str
    source: str

    @property
    def expected_correct(self) -> bool:
        return self.kind == "correct"


def builtin_solutions() -> list[Solution]:
    """All solutions, ordered by task then file name. Raises if a built-in task has no correct or no wrong solution,
    or a solution folder has no task (the set must stay complete)."""
    out: list[Solution] = []
    problems: list[str] = []
    task_stems = set()
    for task_file in sorted(BUILTIN_DIR.glob("level*/*.py")):
        level = int(task_file.parent.name.removeprefix("level"))
        match = TASK_FILE_RE.match(task_file.name)
        if match is None:
            continue
        task_stems.add((task_file.parent.name, task_file.stem))
        task_id = f"L{level}/{task_file.stem}"
        folder = SOLUTIONS_DIR / task_file.parent.name / task_file.stem
        found = {"correct": 0, "wrong": 0}
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
            kind = path.stem.split("_", 1)[0]
            if kind not in found:
                problems.append(f"{path}: name must start with correct_ or wrong_")
                continue
            found[kind] += 1
            out.append(Solution(task_id, kind, path.stem, str(path), path.read_text(encoding="utf-8")))
        problems += [f"{task_id} has no {k} solution in {folder}" for k, n in found.items() if n == 0]
    for folder in sorted(SOLUTIONS_DIR.glob("level*/*")):
        if folder.is_dir() and (folder.parent.name, folder.name) not in task_stems:
            problems.append(f"{folder} matches no built-in task")
    if problems:
        raise ValueError("incomplete built-in solution set:\n  " + "\n  ".join(problems))
    return out
