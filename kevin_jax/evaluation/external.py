"""Responses produced elsewhere (any model, any API), run through the same parse, evaluator, scores and metrics.

Input: JSONL, one response per line:
    {"task_id": "L1/1_LeakyReLU", "turn": 0, "response": "<the model's full answer text>",
     "trajectory": 0,                       # optional (default 0): which parallel trajectory of the task
     "model": "...", "stop_reason": "..."}  # optional; other keys are ignored and listed in the input report
"task" is accepted for "task_id" and "traj_index" for "trajectory". Turns of a trajectory are its refinement turns
(0 = first attempt); the metrics read them in turn order. The first-turn prompts our policy sees can be exported with
`write_prompts` (launch/eval.py --export_prompts) so that another model answers exactly the same question.

Bad lines (not JSON, a missing or ill-typed field, a duplicate (task, trajectory, turn)) are refused, counted and
reported; unknown task ids are an error.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from kevin_jax.env import episode
from kevin_jax.env.prompts import first_turn_text
from kevin_jax.env.trajectory import InputReport, RecordError, Trajectory, Turn, read_jsonl
from kevin_jax.reward import RewardConfig
from kevin_jax.rl.advantages import AdvantageConfig, assign_returns
from kevin_jax.tasks.kernelbench import Task, check_known_tasks

KNOWN_KEYS = {"task_id", "task", "turn", "response", "trajectory", "traj_index", "model", "stop_reason"}


@dataclasses.dataclass(frozen=True)
class ExternalResponse:
    task_id: str
    trajectory: int
    turn: int
    response: str
    stop_reason: str = "unknown"
    model: str = ""
    line: int = 0


def _nonnegative_int(obj: Mapping, key: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if value is None:
        raise RecordError(f"missing {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecordError(f"{key!r} must be a non-negative integer, got {value!r}")
    return value


def _parse_line(obj: Mapping[str, Any], line_no: int) -> ExternalResponse:
    task_id = obj.get("task_id", obj.get("task"))
    if not isinstance(task_id, str) or not task_id:
        raise RecordError("missing 'task_id' (a string such as \"L1/1_LeakyReLU\")")
    response = obj.get("response")
    if not isinstance(response, str):
        raise RecordError(f"'response' must be a string, got {type(response).__name__}")
    trajectory = _nonnegative_int(obj, "trajectory" if "trajectory" in obj else "traj_index", 0)
    return ExternalResponse(task_id, trajectory, _nonnegative_int(obj, "turn"), response,
                            str(obj.get("stop_reason") or "unknown"), str(obj.get("model") or ""), line_no)


def load_external(path: str | Path, tasks: Mapping[str, Task]) -> tuple[list[ExternalResponse], InputReport]:
    """The valid responses of the file (first of any duplicate) and the report of what was refused."""
    records, report = read_jsonl(path, _parse_line)
    seen: dict[tuple[str, int, int], int] = {}
    kept, extra_keys = [], set()
    for r in records:
        key = (r.task_id, r.trajectory, r.turn)
        if key in seen:
            report.refuse(r.line, f"duplicate of line {seen[key]} (task {r.task_id}, trajectory {r.trajectory}, "
                                  f"turn {r.turn})")
            report.accepted -= 1
            continue
        seen[key] = r.line
        kept.append(r)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                extra_keys.update(set(obj) - KNOWN_KEYS)
    if extra_keys:
        report.notes.append(f"ignored keys: {sorted(extra_keys)}")
    check_known_tasks({r.task_id for r in kept}, tasks, str(path))
    gaps = []
    for (task_id, j), turns in _group(kept).items():
        present = sorted(r.turn for r in turns)
        if present != list(range(len(present))):
            gaps.append(f"{task_id} #{j} has turns {present}")
    if gaps:
        report.notes.append(f"{len(gaps)} trajectory(ies) with missing turns (taken as not attempted), e.g. "
                            + "; ".join(gaps[:3]))
    models = sorted({r.model for r in kept if r.model})
    if models:
        report.notes.append(f"models: {models[:5]}")
    report.log()
    return kept, report


def _group(responses: Sequence[ExternalResponse]) -> dict[tuple[str, int], list[ExternalResponse]]:
    out: dict[tuple[str, int], list[ExternalResponse]] = {}
    for r in responses:
        out.setdefault((r.task_id, r.trajectory), []).append(r)
    return out


def evaluate_external(responses: Sequence[ExternalResponse], tasks: Mapping[str, Task], evaluator: Any,
                      reward: RewardConfig, advantage: AdvantageConfig,
                      max_summary_chars: int = 2000) -> list[Trajectory]:
    """Contract-4 trajectories of the responses (no tokens: they were not sampled here; step 0, seed 0), replayed as
    saved responses are (kevin_jax.env.episode.replay: parsed as ours are, one evaluator call, scored), then returns
    (`reward`) and advantages (`advantage`). Request ids start with "external/"."""
    if not responses:
        raise ValueError("no external responses to evaluate")
    check_known_tasks({r.task_id for r in responses}, tasks, "the external responses")
    trajectories = []
    for (task_id, j), group in sorted(_group(responses).items()):
        # No parse yet: the other system's prompt is unknown, so the replay reads each response as starting outside
        # any thought.
        trajectories.append(Trajectory(task_id, j, step=0, seed=0, turns=[
            Turn(r.turn, [], [], [], r.stop_reason, r.response, {}, {}) for r in sorted(group, key=lambda r: r.turn)]))
    trajectories = episode.replay(trajectories, evaluator, tasks, reward, max_summary_chars, request_prefix="external/")
    assign_returns(trajectories, reward, advantage)
    return trajectories


def write_prompts(tasks: Sequence[Task], path: str | Path, gpu_name: str, one_shot: bool = True) -> Path:
    """The first-turn prompt of each task (the user message our policy gets, before any chat template), as JSONL
    {"task_id", "prompt"}: give it to another model and evaluate its answers with `--external`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for t in tasks:
            f.write(json.dumps({"task_id": t.task_id, "prompt": first_turn_text(t.source, gpu_name, one_shot)}) + "\n")
    return path
