"""kevin_jax.env.trajectory: the Turn's words for a verdict (one definition each), and the one reader and writer of
trajectory files; a file written by the version before this module reads back and writes out byte for byte."""
import json
from pathlib import Path

import pytest

from cuda_eval.api import EvalRequest, EvalResult
from kevin_jax.reward import RewardConfig, turn_score
from kevin_jax.env.submissions import failed_verdict
from kevin_jax.env.trajectory import (STATUSES, RecordError, Trajectory, Turn, read_trajectories, step_path,
                                      write_trajectories)
from kevin_jax.rl.advantages import AdvantageConfig, rescore

OLD_FILE = Path(__file__).resolve().parents[2] / "data" / "trajectories" / "episode_format_v1.jsonl"


def kernel(format_error=None, **verdict) -> Turn:
    fields = {"mode": "full", "format_ok": True, "compiled": True, "correct": True, "speedup": 1.5, "hack_flags": [],
              **verdict}
    return Turn.from_dict({"turn": 0, "parsed": {"format_error": format_error}, "verdict": fields})


def test_what_a_verdict_says():
    fine = kernel()
    assert (fine.well_formed, fine.compiled, fine.correct, fine.flagged, fine.speedup, fine.status) == \
        (True, True, True, False, 1.5, "correct")
    assert fine.ok("full") and fine.ok("compile_only")
    # a hack flag: never correct, whatever the trials said; no speedup counts
    flagged = kernel(hack_flags=[{"code": "torch_op", "reason": "torch.matmul"}])
    assert (flagged.correct, flagged.flagged, flagged.speedup, flagged.status) == (False, True, None, "flagged")
    assert flagged.compiled and not flagged.ok("compile_only")
    # a format error on either side: not well formed, not compiled, not correct
    for bad in (kernel(format_error="no code block"), kernel(format_ok=False)):
        assert not (bad.well_formed or bad.compiled or bad.correct) and bad.status == "format_error"
    assert kernel(compiled=False, correct=None, speedup=None).status == "compile_error"
    wrong = kernel(correct=False, speedup=None)
    assert (wrong.compiled, wrong.correct, wrong.status) == (True, False, "wrong")
    assert kernel(correct=False, speedup=None, runtime_error="illegal memory access").status == "runtime_error"
    # compile-only: nothing ran; ok means compiled and unflagged
    compiled = kernel(mode="compile_only", correct=None, speedup=None)
    assert (compiled.correct, compiled.ok("compile_only"), compiled.ok("full"), compiled.status) == \
        (False, True, False, "compiled")
    assert kernel(compiled=None, correct=None, speedup=None).status == "not_run"
    # an evaluation that failed is ours, not the candidate's
    request = EvalRequest(task_id="t", task_source="", response="```python\nx\n```", request_id="r")
    failed = Turn.from_dict({"turn": 0, "parsed": {"format_error": None},
                             "verdict": failed_verdict(request, "RuntimeError: worker lost")})
    assert failed.status == "internal_error" and not failed.correct
    assert set(STATUSES) >= {k.status for k in (fine, flagged, wrong, compiled, failed)}


@pytest.mark.parametrize("speedup", [None, float("nan"), float("inf"), 0.0, -1.0, True, "2.0"])
def test_a_correct_kernel_without_a_usable_timing_has_no_speedup(speedup):
    turn = kernel(speedup=speedup)
    assert turn.correct and turn.speedup is None
    assert turn_score(turn, RewardConfig()) == pytest.approx(0.3)      # the correctness credit only


def test_speedup_over_torch_compile():
    timed = kernel(timing={"median_ms": 0.5}, meta={"ref_compile_timing": {"median_ms": 1.5}})
    assert timed.compile_speedup == pytest.approx(3.0)
    assert kernel(timing={"median_ms": 0.5}).compile_speedup is None
    assert kernel(timing={"median_ms": 0.5}, meta={"ref_compile_timing": {"error": "failed"}}).compile_speedup is None
    wrong = kernel(correct=False, timing={"median_ms": 0.5}, meta={"ref_compile_timing": {"median_ms": 1.5}})
    assert wrong.compile_speedup is None


def test_the_evaluators_own_verdict_reads_the_same():
    result = EvalResult(request_id="r", task_id="t", mode="full", format_ok=True, compiled=True, correct=True,
                        speedup=2.0)
    turn = Turn.from_dict({"turn": 1, "parsed": {"format_error": None}, "verdict": result.to_dict()})
    assert turn.correct and turn.speedup == 2.0 and turn_score(turn, RewardConfig()) == pytest.approx(2.3)


def test_records_partial_unknown_and_missing_fields():
    turn = Turn.from_dict({"turn": 2, "parsed": {}, "verdict": {"correct": True}, "score": 0.3})
    assert (turn.prompt_tokens, turn.response_tokens, turn.response_text, turn.return_, turn.advantage) == \
        ([], [], "", 0.0, 0.0)
    with pytest.raises(RecordError, match=r"unknown fields \['reward'\]"):
        Turn.from_dict({"turn": 0, "parsed": {}, "verdict": {}, "reward": 1.0})
    with pytest.raises(RecordError, match=r"without \['verdict'\]"):
        Turn.from_dict({"turn": 0, "parsed": {}})
    with pytest.raises(RecordError, match="no verdict/parsed objects"):
        Turn.from_dict({"turn": 0, "parsed": {}, "verdict": "correct"})
    with pytest.raises(RecordError, match=r"missing \['traj_index'\]"):
        Trajectory.from_dict({"task_id": "L1/x", "turns": []})
    traj = Trajectory.from_dict({"task_id": "L1/x", "traj_index": 3, "turns": []})
    assert (traj.step, traj.seed) == (0, 0)


def test_a_file_of_the_earlier_version_reads_back_and_writes_out_byte_for_byte(tmp_path):
    trajectories, report = read_trajectories(OLD_FILE, one_evaluation=True)
    assert (report.lines, report.accepted, report.problems) == (2, 2, [])
    assert [(t.task_id, t.traj_index, t.step, t.seed) for t in trajectories] == [("L1/1_LeakyReLU", 0, 3, 7),
                                                                                  ("L1/1_LeakyReLU", 1, 3, 7)]
    assert [[t.status for t in traj.turns] for traj in trajectories] == [["wrong", "correct"],
                                                                         ["compile_error", "flagged"]]
    assert [[t.speedup for t in traj.turns] for traj in trajectories] == [[None, 1.5], [None, None]]
    # the saved scores are today's scores, and re-scoring gives the saved returns and advantages
    assert all(t.score == turn_score(t, RewardConfig()) for traj in trajectories for t in traj.turns)
    rescored = rescore(trajectories, RewardConfig(), AdvantageConfig())
    assert [t.to_dict() for t in rescored] == [t.to_dict() for t in trajectories]
    assert any(t.advantage != 0 for traj in trajectories for t in traj.turns)
    again = write_trajectories(step_path(tmp_path / "trajectories", 3), trajectories)
    assert again == tmp_path / "trajectories" / "step_000003.jsonl"
    assert again.read_bytes() == OLD_FILE.read_bytes()


def test_one_evaluation_refuses_duplicates_and_mixed_steps(tmp_path):
    trajectories, _ = read_trajectories(OLD_FILE)
    lines = OLD_FILE.read_text().splitlines()
    path = tmp_path / "dup.jsonl"
    path.write_text("\n".join(lines + [lines[0]]) + "\n")
    assert len(read_trajectories(path)[0]) == 3                       # any file: every record
    kept, report = read_trajectories(path, one_evaluation=True)       # one evaluation's samples: no duplicate
    assert len(kept) == 2 and report.accepted == 2 and "duplicate trajectory L1/1_LeakyReLU #0" in report.describe()
    trajectories[1].step = 4
    write_trajectories(tmp_path / "mixed.jsonl", trajectories)
    assert len(read_trajectories(tmp_path / "mixed.jsonl")[0]) == 2
    with pytest.raises(ValueError, match="mixes trajectories of steps"):
        read_trajectories(tmp_path / "mixed.jsonl", one_evaluation=True)
    with pytest.raises(FileNotFoundError):
        read_trajectories(tmp_path / "absent.jsonl")


def test_the_writer_replaces_a_file_whole(tmp_path):
    trajectories, _ = read_trajectories(OLD_FILE)
    path = write_trajectories(tmp_path / "t.jsonl", trajectories)
    write_trajectories(path, trajectories[:1])
    assert [json.loads(line)["traj_index"] for line in path.read_text().splitlines()] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
