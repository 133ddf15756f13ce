"""The tiny CPU config end to end, as a user runs it: launch/train.py with real compile-only verdicts (nvcc), a
SIGKILL in the middle of an update (tests/kevin_jax/kill_at_phase.py, which runs launch/train.py), the command again
resuming, and TensorBoard holding the step scalars."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_jax import logs

import trainer_fakes

pytestmark = [pytest.mark.slow, pytest.mark.nvcc]

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
# Scalars TensorBoard must hold for every step (compile-only runs tag everything compile_only/).
EXPECTED = [f"rollout/turn{t}/{m}" for t in (0, 1) for m in ("correct_rate", "compiled_rate", "mean_score")] + [
    "rollout/score_mean", "rollout/correct_rate", "rollout/best_of_trajectory/score_mean",
    "rollout/best_of_trajectory/correct_rate", "rollout/return_mean", "rollout/return_std",
    "rollout/advantage_mean", "rollout/advantage_std", "rollout/response_length_mean",
    "rollout/response_length_max", "rollout/response_clipped_fraction", "rollout/not_okay_ratio",
    "update0/loss", "update0/entropy", "update0/kl_ref", "update0/approx_kl_old", "update0/ratio_clip_fraction",
    "update0/grad_norm", "update0/learning_rate", "update0/logprob_mismatch_abs", "update1/ratio_clip_fraction",
    "time/sampling", "time/evaluation", "time/update", "time/step", "perf/generated_tokens_per_s",
    "time/episode", "perf/episode_wall_over_max", "time/gradients", "time/optimizer", "time/checkpoint",
    "time/checkpoint_wait", "mem/host_rss_gb", "mem/host_rss_peak_gb", "mem/node_used_gb"]


def _launch(workdir, *flags, kill_at=None):
    # The config's own warm start ran once to make this checkpoint (trainer_fakes.warm_tiny_checkpoint, the same
    # code path); starting from it saves CI from repeating those minutes.
    warm = trainer_fakes.warm_tiny_checkpoint()
    program = [str(REPO / "launch" / "train.py")] if kill_at is None else [
        str(REPO / "tests" / "kevin_jax" / "kill_at_phase.py"), f"--kill_at_phase={kill_at[0]}",
        f"--kill_at_step={kill_at[1]}"]
    cmd = [sys.executable, *program, "--config=configs/tiny_cpu.py",
           f"--workdir={workdir}", f"--config.total_steps={STEPS}", "--config.model.shape=",
           f"--config.model.hf_checkpoint={warm}", "--config.warm_start.steps=0", *flags]
    proc = subprocess.Popen(cmd, cwd=REPO, env=trainer_fakes.driver_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=1500)
    finally:
        trainer_fakes.reap(proc)
    return proc.returncode, out


def test_tiny_config_trains_is_killed_resumes_and_logs(tmp_path):
    workdir = tmp_path / "tiny"
    code, out = _launch(workdir, kill_at=("update", 2))
    assert code == -signal.SIGKILL, out[-5000:]
    assert "[compile-only] step 1/3" in out, out[-5000:]
    code, out = _launch(workdir)
    assert code == 0, out[-5000:]
    assert "resuming" in out and "[compile-only] step 3/3" in out and "[compile-only] step 1/3" not in out

    scalars = logs.read_scalars(workdir / "tensorboard")
    for name in EXPECTED:
        tag = "compile_only/" + name
        assert tag in scalars, f"{tag} missing; have {sorted(scalars)[:80]}"
        assert sorted(step for step, _ in scalars[tag]) == [1, 2, 3], tag      # step 2 once: restart purged
    assert not any(tag.startswith(("rollout/", "update0/")) for tag in scalars)   # every tag says compile_only
    # once per process: its start-up, and the resumed one's restore (killed in step 2: restored after step 1)
    assert [step for step, _ in scalars["compile_only/time/startup"]] == [1, 2]
    assert [step for step, _ in scalars["compile_only/time/restore"]] == [2]

    metrics = logs.read_metrics(workdir)
    assert sorted(metrics) == [1, 2, 3]
    warm = json.loads((trainer_fakes.warm_tiny_checkpoint() / "warm_start.json").read_text())
    assert warm["warm_start/last_nll"] < 0.05 < 5 < warm["warm_start/first_nll"]
    # the warm-started policy writes its kernel at turn 0, so some turns score and advantages are not all zero
    assert any(m["compile_only/rollout/advantage_std"] > 0 for m in metrics.values())
    assert any(m["compile_only/update0/tokens"] > 0 for m in metrics.values())
    verdicts = []
    for step in (1, 2, 3):
        for line in (workdir / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines():
            traj = json.loads(line)
            assert traj["step"] == step and len(traj["turns"]) == 2
            for turn in traj["turns"]:
                assert len(turn["response_tokens"]) == len(turn["response_logprobs"]) > 0
                verdicts.append(turn["verdict"])
    assert all(v["mode"] == "compile_only" and v["correct"] is None for v in verdicts)
    # real nvcc builds happened: the warm-started policy writes kernels that compile
    assert any(v["compiled"] for v in verdicts), [v.get("compile_log", "")[:300] for v in verdicts][:4]
    assert any(v["stage_times"].get("compile", 0) > 0 or v["meta"].get("cache_hit") for v in verdicts
               if v["compiled"])
