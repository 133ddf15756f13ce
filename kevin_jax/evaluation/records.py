"""Reading JSONL inputs line by line without losing track of bad lines: every line that is not a valid record is
counted with its line number and reason (`InputReport`), logged, and shown in the evaluation report; a file with no
valid record at all is an error. Used for saved trajectories (re-scoring) and external responses."""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from kevin_jax.env.episode import Trajectory

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_EXAMPLES = 10


@dataclasses.dataclass(frozen=True)
class LineProblem:
    line: int
    reason: str


@dataclasses.dataclass
class InputReport:
    """What was read from one input file: lines with content, records accepted, and the lines refused."""
    path: str
    lines: int = 0
    accepted: int = 0
    problems: list[LineProblem] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def garbage_lines(self) -> int:
        return len(self.problems)

    def refuse(self, line: int, reason: str) -> None:
        self.problems.append(LineProblem(line, reason))

    def describe(self) -> str:
        text = f"{self.path}: {self.accepted} record(s) accepted of {self.lines} line(s)"
        if self.problems:
            text += f", {self.garbage_lines} garbage line(s) refused: " + "; ".join(
                f"line {p.line}: {p.reason}" for p in self.problems[:MAX_EXAMPLES])
            if self.garbage_lines > MAX_EXAMPLES:
                text += f"; ... ({self.garbage_lines - MAX_EXAMPLES} more)"
        return text

    def log(self) -> None:
        if self.problems:
            log.warning("%s", self.describe())

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "lines": self.lines, "accepted": self.accepted,
                "garbage_lines": self.garbage_lines,
                "problems": [dataclasses.asdict(p) for p in self.problems], "notes": list(self.notes)}


class RecordError(ValueError):
    """A line that parses as JSON but is not a valid record; the message says why."""


def read_jsonl(path: str | Path, parse: Callable[[Mapping[str, Any], int], T]) -> tuple[list[T], InputReport]:
    """Records of a JSONL file: `parse(obj, line_no)` builds one from a JSON object (raising RecordError, KeyError,
    TypeError or ValueError for a bad one). Blank lines are skipped; every other bad line is counted (the caller
    logs the report once it has added its own checks: `report.log()`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    report = InputReport(str(path))
    records: list[T] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            report.lines += 1
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                report.refuse(line_no, f"not JSON ({e.msg} at column {e.colno})")
                continue
            if not isinstance(obj, dict):
                report.refuse(line_no, f"a JSON {type(obj).__name__}, not an object")
                continue
            try:
                records.append(parse(obj, line_no))
            except RecordError as e:
                report.refuse(line_no, str(e))
                continue
            except (KeyError, TypeError, ValueError) as e:
                report.refuse(line_no, f"{type(e).__name__}: {e}")
                continue
            report.accepted += 1
    if not records:
        raise ValueError(f"no valid record in {path}: " + (report.describe() if report.lines else "the file is empty"))
    return records, report


def _trajectory(obj: Mapping[str, Any], line_no: int) -> tuple[int, Trajectory]:
    missing = [k for k in ("task_id", "traj_index", "turns") if k not in obj]
    if missing:
        raise RecordError(f"not a trajectory record (missing {missing})")
    traj = Trajectory.from_dict({"step": 0, "seed": 0, **obj})
    for t in traj.turns:
        if not isinstance(t.verdict, dict) or not isinstance(t.parsed, dict):
            raise RecordError(f"turn {t.turn} has no verdict/parsed objects")
    return line_no, traj


def load_trajectories(path: str | Path) -> tuple[list[Trajectory], InputReport]:
    """Contract-4 trajectories of one evaluation (or one training step). Duplicates of (task_id, traj_index) are
    refused as garbage lines; a file mixing several steps is an error (its samples are not one evaluation's)."""
    rows, report = read_jsonl(path, _trajectory)
    seen: dict[tuple[str, int], int] = {}
    out = []
    for line_no, traj in rows:
        key = (traj.task_id, traj.traj_index)
        if key in seen:
            report.refuse(line_no, f"duplicate trajectory {traj.task_id} #{traj.traj_index} (first at line "
                                   f"{seen[key]})")
            report.accepted -= 1
            continue
        seen[key] = line_no
        out.append(traj)
    steps = sorted({t.step for t in out})
    if len(steps) > 1:
        raise ValueError(f"{path} mixes trajectories of steps {steps[:10]}: pass the file of one evaluation")
    report.log()
    return out, report


def check_known_tasks(task_ids, known: Mapping[str, Any], where: str) -> None:
    """Unknown task ids are an error naming them (the input was made for another task set)."""
    unknown = sorted(set(task_ids) - set(known))
    if unknown:
        raise ValueError(f"{where} refers to {len(unknown)} task(s) that are not in the loaded task set, e.g. "
                         f"{unknown[:8]}; load the task set it was made with (--config.tasks.kernelbench_dir / "
                         f"--config.tasks.parquet / --config.tasks.levels). Known ids look like "
                         f"{sorted(known)[:3]}")
