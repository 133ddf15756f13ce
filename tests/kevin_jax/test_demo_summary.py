"""analysis/warm_start_demo_summary.py judges the demo's criterion from trajectory files (written here by hand in
the trajectory format the trainer logs), so the device run's verdict does not hinge on a typo."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write_run(workdir, correct_per_step, turns=4, trajectories=5):
    """Per step, the fraction of correct kernels (the first `k` kernels of the step are correct, score 1.3; the rest
    wrong, score 0)."""
    (workdir / "trajectories").mkdir(parents=True)
    for step, fraction in enumerate(correct_per_step, start=1):
        n, lines = turns * trajectories, []
        k = round(fraction * n)
        for j in range(trajectories):
            traj = []
            for t in range(turns):
                ok = j * turns + t < k
                traj.append({"turn": t, "score": 1.3 if ok else 0.0, "advantage": 0.5 - t * 0.25,
                             "stop_reason": "eos", "response_tokens": [1, 2],
                             "response_logprobs": [-0.01 * (t + 1) * step, -0.01 if t < 3 else -4.0],
                             "response_text": "x", "parsed": {"format_error": None},
                             "verdict": {"compiled": True, "correct": ok, "hack_flags": [], "speedup": 1.0}})
            lines.append(json.dumps({"task_id": "L1/1_LeakyReLU", "traj_index": j, "turns": traj}))
        (workdir / "trajectories" / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")


def test_criterion_passes_a_rising_run_and_fails_a_flat_one(tmp_path):
    _write_run(tmp_path / "rising", [0.5, 0.6, 0.7, 0.8, 0.8])
    _write_run(tmp_path / "flat", [0.8, 0.75, 0.85, 0.8, 0.8])
    _write_run(tmp_path / "short", [0.5, 0.9, 0.9])
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "analysis/warm_start_demo_summary.py", str(tmp_path / "rising"),
                           str(tmp_path / "flat"), str(tmp_path / "short"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = json.loads((out / "summary.json").read_text())["criterion"]
    rising = verdicts["rising"]
    assert rising["passed"] and rising["correct_fraction"]["step_1"] == 0.5
    assert abs(rising["correct_fraction"]["last_3_mean"] - 2.3 / 3) < 1e-9          # (0.7 + 0.8 + 0.8) / 3
    assert abs(rising["score_mean"]["delta"] - 1.3 * (2.3 / 3 - 0.5)) < 1e-9
    assert rising["first_turn_correct_fraction"]["step_1"] == 0.6                    # 3 of the 5 first turns
    assert not verdicts["flat"]["passed"] and verdicts["flat"]["judged"]
    assert not verdicts["short"]["judged"] and not verdicts["short"]["passed"]       # 3 steps: too few to judge
    assert "| rising | 5 | correct, all kernels | 0.500 | 0.767 | +0.267 | passed |" in proc.stdout
    assert "not judged" in proc.stdout
    # Per turn: the rising run's step 1 has 10 of 20 kernels correct (trajectories 0-1 whole, trajectory 2's turns 0
    # and 1): turn 0 3 of 5, turn 3 2 of 5; its last 3 steps 14, 16, 16 (turn 0: 4 of 5 each; turn 3: 3, 4, 4 of 5).
    per_turn = json.loads((out / "summary.json").read_text())["per_turn"]["rising"]
    assert per_turn["0"]["correct_fraction"] == pytest.approx([0.6, 0.8])
    assert per_turn["3"]["correct_fraction"] == pytest.approx([0.4, 11 / 15])
    assert per_turn["3"]["advantage_mean"] == pytest.approx([-0.25, -0.25])
    assert "| rising | 3 | 0.40 -> 0.73 | 1.00 -> 1.00 | -0.25 -> -0.25 |" in proc.stdout
    # Sharpness: turn t's tokens drawn at log-probs -0.01 (t + 1) step and -0.01 (turn 3: -4.0, a tail draw).
    assert per_turn["0"]["sampled_nll"] == pytest.approx([0.01, ((0.03 + 0.01) + (0.04 + 0.01) + (0.05 + 0.01)) / 6])
    assert per_turn["3"]["tail_token_fraction"] == pytest.approx([1.0, 1.0])
    assert per_turn["1"]["tail_token_fraction"] == pytest.approx([0.0, 0.0])
    assert "| 0.0100 -> 0.0250 | 0.00 -> 0.00 |" in proc.stdout

    # The criterion's noise: "rising" is 0.5, 0.6, 0.7, 0.8, 0.8: slope 0.08, residuals -0.02 0 0.02 0.04 -0.04.
    noise = json.loads((out / "summary.json").read_text())["noise"]
    assert noise["rising"]["slope_per_step"] == pytest.approx(0.08)
    assert noise["rising"]["residual_sd"] == pytest.approx((0.004 / 3) ** 0.5)
    assert noise["rising"]["criterion_se"] == pytest.approx((0.004 / 3 * 4 / 3) ** 0.5)
    assert noise["rising"]["slope_se"] == pytest.approx((0.004 / 3 / 10) ** 0.5)  # steps 0..4: sum (x - 2)^2 = 10
    assert "| rising | +0.0800 | 0.0115 | 0.037 | 0.042 |" in proc.stdout


def test_turn_advantage_offset_from_tensorboard(tmp_path):
    """analysis/turn_advantage_offset.py: every turn scoring 1.0 on average, gamma 0.4: E[R] = 1.624, 1.56, 1.4,
    1.0 (mean 1.396), so with return std 0.5 the offsets are +0.456, +0.328, +0.008, -0.792."""
    from kevin_jax.logs import MetricWriter

    writer = MetricWriter(tmp_path / "run")
    for step in (1, 2):
        writer.write(step, {**{f"rollout/turn{t}/mean_score": 1.0 for t in range(4)}, "rollout/return_std": 0.5})
    writer.close()
    proc = subprocess.run([sys.executable, "analysis/turn_advantage_offset.py",
                           str(tmp_path / "run" / "tensorboard")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| run | 0 | +0.46 +0.46 | +0.46 | +0.46 |" in proc.stdout
    assert "| run | 3 | -0.79 -0.79 | -0.79 | -0.79 |" in proc.stdout


def _write_speed_run(workdir, fast_per_step, correct_per_step=None, turns=4, trajectories=5, task_id="L1/x"):
    """Every kernel correct (or the first round(c * n) of them), the first `f` of a step's kernels at 1.6x and the rest
    at 0.4x (Kevin's score 0.3 + speedup)."""
    (workdir / "trajectories").mkdir(parents=True)
    n = turns * trajectories
    for step, f in enumerate(fast_per_step, start=1):
        k = n if correct_per_step is None else round(correct_per_step[step - 1] * n)
        lines = []
        for j in range(trajectories):
            traj = []
            for t in range(turns):
                i = j * turns + t
                ok, speedup = i < k, 1.6 if i < f else 0.4
                traj.append({"turn": t, "score": 0.3 + speedup if ok else 0.0, "advantage": 0.0, "stop_reason": "eos",
                             "response_tokens": [1], "response_logprobs": [-0.01], "response_text": "x",
                             "parsed": {"format_error": None},
                             "verdict": {"compiled": True, "correct": ok, "hack_flags": [],
                                         "speedup": speedup if ok else None}})
            lines.append(json.dumps({"task_id": task_id, "traj_index": j, "turns": traj}))
        (workdir / "trajectories" / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")


def test_speed_metrics_and_the_speed_criterion(tmp_path):
    _write_speed_run(tmp_path / "faster", [2, 4, 8, 10, 10])
    _write_speed_run(tmp_path / "flat", [2, 2, 3, 2, 2])
    _write_speed_run(tmp_path / "faster_but_wrong", [2, 4, 8, 10, 10], correct_per_step=[1, 1, 0.9, 0.9, 0.9])
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "analysis/warm_start_demo_summary.py", str(tmp_path / "faster"),
                           str(tmp_path / "flat"), str(tmp_path / "faster_but_wrong"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    step1 = summary["steps"]["faster"][0]["speed"]
    # step 1: 2 of 20 correct kernels at 1.6x, 18 at 0.4x
    assert step1["mean_speedup"] == pytest.approx(0.1 * 1.6 + 0.9 * 0.4)
    assert step1["fast_1"] == pytest.approx(0.1) and step1["fast_1.5"] == pytest.approx(0.1)
    assert step1["turn0/fast_1"] == pytest.approx(0.2) and step1["turn2/fast_1"] == 0.0    # kernels 0 and 1
    assert step1["turn0/mean_speedup"] == pytest.approx((1.6 + 4 * 0.4) / 5)
    crit = summary["speed_criterion"]
    faster = crit["faster"]
    assert faster["passed"]
    assert faster["fast_1"]["delta"] == pytest.approx((0.4 + 0.5 + 0.5) / 3 - 0.1)
    assert faster["mean_speedup"]["delta"] == pytest.approx((0.88 + 1.0 + 1.0) / 3 - 0.52)
    assert not crit["flat"]["passed"] and crit["flat"]["judged"]
    # speed up, but 10% fewer correct kernels: the correct fraction fell by more than 0.05
    assert not crit["faster_but_wrong"]["passed"]
    assert crit["faster_but_wrong"]["correct_fraction"]["delta"] == pytest.approx(-0.1)
    assert summary["speed_noise"]["faster"]["fast_1"]["slope_per_step"] == pytest.approx(0.11)
    assert summary["speed_per_turn"]["faster"]["0"]["fast_1"] == pytest.approx([0.2, (0.4 + 0.6 + 0.6) / 3])
    assert "| faster | 5 | mean speedup of correct kernels | 0.520 | 0.960 | +0.440 | passed |" in proc.stdout
    assert "| flat | 5 | mean speedup of correct kernels |" in proc.stdout and "failed" in proc.stdout
    assert (out / "speed.png").exists()


def test_demo_curves_reads_and_plots_the_speed_scalars(tmp_path):
    """analysis/demo_curves.py --plot speed: the trainer's rollout/speed/* scalars as block means and a PNG."""
    from kevin_jax.logs import MetricWriter

    writer = MetricWriter(tmp_path / "run")
    for step, (speedup, fast) in enumerate(((0.4, 0.1), (0.6, 0.3), (0.8, 0.5)), start=1):
        writer.write(step, {"rollout/speed/mean_speedup": speedup, "rollout/speed/fast_1": fast,
                            "rollout/speed/turn0/fast_1": fast, "rollout/speed/turn1/fast_1": fast / 2})
    writer.close()
    png = tmp_path / "speed.png"
    proc = subprocess.run([sys.executable, "analysis/demo_curves.py", str(tmp_path / "run" / "tensorboard"),
                           "--block", "1", "--plot", "speed", "--out", str(png)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| run | mean speedup of correct kernels | 0.40 0.60 0.80 |" in proc.stdout
    assert "| run | later-turn fast_1 (turn 2) | 0.05 0.15 0.25 |" in proc.stdout
    assert png.exists()


def test_the_fast_variant_share_uses_the_measured_pairs(tmp_path):
    """With --speedups, the criterion's fast share is the share of correct kernels at or above the geometric mean of
    their task's measured slow and fast speedups (here sqrt(0.4 * 1.6) = 0.8), only over tasks with a pair."""
    _write_speed_run(tmp_path / "faster", [2, 4, 8, 10, 10], task_id="L1/x")
    measured = {"solutions": {"L1/x": {"slow": {"correct": True, "speedup": 0.4},
                                       "fast": {"correct": True, "speedup": 1.6}},
                              "L1/close": {"a": {"correct": True, "speedup": 1.0},
                                           "b": {"correct": True, "speedup": 1.2}},
                              "L1/broken": {"a": {"correct": True, "speedup": 0.2}, "b": {"correct": False}}}}
    path = tmp_path / "speedups.json"
    path.write_text(json.dumps(measured))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "analysis/warm_start_demo_summary.py", str(tmp_path / "faster"),
                           "--speedups", str(path), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 tasks with a pair" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"]["faster"][0]["speed"]["fast_variant"] == pytest.approx(0.1)
    crit = summary["speed_criterion"]["faster"]
    assert crit["fast_share_is"] == "fast_variant" and crit["passed"]
    assert crit["fast_share"]["delta"] == pytest.approx((0.4 + 0.5 + 0.5) / 3 - 0.1)
    assert "| faster | 5 | fast-variant share | 0.100 | 0.467 | +0.367 |" in proc.stdout


def test_pace_per_step_and_per_minute(tmp_path):
    """Multi-turn against single-turn on equal terms: a run that rises over more steps but takes 3 minutes a step
    ("steady") against one that jumps in a minute a step and stays ("plateau"); minutes come from TensorBoard's
    time/step, gains over the 5 steps and the 10 minutes both runs have; a run without TensorBoard files gets no
    minutes and no per-minute numbers."""
    from kevin_jax.logs import MetricWriter

    for name, fast, seconds in (("steady", [2, 4, 8, 10, 10], 180.0), ("plateau", [2, 8] + [8] * 8, 60.0)):
        _write_speed_run(tmp_path / name, fast)
        writer = MetricWriter(tmp_path / name)
        for step in range(1, len(fast) + 1):
            writer.write(step, {"time/step": seconds})
        writer.close()
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "analysis/warm_start_demo_summary.py", str(tmp_path / "steady"),
                           str(tmp_path / "plateau"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pace = json.loads((out / "summary.json").read_text())["pace"]
    assert pace["common_steps"] == 5 and pace["common_minutes"] == pytest.approx(10.0)
    steady, plateau = pace["runs"]["steady"], pace["runs"]["plateau"]
    assert steady["minutes"] == pytest.approx(15.0) and plateau["minutes_per_step"] == pytest.approx(1.0)
    # fast share = fast_1 = f / 20 (no measured pairs); steady reaches 0.4 at step 3 (9 min), plateau at step 2
    assert steady["fast_share/per_step"] == pytest.approx((0.5 - 0.1) / 4)
    assert plateau["fast_share/per_step"] == pytest.approx((0.4 - 0.1) / 4)
    assert steady["fast_share/per_minute"] == pytest.approx((0.4 - 0.1) / 9)
    assert plateau["fast_share/per_minute"] == pytest.approx((0.4 - 0.1) / 10)
    assert steady["fast_share/minutes_to_margin"] == pytest.approx(9.0)
    assert plateau["fast_share/minutes_to_margin"] == pytest.approx(2.0)
    # mean speedup 0.4 + 1.2 f / 20: +0.15 needs f >= 4.5
    assert steady["mean_speedup/minutes_to_margin"] == pytest.approx(9.0)
    assert steady["fast_share/last_3"] == pytest.approx(28 / 60) and plateau["fast_share/last_3"] == pytest.approx(0.4)
    assert "| steady | 5 | 15.0 | 3.00 |" in proc.stdout
    assert (out / "speed_minutes.png").exists()

    _write_speed_run(tmp_path / "untimed", [2, 4, 8, 10, 10])
    proc = subprocess.run([sys.executable, "analysis/warm_start_demo_summary.py", str(tmp_path / "steady"),
                           str(tmp_path / "untimed"), "--out", str(tmp_path / "out2")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pace = json.loads((tmp_path / "out2" / "summary.json").read_text())["pace"]
    assert pace["common_minutes"] is None and pace["runs"]["untimed"]["minutes"] is None
    assert pace["runs"]["steady"]["fast_share/per_minute"] is None
    assert pace["runs"]["untimed"]["fast_share/per_step"] == pytest.approx(0.1)
