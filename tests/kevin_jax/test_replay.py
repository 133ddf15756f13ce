"""rl.replay (kevin_jax.env.replay): the tiny CPU config with random weights and the real compile-only evaluator
(nvcc). The sampled text is noise; a replayed real answer of each task follows it and is what the evaluator judges,
so kernels build, the scores and advantages are not zero and the update has a gradient."""
import json
import re

import pytest

import trainer_fakes
from kevin_jax.env import replay

pytestmark = [pytest.mark.slow, pytest.mark.nvcc]

TURNS, TRAJECTORIES, RESPONSE = 1, 3, 24


def test_every_builtin_task_has_answers_of_every_quality():
    answers = replay.builtin_answers()
    assert len(answers) == 17
    for task_id, by_quality in answers.items():
        assert set(by_quality) == set(replay.QUALITIES), task_id
    with pytest.raises(ValueError, match="built-in tasks only"):
        replay.answers_for("builtin", ["L1/19_ReLU"])


def test_trajectories_of_a_task_replay_every_quality():
    runner = replay.ReplayRunner.__new__(replay.ReplayRunner)       # pick needs the answers only
    runner.answers = replay.answers_for("builtin", ["L1/1_LeakyReLU"])
    picked = [runner.pick("L1/1_LeakyReLU", f"step1/L1/1_LeakyReLU/traj{j}/turn0") for j in range(3)]
    assert [a.quality for a in picked] == list(replay.QUALITIES)
    assert all(a.task_id == "L1/1_LeakyReLU" and "```python" in a.text for a in picked)


def test_replayed_answers_reach_the_evaluator_and_the_update_has_a_gradient(tmp_path):
    overrides = {"rl.replay": "builtin", "model.shape": "tiny", "warm_start.steps": 0, "total_steps": 1,
                 "rl.tasks_per_step": 1, "rl.updates_per_batch": 1, "env.num_trajectories": TRAJECTORIES,
                 "env.num_turns": TURNS, "env.max_response_tokens": RESPONSE, "ckpt.enabled": False,
                 # a torch extension's build took over 300 s on a 2-core box running other work: a timed-out build
                 # would read as a compile error
                 "eval.compile_timeout_s": 1500.0}
    done = trainer_fakes.run_driver(tmp_path / "run", overrides, real_evaluator=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-6000:]
    # everything the run logs says replay
    lines = [l for l in done.stdout.splitlines() if re.match(r"(INFO|WARNING|ERROR) ", l)]
    assert lines and all("[replay]" in l for l in lines), [l for l in lines if "[replay]" not in l][:5]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result and all(k.startswith("replay/compile_only/") for k in result)

    replayed = {r["request_id"]: r for r in map(json.loads, open(tmp_path / "run" / "replay" / "step_000001.jsonl"))}
    trajectories = [json.loads(l) for l in open(tmp_path / "run" / "trajectories" / "step_000001.jsonl")]
    turns = [t for tr in trajectories for t in tr["turns"]]
    assert len(turns) == len(replayed) == TRAJECTORIES * TURNS
    qualities = set()
    for turn in turns:
        assert len(turn["response_tokens"]) == RESPONSE and turn["stop_reason"] == "length"   # EOS ignored
        answer = replayed[turn["verdict"]["request_id"]]
        qualities.add(answer["quality"])
        # random weights never write a kernel that compiles: these verdicts are the replayed answers'
        assert turn["verdict"]["compiled"] is (answer["quality"] != "compile_error"), (answer, turn["verdict"])
        assert answer["quality"] == "compile_error" or turn["parsed"]["code"]           # the judged answer, parsed
        # compile-only: a kernel that compiled scores rl.compile_only_score (0.3) in the returns, one that did not 0
        if turn["verdict"]["compiled"]:
            assert turn["return"] == pytest.approx(0.3) and turn["advantage"] > 0, turn
        else:
            assert turn["return"] == 0.0 and turn["advantage"] < 0, turn
    assert qualities == set(replay.QUALITIES)
    assert result["replay/compile_only/rollout/advantage_std"] > 0
    assert result["replay/compile_only/update0/tokens"] > 0
    assert result["replay/compile_only/update0/grad_norm"] > 0
