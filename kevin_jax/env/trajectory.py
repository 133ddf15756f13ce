"""Contract 4 (docs/ARCHITECTURE.md): a turn, a trajectory, the words for what a turn's verdict says, and the one
writer and the one reader of their JSONL files.

A `Turn` is one sampled answer and everything it led to: the prompt and response tokens (exactly as sampled), the
parse, the evaluator's verdict (EvalResult.to_dict()), the score, and the return and advantage RL gives it. What the
verdict means is defined here once, and the environment (scores, early stop), RL (rollout scalars, the compile-only
proxy score), the evaluation (Kevin's metrics, beam search) and the analysis scripts all read these properties:
  well_formed    our parse found the answer's code block, and so did the evaluator
  compiled       well formed, and it compiled
  correct        well formed, every correctness trial passed, and no hack flag (a flagged kernel is never correct)
  flagged        the evaluator raised a hack flag
  speedup        over PyTorch eager, of a correct kernel with a usable (finite, positive) timing; else None
  status         one word for the verdict (STATUSES)
  ok(mode)       what an evaluation of that mode counts: correct ("full"), or compiled and unflagged ("compile_only",
                 where nothing ran)
Files: one JSON object per trajectory and line. `write_trajectories` writes a whole file at once (a temporary file
renamed over it, so that a reader never sees half a step and a step written again replaces the old one);
`read_trajectories` reads one back, refusing and counting every line that is not a trajectory (`InputReport`).
Every file written since the first version of the format reads back unchanged (tests/data/trajectories/).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

STATUSES = ("format_error", "internal_error", "compile_error", "flagged", "correct", "runtime_error", "wrong",
            "compiled", "not_run")
MAX_EXAMPLES = 10


def _usable_speedup(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


@dataclasses.dataclass
class Turn:
    turn: int
    prompt_tokens: list[int]
    response_tokens: list[int]
    response_logprobs: list[float]
    stop_reason: str
    response_text: str
    parsed: dict                # ParsedResponse.to_dict()
    verdict: dict               # EvalResult.to_dict()
    score: float = 0.0          # kevin_jax.reward.turn_score
    return_: float = 0.0        # "return" in the JSON; return_ and advantage: kevin_jax.rl.advantages (0 until then)
    advantage: float = 0.0

    # --- what the verdict says (the only definitions; see the module docstring)
    @property
    def well_formed(self) -> bool:
        return self.parsed.get("format_error") is None and self.verdict.get("format_ok", True) is True

    @property
    def flagged(self) -> bool:
        return bool(self.verdict.get("hack_flags"))

    @property
    def compiled(self) -> bool:
        return self.well_formed and self.verdict.get("compiled") is True

    @property
    def correct(self) -> bool:
        return self.well_formed and self.verdict.get("correct") is True and not self.flagged

    @property
    def speedup(self) -> float | None:
        return _usable_speedup(self.verdict.get("speedup")) if self.correct else None

    @property
    def peak_fraction(self) -> float | None:
        """The share of the roofline a correct kernel's time reached (EvalResult.peak_fraction); None if unknown."""
        return _usable_speedup(self.verdict.get("peak_fraction")) if self.correct else None

    @property
    def compile_speedup(self) -> float | None:
        """Over torch.compile(reference) (EvalConfig.ref_compile: meta.ref_compile_timing), of a correct kernel: its
        median time over the candidate's; None when either was not measured."""
        if not self.correct:
            return None
        ref = (self.verdict.get("meta") or {}).get("ref_compile_timing")
        timing = self.verdict.get("timing")
        if not isinstance(ref, Mapping) or not isinstance(timing, Mapping):
            return None
        ref_ms, cand_ms = _usable_speedup(ref.get("median_ms")), _usable_speedup(timing.get("median_ms"))
        return ref_ms / cand_ms if ref_ms and cand_ms else None

    def ok(self, mode: str = "full") -> bool:
        return (self.compiled and not self.flagged) if mode == "compile_only" else self.correct

    @property
    def status(self) -> str:
        """format_error | internal_error (the evaluation failed, not the candidate) | compile_error | flagged |
        correct | runtime_error | wrong | compiled (compile-only: nothing ran) | not_run (no verdict on running)."""
        v = self.verdict
        if not self.well_formed:
            return "format_error"
        if (v.get("meta") or {}).get("internal_error"):
            return "internal_error"
        if v.get("compiled") is False:
            return "compile_error"
        if self.flagged:
            return "flagged"
        if v.get("correct") is True:
            return "correct"
        if v.get("runtime_error"):
            return "runtime_error"
        if v.get("correct") is False:
            return "wrong"
        return "compiled" if v.get("compiled") is True else "not_run"

    @property
    def feedback(self) -> str:
        """The evaluator's text for the model (carried into the next prompt)."""
        return str(self.verdict.get("feedback") or "")

    # --- JSON
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["return"] = d.pop("return_")
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Turn":
        """A turn record. turn, parsed and verdict are required; the fields that do not change what the kernel counts
        for default when a hand-written or partial record lacks them (tokens and log-probs [], texts "", score,
        return and advantage 0). Unknown fields are an error."""
        d = dict(d)
        missing = [k for k in ("turn", "parsed", "verdict") if k not in d]
        if missing:
            raise RecordError(f"a turn without {missing}")
        if not isinstance(d["parsed"], dict) or not isinstance(d["verdict"], dict):
            raise RecordError(f"turn {d['turn']} has no verdict/parsed objects")
        d["return_"] = d.pop("return", 0.0)
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise RecordError(f"turn {d['turn']} has unknown fields {unknown}")
        defaults = {"prompt_tokens": [], "response_tokens": [], "response_logprobs": [], "stop_reason": "",
                    "response_text": ""}
        return cls(**{**defaults, **d})


@dataclasses.dataclass
class Trajectory:
    task_id: str
    traj_index: int
    step: int
    seed: int
    turns: list[Turn] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "traj_index": self.traj_index, "step": self.step, "seed": self.seed,
                "turns": [t.to_dict() for t in self.turns]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Trajectory":
        """A trajectory record: task_id, traj_index and turns are required; step and seed default to 0 (records
        of responses from elsewhere have none)."""
        missing = [k for k in ("task_id", "traj_index", "turns") if k not in d]
        if missing:
            raise RecordError(f"not a trajectory record (missing {missing})")
        return cls(d["task_id"], d["traj_index"], d.get("step", 0), d.get("seed", 0),
                   [Turn.from_dict(t) for t in d["turns"]])

    def copy(self) -> "Trajectory":
        return Trajectory.from_dict(self.to_dict())


def turns_of(trajectories: Iterable[Trajectory]) -> list[Turn]:
    return [t for traj in trajectories for t in traj.turns]


# ---------------------------------------------------------------------------------------------------------------------
# The writer

def step_path(directory: str | os.PathLike, step: int) -> Path:
    """A training run's file of one step: <workdir>/trajectories/step_000001.jsonl (holdout/ alike)."""
    return Path(directory) / f"step_{step:06d}.jsonl"


def write_trajectories(path: str | os.PathLike, trajectories: Iterable[Trajectory]) -> Path:
    """The trajectories as JSONL, written to a temporary file and renamed over `path` (no partial or duplicated
    lines; a step written again replaces its file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for traj in trajectories:
            f.write(json.dumps(traj.to_dict()) + "\n")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# The reader (and the line-checked JSONL reading it shares with other record files: kevin_jax.evaluation.external)

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


def read_jsonl(path: str | os.PathLike, parse: Callable[[Mapping[str, Any], int], T]) -> tuple[list[T], InputReport]:
    """Records of a JSONL file: `parse(obj, line_no)` builds one from a JSON object (raising RecordError, KeyError,
    TypeError or ValueError for a bad one). Blank lines are skipped; every other bad line is counted (the caller
    logs the report once it has added its own checks: `report.log()`). No valid record at all is an error."""
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


def read_trajectories(path: str | os.PathLike, one_evaluation: bool = False) -> tuple[list[Trajectory], InputReport]:
    """The trajectories of a file, in file order, and the report of the lines refused (logged). one_evaluation:
    the file must hold the samples of one evaluation (or one training step): a duplicate (task_id, traj_index) is
    refused as a garbage line, and trajectories of several steps are an error."""
    rows, report = read_jsonl(path, lambda obj, line_no: (line_no, Trajectory.from_dict(obj)))
    out, seen = [], {}
    for line_no, traj in rows:
        key = (traj.task_id, traj.traj_index)
        if one_evaluation and key in seen:
            report.refuse(line_no, f"duplicate trajectory {traj.task_id} #{traj.traj_index} (first at line "
                                   f"{seen[key]})")
            report.accepted -= 1
            continue
        seen.setdefault(key, line_no)
        out.append(traj)
    steps = sorted({t.step for t in out})
    if one_evaluation and len(steps) > 1:
        raise ValueError(f"{path} mixes trajectories of steps {steps[:10]}: pass the file of one evaluation")
    report.log()
    return out, report
