"""Responses produced elsewhere: reading the JSONL (every bad line counted and reported, unknown tasks an error),
evaluation through the same parse, evaluator and metrics (with an evaluator fake, and with the real nvcc in
compile-only mode)."""
import json
import sys
from pathlib import Path

import pytest
from kevin_env_fakes import EvaluatorFake

from cuda_eval.api import EvalConfig, Evaluator
from kevin_jax.reward import RewardConfig
from kevin_jax.evaluation import pipeline
from kevin_jax.evaluation.external import evaluate_external, load_external
from kevin_jax.evaluation.metrics import compute_metrics
from kevin_jax.rl.advantages import AdvantageConfig
from kevin_jax.tasks import builtin_solutions, load_builtin_tasks

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from configs import tiny_cpu  # noqa: E402

TASKS = load_builtin_tasks().by_id()
SOLUTIONS = {(s.task_id, s.kind): s.source for s in builtin_solutions()}
RELU, GEMM = "L1/1_LeakyReLU", "L2/6_Gemm_ScaledSigmoid_Sum"


def answer(code: str, summary: str = "done") -> str:
    return f"Here is my kernel.\n\n```python\n{code}\n```\n\nSummary: {summary}"


def write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def good_rows():
    return [
        {"task_id": RELU, "turn": 0, "response": answer(SOLUTIONS[(RELU, "wrong")]), "model": "other-llm"},
        {"task_id": RELU, "turn": 1, "response": answer(SOLUTIONS[(RELU, "correct")], "SPEEDUP=2.0")},
        {"task": RELU, "trajectory": 1, "turn": 0, "response": answer(SOLUTIONS[(RELU, "correct")]),
         "usage": {"tokens": 10}},
        {"task_id": GEMM, "traj_index": 0, "turn": 0, "response": answer(SOLUTIONS[(GEMM, "correct")],
                                                                             "SPEEDUP=0.5")},
        {"task_id": GEMM, "trajectory": 1, "turn": 1, "response": answer(SOLUTIONS[(GEMM, "correct")],
                                                                         "SPEEDUP=1.5")},   # turn 0 missing
    ]


def test_reading_counts_every_garbage_line(tmp_path):
    rows = good_rows()[:2] + [
        "not json at all",
        "[1, 2, 3]",
        {"turn": 0, "response": "x"},                                  # no task id
        {"task_id": RELU, "turn": -1, "response": "x"},                # negative turn
        {"task_id": RELU, "turn": True, "response": "x"},              # a bool is not a turn
        {"task_id": RELU, "turn": 2, "response": None},                # no text
        {"task_id": RELU, "turn": 1, "response": "again"},             # duplicate of line 2
        "",                                                            # blank: not counted
    ] + good_rows()[2:]
    responses, report = load_external(write(tmp_path / "in.jsonl", rows), TASKS)
    assert [(r.task_id, r.trajectory, r.turn) for r in responses] == [
        (RELU, 0, 0), (RELU, 0, 1), (RELU, 1, 0), (GEMM, 0, 0), (GEMM, 1, 1)]
    assert responses[1].response.endswith("SPEEDUP=2.0") and responses[0].model == "other-llm"
    assert (report.lines, report.accepted, report.garbage_lines) == (12, 5, 7)
    assert [p.line for p in report.problems] == [3, 4, 5, 6, 7, 8, 9]
    reasons = [p.reason for p in report.problems]
    assert "not JSON" in reasons[0] and "not an object" in reasons[1] and "task_id" in reasons[2]
    assert "non-negative integer" in reasons[3] and "non-negative integer" in reasons[4]
    assert "'response' must be a string" in reasons[5] and "duplicate of line 2" in reasons[6]
    notes = " ".join(report.notes)
    assert "ignored keys: ['usage']" in notes and "with missing turns" in notes and "[1]" in notes
    assert "models: ['other-llm']" in notes
    assert "7 garbage line(s) refused" in report.describe()


def test_unknown_tasks_empty_and_missing_files_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"1 task\(s\) that are not in the loaded task set, e.g. \['L3/1_Nope'\]"):
        load_external(write(tmp_path / "a.jsonl", good_rows() + [{"task_id": "L3/1_Nope", "turn": 0,
                                                                  "response": "x"}]), TASKS)
    with pytest.raises(ValueError, match="the file is empty"):
        load_external(write(tmp_path / "b.jsonl", ["", ""]), TASKS)
    with pytest.raises(ValueError, match="no valid record.*2 garbage"):
        load_external(write(tmp_path / "c.jsonl", ["{", {"turn": 0}]), TASKS)
    with pytest.raises(FileNotFoundError, match="input file not found"):
        load_external(tmp_path / "missing.jsonl", TASKS)


def test_evaluation_uses_the_same_parse_evaluator_and_metrics(tmp_path):
    rows = good_rows() + [
        # code written only inside the reasoning does not count: a format error, never sent as a program
        {"task_id": GEMM, "trajectory": 2, "turn": 0,
         "response": "<think>\n" + answer(SOLUTIONS[(GEMM, "correct")]) + "\n</think>\nI am done."},
    ]
    responses, _ = load_external(write(tmp_path / "in.jsonl", rows), TASKS)
    evaluator = EvaluatorFake()
    trajectories = evaluate_external(responses, TASKS, evaluator, RewardConfig(), AdvantageConfig())
    assert len(evaluator.batches) == 1 and len(evaluator.batches[0]) == 6
    assert evaluator.batches[0][0].task_source == TASKS[RELU].source
    assert "class ModelNew" not in evaluator.batches[0][-1].response           # the thought was not sent
    by_key = {(t.task_id, t.traj_index): t for t in trajectories}
    relu = by_key[(RELU, 0)]
    assert [t.verdict["correct"] for t in relu.turns] == [False, True]
    assert relu.turns[1].score == pytest.approx(2.3) and relu.turns[0].return_ == pytest.approx(0.4 * 2.3)
    assert relu.turns[0].response_tokens == [] and relu.turns[0].stop_reason == "unknown"
    assert by_key[(GEMM, 2)].turns[0].parsed["format_error"] is not None
    assert [t.turn for t in by_key[(GEMM, 1)].turns] == [1]
    m = compute_metrics(trajectories)
    # RELU: trajectories [2.0, 1.0] -> performance best@2 = 2.0, avg 1.5; GEMM: [0.5, 1.5, 0] -> best@3 1.5
    assert m["per_task"][RELU]["eager"]["performance"] == pytest.approx({"avg": 1.5, "best@2": 2.0})
    assert m["per_task"][GEMM]["eager"]["performance"] == pytest.approx({"avg": 2.0 / 3, "best@3": 1.5})
    assert m["trajectories_per_task"] == {"min": 2, "max": 3} and m["ks"] == [1, 2]
    # GEMM trajectory 1 has only a turn-1 kernel: after 1 turn it has nothing
    assert m["by_turn"][0]["correct"]["avg"] == pytest.approx((1 / 2 + 1 / 3) / 2)


def test_external_evaluation_through_the_pipeline(tmp_path):
    path = write(tmp_path / "in.jsonl", good_rows() + ["garbage"])
    outcome = pipeline.run(tiny_cpu.get_config(), pipeline.EvalOptions(out_dir=str(tmp_path / "out"),
                                                                       external=str(path)),
                           evaluator=EvaluatorFake())
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert saved["input"]["garbage_lines"] == 1 and saved["meta"]["source_kind"] == "external"
    assert saved["metrics"]["summary"]["correct"]["best@2"] == pytest.approx(1.0)
    assert "1 garbage line(s) refused" in outcome.table and "ignored keys" in outcome.table
    assert (tmp_path / "out" / "turns.png").stat().st_size > 10_000


CORPUS = REPO / "tests" / "cuda_eval" / "corpus"


@pytest.mark.slow
def test_external_responses_with_the_real_evaluator_on_cpu(tmp_path):
    """The real evaluator in CPU mode (g++ builds, sandboxed workers, correctness trials, host-clock timing) on the
    evaluator corpus' C++ ReLU: the honest program is correct with a measured speedup, the same extension returning
    abs(x) is not; the metrics read the real verdicts."""
    from kevin_jax.tasks import Task

    task = Task(1, 1, "cpu_relu", (CORPUS / "tasks" / "cpu_relu.py").read_text())
    honest = (CORPUS / "cpu" / "honest_relu.py").read_text()
    wrong = honest.replace("return cpu_ext.relu_out(x)", "return cpu_ext.abs_out(x)")
    assert wrong != honest
    tasks = {task.task_id: task}
    path = write(tmp_path / "in.jsonl", [{"task_id": task.task_id, "turn": 0, "response": answer(wrong)},
                                         {"task_id": task.task_id, "turn": 1, "response": answer(honest)},
                                         {"task_id": task.task_id, "trajectory": 1, "turn": 0,
                                          "response": answer(wrong)}])
    responses, _ = load_external(path, tasks)
    config = EvalConfig(device_type="cpu", compile_workers=2, run_timeout_s=60, num_correct_trials=3,
                        timing_target_s=0.05, timing_min_reps=5, timing_max_reps=30, timing_input_sets=2,
                        spare_workers=1, retime_speedup_threshold=0)
    with Evaluator(config) as evaluator:
        trajectories = evaluate_external(responses, tasks, evaluator, RewardConfig(), AdvantageConfig())
    first, second = trajectories[0].turns
    assert first.verdict["mode"] == "full" and first.verdict["correct"] is False, first.verdict["feedback"]
    assert second.verdict["correct"] is True and second.verdict["speedup"] > 0, second.verdict["feedback"]
    speedup = second.verdict["speedup"]
    m = compute_metrics(trajectories)
    assert m["mode"] == "full" and m["summary"]["correct"] == {"avg": 0.5, "best@1": 0.5, "best@2": 1.0}
    assert m["summary"]["eager"]["performance"]["best@2"] == pytest.approx(speedup)
    assert m["by_turn"][0]["correct"]["best@2"] == 0.0
    assert [r["correct_rate"] for r in m["kernels_by_turn"]] == [0.0, 1.0]
