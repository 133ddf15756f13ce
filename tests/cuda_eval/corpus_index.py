"""The evaluator's test corpus (tests/cuda_eval/corpus/): tasks, honest and adversarial CUDA candidates, bad inputs,
and C++ candidates for CPU mode. Each candidate file starts with `# key: value` lines:

    # task: relu                      the task file in corpus/tasks/ (without .py)
    # expect: code1,code2             hack flag codes that must all be raised (adversarial, cpu)
    # static: code1                   exactly the flags the static policy raises (absent = none)
    # verdict: correct|incorrect|runtime_error|crash|timeout|compile_error|any    (bad, cpu; adversarial: incorrect)
    # about: what the candidate does
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
_HEADER = re.compile(r"^# (task|expect|static|verdict|about): (.*)$", re.M)


@dataclasses.dataclass(frozen=True)
class Candidate:
    kind: str            # honest | adversarial | bad | cpu
    name: str
    task: str
    code: str
    expect: tuple[str, ...]
    static: tuple[str, ...]
    verdict: str
    about: str

    @property
    def task_source(self) -> str:
        return (CORPUS / "tasks" / f"{self.task}.py").read_text()

    @property
    def response(self) -> str:
        return f"Here is my optimised version.\n\n```python\n{self.code}```\n"

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def load(kind: str) -> list[Candidate]:
    out = []
    for path in sorted((CORPUS / kind).glob("*.py")):
        code = path.read_text()
        fields = dict(_HEADER.findall(code))
        split = lambda key: tuple(c.strip() for c in fields.get(key, "").split(",") if c.strip())  # noqa: E731
        out.append(Candidate(kind, path.stem, fields["task"], code, split("expect"), split("static"),
                             fields.get("verdict", "correct" if kind == "honest" else "any"), fields.get("about", "")))
    return out


def request(candidate: Candidate, request_id: str | None = None):
    from cuda_eval.api import EvalRequest
    return EvalRequest(task_id=candidate.task, task_source=candidate.task_source, response=candidate.response,
                       request_id=request_id or candidate.id)


@contextlib.contextmanager
def shared_cache_dir(prefix: str = "cuda_eval_test_cache_"):
    """A build cache dir the sandbox uids can read (pytest's tmp dirs are private to us), removed afterwards."""
    d = tempfile.mkdtemp(prefix=prefix, dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
