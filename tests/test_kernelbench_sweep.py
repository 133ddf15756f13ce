"""benchmarks/kernelbench_sweep.py's candidates: accepted by the kernelbench profile's static rules, one build for
every task, and through the real judge (CPU mode, the C++ twin of the copy kernel) the honest ones are correct and
the wrong ones incorrect, for the output kinds KernelBench has (float32 and int64 tensors, scalars, a non-contiguous
output) and a few it may get (tuples, bool, float64)."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))
from sandbox_fixtures import compile_pool, run_lock, shared_dir, toolchain  # noqa: E402,F401  (the shared pool)


def _sweep():
    spec = importlib.util.spec_from_file_location("kernelbench_sweep", REPO / "benchmarks" / "kernelbench_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sweep = _sweep()

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """{doc}: one forward pass (KernelBench's checker reads "pass" in a docstring as the statement)."""

    def __init__(self, scale: float):
        super(Model, self).__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor):
        return {expr}


rows = 64
cols = 48


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [2.0]
'''
OUTPUTS = {
    "relu": "torch.relu(x) * self.scale",
    "transposed": "(x * self.scale).t()",                                  # a non-contiguous output
    "tuple_mixed": "(torch.relu(x), torch.argmax(x, dim=1), (x > 0, x.double().sum()))",
    "scalar_loss": "torch.mean((x - self.scale) ** 2)",
}


def task(name: str) -> str:
    return TASK.format(doc=name, expr=OUTPUTS[name])


def test_the_candidates_pass_the_kernelbench_static_rules_and_share_one_build():
    from cuda_eval.orchestrator import scoring
    from cuda_eval.static import checks
    from cuda_eval.static.static_record import static_record_specs
    keys = set()
    for name in OUTPUTS:
        for wrong in (False, True):
            program = sweep.copy_candidate(task(name), wrong=wrong)
            flags = [f.to_dict() for f in checks.static_check(program, checks.StaticPolicy.named("kernelbench"))]
            assert scoring.split_flags(flags, "kernelbench")[0] == [], (name, flags)
            specs = static_record_specs(program)
            assert specs is not None and len(specs) == 1, name
            keys.add(specs[0].key())
    assert len(keys) == 1   # the same extension everywhere: compiled once, then cache hits
    with pytest.raises(ValueError):
        sweep.copy_candidate(task("relu") + "\nclass ModelNew: ...\n")


def test_wrong_candidates_are_spread_over_the_levels():
    from kevin_jax.tasks.kernelbench import Task
    tasks = [Task(level, i, f"t{i}", "") for level, n in ((1, 100), (2, 100), (3, 50)) for i in range(n)]
    chosen = sweep.wrong_tasks(tasks, 60)
    per_level = {level: sum(t.level == level and t.task_id in chosen for t in tasks) for level in (1, 2, 3)}
    assert per_level == {1: 24, 2: 24, 3: 12}
    assert len(sweep.wrong_tasks(tasks[:3], 60)) == 3 and sweep.wrong_tasks(tasks, 0) == set()


@pytest.mark.slow
def test_honest_copies_are_correct_and_wrong_ones_incorrect_through_the_judge(compile_pool):  # noqa: F811
    from cuda_eval.api import EvalConfig, EvalRequest, Evaluator
    config = EvalConfig(device_type="cpu", run_timeout_s=60, skip_run_on_static_flags=False, strict=True,
                        num_correct_trials=2, timing_target_s=0.01, timing_min_reps=3, timing_max_reps=5,
                        timing_input_sets=1, retime_speedup_threshold=0, worker_memory_bytes=2 << 30)
    requests = [EvalRequest(name, task(name), sweep.response(sweep.copy_candidate(task(name), wrong=wrong,
                                                                                  backend="cpu")),
                            f"{name}/{'wrong' if wrong else 'honest'}")
                for name in OUTPUTS for wrong in (False, True)]
    with Evaluator(config, compile_pool=compile_pool) as ev:
        results = ev.evaluate(requests)
    for req, r in zip(requests, results):
        got = sweep.verdict_class(r, flags_count=False)
        want = "incorrect" if req.request_id.endswith("wrong") else "ok"
        assert got == want, (req.request_id, r.runtime_error, r.trials[-1:], r.compile_log[-500:])


def test_report_merges_saved_rows_of_split_runs(tmp_path, capsys):
    """--report: the tables of rows from several runs' <out>.jsonl (one per GPU of a split sweep), a (task, kind)
    seen twice (a resumed job) counted once; a row against expectation is listed with its error."""
    import json

    def row(task, level, kind, verdict, expected, error=""):
        return {"task_id": task, "level": level, "kind": kind, "verdict": verdict, "expected": expected,
                "error": error, "run_s": 2.0, "output_bytes": 1 << 20, "device_used_bytes": 3 << 30}

    first = [row("L1/19_ReLU", 1, "honest", "internal_error", "ok", "OSError: File too large"),
             row("L1/19_ReLU", 1, "wrong", "incorrect", "incorrect")]
    second = [row("L1/19_ReLU", 1, "honest", "ok", "ok"), row("L2/5_Conv", 2, "honest", "ok", "ok")]
    paths = []
    for name, rows in (("a.jsonl", first), ("b.jsonl", second)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(tmp_path / name))
    sweep.main(["--report", ",".join(paths)])
    out = capsys.readouterr().out
    assert "3 verdicts of 2 tasks from 2 file(s) (3 on card not recorded)" in out
    assert "| 1 | honest | 1 | 1 | 1 | 0 | 0 |" in out and "| 2 | honest | 1 | 1 | 1 |" in out
    assert "File too large" not in out                 # the resumed row replaced the internal error
    (tmp_path / "c.jsonl").write_text(json.dumps(first[0]) + "\n")
    assert "OSError: File too large" in sweep.report([str(tmp_path / "c.jsonl")])
