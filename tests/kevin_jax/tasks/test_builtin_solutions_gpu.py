"""The slowest correct built-in solutions on a GPU: the naive GEMMs (~9 ms a call on an H100, so one short group of
timed reps) are judged correct with no hack flag, and the judge's check of the last timed call's output passes.
A retried gate group used to shift the worker's input rotation, so the judge compared that output with the wrong
input set and flagged these honest kernels timed_output_mismatch (docs/LOG.md, "timing under load on one H100")."""
import pytest

from cuda_eval.api import EvalConfig, EvalRequest, Evaluator
from kevin_jax.tasks import builtin_solutions, load_builtin_tasks

pytestmark = pytest.mark.gpu

NAIVE_GEMMS = ["L1/5_Matmul_with_transposed_B", "L2/1_Gemm_BiasAdd_ReLU_Scaling", "L2/6_Gemm_ScaledSigmoid_Sum"]


def test_slow_naive_gemms_pass_the_timed_output_check():
    tasks = load_builtin_tasks().by_id()
    sols = [s for s in builtin_solutions() if s.task_id in NAIVE_GEMMS and s.name == "correct_naive"]
    assert len(sols) == len(NAIVE_GEMMS)
    requests = [EvalRequest(task_id=s.task_id, task_source=tasks[s.task_id].source,
                            response=f"```python\n{s.source}\n```", request_id=s.task_id) for s in sols]
    with Evaluator(EvalConfig(devices="0")) as ev:
        results = ev.evaluate(requests)
    problems = [f"{r.task_id}: correct={r.correct} flags={r.hack_flags} check={r.meta.get('timed_output_check')} "
                f"gate={(r.timing or {}).get('gate')} error={(r.runtime_error or '')[:200]!r}"
                for r in results
                if not (r.correct and not r.hack_flags and r.meta.get("timed_output_check") == "passed")]
    assert not problems, "\n".join(problems)
    assert all(r.timing["median_ms"] > 1.0 for r in results)  # slow indeed: few reps, one short gate group
