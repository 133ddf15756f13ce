"""Exact resume: a run SIGKILLed during sampling, evaluation, the update and the checkpoint write, restarted each
time on the same workdir, ends with the same parameters, trajectories and losses as an uninterrupted run.

Subprocess runs of the tiny config, starting from the warm-started tiny policy (cached HF checkpoint) with the
ParseOnlyEvaluatorFake (no nvcc: the real evaluator's kill + resume is in test_train_e2e.py).
"""
import json
import signal

import jax
import numpy as np
import pytest

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import logs

import trainer_fakes

pytestmark = pytest.mark.slow

STEPS = 4
# (phase, step) of each successive kill; the last run finishes.
KILLS = [("sampling", 1), ("evaluation", 2), ("update", 3), ("checkpoint", 4)]


def _overrides(warm_dir, **more):
    base = {"model.shape": "", "model.hf_checkpoint": str(warm_dir), "warm_start.steps": 0,
            "total_steps": STEPS, "ckpt.max_to_keep": 0, "log.progress": False}
    base.update(more)
    return base


def _trajectories(workdir):
    out = {}
    for path in sorted((workdir / "trajectories").glob("step_*.jsonl")):
        out[path.name] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def _final_state(workdir):
    ck = ckpt_lib.Checkpointer(workdir / "checkpoints", ckpt_lib.CheckpointConfig(async_save=False))
    step = ck.latest_step()
    import orbax.checkpoint as ocp
    restored = ck.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                                meta=ocp.args.JsonRestore()))
    ck.close()
    return step, restored


def _deterministic(metrics):
    return {k: v for k, v in metrics.items() if not k.split("/", 1)[-1].startswith(("time/", "perf/"))}


@pytest.fixture(scope="module")
def warm_dir():
    return trainer_fakes.warm_tiny_checkpoint()


def test_killed_at_every_phase_resumes_to_the_same_run(tmp_path, warm_dir):
    reference = tmp_path / "reference"
    done = trainer_fakes.run_driver(reference, _overrides(warm_dir))
    assert done.returncode == 0, done.stdout[-4000:]

    interrupted = tmp_path / "interrupted"
    for phase, step in KILLS:
        run = trainer_fakes.run_driver(interrupted, _overrides(warm_dir, **{"debug.kill_at_phase": phase,
                                                                            "debug.kill_at_step": step}))
        assert run.returncode == -signal.SIGKILL, f"expected a SIGKILL during {phase} of step {step}:\n" + \
            run.stdout[-4000:]
        assert f"SIGKILL during {phase} of step {step}" in run.stdout
    final = trainer_fakes.run_driver(interrupted, _overrides(warm_dir))
    assert final.returncode == 0, final.stdout[-4000:]
    assert "resuming" in final.stdout

    # The same trajectories (tokens, log-probs, verdicts, scores, advantages) at every step ...
    assert _trajectories(reference) == _trajectories(interrupted)
    assert len(_trajectories(reference)) == STEPS
    # ... the same losses and statistics (the last line of each step wins in metrics.jsonl) ...
    ref_metrics, int_metrics = logs.read_metrics(reference), logs.read_metrics(interrupted)
    assert sorted(ref_metrics) == sorted(int_metrics) == list(range(1, STEPS + 1))
    for step in ref_metrics:
        assert _deterministic(ref_metrics[step]) == _deterministic(int_metrics[step]), step
    # ... and bit-identical parameters and optimiser state at the end.
    (ref_step, ref_state), (int_step, int_state) = _final_state(reference), _final_state(interrupted)
    assert ref_step == int_step == STEPS
    leaves_a = jax.tree_util.tree_flatten_with_path(ref_state["state"])[0]
    leaves_b = jax.tree.leaves(int_state["state"])
    assert len(leaves_a) == len(leaves_b) > 10
    for (path, a), b in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))
    assert ref_state["meta"]["task_sampler"] == int_state["meta"]["task_sampler"]
    # the run learned something: the parameters moved away from the starting policy
    assert int(np.asarray(int_state["state"]["updates"])) == 2 * STEPS
