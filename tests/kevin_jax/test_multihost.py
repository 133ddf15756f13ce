"""Multi-host: two processes on this CPU (2 fake devices each) joined by jax.distributed run the RL loop; each rolls
out its share of the step's tasks, results are gathered for the update, process 0 writes the logs."""
import json
import socket

import pytest

from kevin_jax import logs

import trainer_fakes

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_train_together(tmp_path):
    warm = trainer_fakes.warm_tiny_checkpoint()
    port = _free_port()
    workdir = tmp_path / "run"
    procs = []
    for pid in range(2):
        overrides = {"model.shape": "", "model.hf_checkpoint": str(warm), "warm_start.steps": 0,
                     "total_steps": 2, "log.progress": False, "rl.tasks_per_step": 2,
                     "mesh.coordinator_address": f"localhost:{port}", "mesh.num_processes": 2,
                     "mesh.process_id": pid}
        procs.append(trainer_fakes.run_driver(workdir, overrides, devices=2, wait=False))
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=1200)
            outputs.append(out)
    finally:
        for p in procs:
            trainer_fakes.reap(p)
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    results = [json.loads(out.split("RESULT ", 1)[1].splitlines()[0]) for out in outputs]
    # both hosts computed the same update (one global computation) from the same gathered batch
    key = "compile_only/update0/loss"
    assert results[0][key] == results[1][key]
    assert results[0]["compile_only/update0/tokens"] > 0
    # each step's trajectory file holds every task of the step (one per host), all turns, written once
    for step in (1, 2):
        lines = (workdir / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
        trajs = [json.loads(line) for line in lines]
        assert len({t["task_id"] for t in trajs}) == 2
        assert len(trajs) == 2 * 2 and all(len(t["turns"]) == 2 for t in trajs)
    assert sorted(logs.read_metrics(workdir)) == [1, 2]          # process 0 alone writes metrics
    assert (workdir / "checkpoints" / "2").is_dir()
    assert "rolls out 1 of 2 tasks" in outputs[1]
