"""Exact resume: a run SIGKILLed during sampling, evaluation, the update and the checkpoint write, restarted each
time on the same workdir, ends with the same parameters, trajectories and losses as an uninterrupted run; with the
optimiser state in host memory (optim.offload="pinned_host") too, killed where that state is in flight (between the
two updates of a step, and while it is being written).

Subprocess runs of the tiny config, starting from the warm-started tiny policy (cached HF checkpoint) with the
ParseOnlyEvaluatorFake (no nvcc: the real evaluator's kill + resume is in test_train_e2e.py).
"""
import json
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import logs

import trainer_fakes

pytestmark = pytest.mark.slow

STEPS = 4
# (phase, step) of each successive kill; the last run finishes. Offloaded: the phases where the host state is live.
KILLS = {"none": [("sampling", 1), ("evaluation", 2), ("update", 3), ("checkpoint", 4)],
         "pinned_host": [("update", 2), ("checkpoint", 3)]}


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
    state, meta = ck.restore_numpy(step)
    ck.close()
    return step, {"state": state, "meta": meta}


def _starting_weight(warm_dir: Path, name: str) -> np.ndarray:
    from safetensors.numpy import load_file

    tensors = {}
    for path in sorted(Path(warm_dir).glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors[name]


def _deterministic(metrics):
    return {k: v for k, v in metrics.items() if not k.split("/", 1)[-1].startswith(("time/", "perf/", "mem/"))}


@pytest.fixture(scope="module")
def warm_dir():
    return trainer_fakes.warm_tiny_checkpoint()


@pytest.mark.parametrize("offload", ["none", "pinned_host"])
def test_killed_at_every_phase_resumes_to_the_same_run(tmp_path, warm_dir, offload):
    reference = tmp_path / "reference"
    done = trainer_fakes.run_driver(reference, _overrides(warm_dir, **{"optim.offload": offload}))
    assert done.returncode == 0, done.stdout[-4000:]

    interrupted = tmp_path / "interrupted"
    for phase, step in KILLS[offload]:
        run = trainer_fakes.run_driver(interrupted, _overrides(warm_dir, **{"optim.offload": offload}),
                                       kill_at=(phase, step))
        assert run.returncode == -signal.SIGKILL, f"expected a SIGKILL during {phase} of step {step}:\n" + \
            run.stdout[-4000:]
        assert f"SIGKILL during {phase} of step {step}" in run.stdout
    final = trainer_fakes.run_driver(interrupted, _overrides(warm_dir, **{"optim.offload": offload}))
    assert final.returncode == 0, final.stdout[-4000:]
    assert "resuming" in final.stdout and "checkpoint restored in" in final.stdout

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
    assert int(np.asarray(int_state["state"]["updates"])) == 2 * STEPS
    # the run learned something: the parameters moved away from the starting policy (the offloaded checkpoint holds
    # the float32 master copy, no device copy)
    weights = int_state["state"]["master" if offload == "pinned_host" else "params"]
    assert ("params" in int_state["state"]) == (offload == "none")
    for ours, theirs in (("lm_head", "lm_head.weight"), ("embed_tokens", "model.embed_tokens.weight")):
        leaf = jax.tree.leaves(weights[ours])[0]
        start = _starting_weight(warm_dir, theirs)
        assert leaf.shape == start.shape and leaf.dtype == np.float32
        assert np.abs(leaf - start).max() > 1e-6, f"{ours} did not move"
