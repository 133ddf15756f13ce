"""The multi-turn episode runner with a scripted policy fake (replaying the built-in solutions) and an evaluator
fake."""
import json
import logging
import math

import numpy as np
import pytest
from kevin_env_fakes import EvaluatorFake, ScriptedPolicyFake, chatml_tokenizer, scripted_answer

from kevin_jax.env.episode import EnvConfig, EpisodeRunner, replay, round_seed
from kevin_jax.env.trajectory import LineProblem, Trajectory, Turn, read_trajectories, write_trajectories
from kevin_jax.env.policy import Generation
from kevin_jax.env.prompts import PromptTooLongError
from kevin_jax.reward import RewardConfig
from kevin_jax.reward import discounted_returns
from kevin_jax.rl.advantages import AdvantageConfig, assign_returns, rescore
from kevin_jax.tasks import builtin_solutions, load_builtin_tasks

TASKS = load_builtin_tasks()
TASK_IDS = ["L1/1_LeakyReLU", "L2/6_Gemm_ScaledSigmoid_Sum"]
SOLUTIONS = {(s.task_id, s.kind): s.source for s in builtin_solutions()}
TURN_KEYS = {"turn", "prompt_tokens", "response_tokens", "response_logprobs", "stop_reason", "response_text", "parsed",
             "verdict", "score", "return", "advantage"}


def task_in(prompt_text: str):
    return next(t for t in TASKS.tasks if t.source.strip() in prompt_text)


def kevin_like_script(speedups=(None, 0.8, 1.5, 1.2)):
    """Turn 0: the task's wrong solution; later turns: its correct solution with the given speedups."""
    def script(prompt_text, turn):
        task = task_in(prompt_text)
        speedup = speedups[turn]
        if speedup is None:
            return scripted_answer(SOLUTIONS[(task.task_id, "wrong")], thought=f"SECRET-THOUGHT-{turn}",
                                   summary=f"first try at {task.name}")
        return scripted_answer(SOLUTIONS[(task.task_id, "correct")], thought=f"SECRET-THOUGHT-{turn}",
                               summary=f"fixed it, SPEEDUP={speedup}")
    return script


def make_runner(script, **env_overrides):
    tok = chatml_tokenizer()
    env = EnvConfig(**{"num_turns": 3, "num_trajectories": 4, "max_prompt_tokens": 200_000,
                       "max_response_tokens": 100_000, **env_overrides})
    policy, evaluator = ScriptedPolicyFake(tok, script), EvaluatorFake()
    return EpisodeRunner(policy, evaluator, tok, env, RewardConfig()), policy, evaluator


def tasks():
    by_id = TASKS.by_id()
    return [by_id[i] for i in TASK_IDS]


def test_rounds_are_batched_and_trajectories_follow_contract_4():
    runner, policy, evaluator = make_runner(kevin_like_script(), pipeline_groups=1, overlap=False)
    result = runner.run(tasks(), step=7, seed=11)
    trajs = result.trajectories
    assert len(trajs) == 8 and [len(t.turns) for t in trajs] == [3] * 8
    # one pipeline group: one generate and one evaluate call per round, for the whole batch
    assert len(policy.calls) == 3 and [len(c["prompts"]) for c in policy.calls] == [8, 8, 8]
    assert [c["seed"] for c in policy.calls] == [round_seed(11, 7, r) for r in range(3)]
    assert len({round_seed(11, 7, r) for r in range(3)} | {round_seed(12, 7, 0)}) == 4
    assert all(c["max_new_tokens"] == 100_000 for c in policy.calls)
    assert len(evaluator.batches) == 3 and [len(b) for b in evaluator.batches] == [8, 8, 8]
    ids = [r.request_id for b in evaluator.batches for r in b]
    assert len(set(ids)) == 24 and ids[0] == "step7/L1/1_LeakyReLU/traj0/turn0"
    assert [(r.round, r.live) for r in result.rounds] == [(0, 8), (1, 8), (2, 8)]
    assert all(r.total_s >= r.generate_s + r.evaluate_s for r in result.rounds)      # sequential: no overlap
    assert result.timing.wall_s >= result.timing.sampling_s + result.timing.evaluation_s
    for traj in trajs:
        d = json.loads(json.dumps(traj.to_dict()))
        assert set(d) == {"task_id", "traj_index", "step", "seed", "turns"} and (d["step"], d["seed"]) == (7, 11)
        for turn in d["turns"]:
            assert set(turn) == TURN_KEYS
            assert set(turn["parsed"]) == {"thought", "thought_complete", "code", "summary", "format_error"}
            assert turn["verdict"]["request_id"].endswith(f"/turn{turn['turn']}")


def test_pipeline_groups_split_the_tasks_with_a_seed_per_group_and_round():
    """Two groups (the default): each round is one policy call and one evaluation per group (its tasks'
    trajectories, in order), seeded by (seed, step, round, group); group 0 keeps the one-group seed."""
    runner, policy, evaluator = make_runner(kevin_like_script(), overlap=False)
    assert runner.env.pipeline_groups == 2 and EnvConfig().overlap and EnvConfig().pipeline_groups == 2
    result = runner.run(tasks(), step=7, seed=11)
    assert [len(t.turns) for t in result.trajectories] == [3] * 8
    assert [(t.task_id, t.traj_index) for t in result.trajectories] == [(i, j) for i in TASK_IDS for j in range(4)]
    assert [len(c["prompts"]) for c in policy.calls] == [4] * 6
    assert [c["seed"] for c in policy.calls] == [round_seed(11, 7, r, g) for r in range(3) for g in range(2)]
    assert round_seed(11, 7, 1, 0) == round_seed(11, 7, 1) and len({c["seed"] for c in policy.calls}) == 6
    assert [b[0].request_id for b in evaluator.batches[:2]] == ["step7/L1/1_LeakyReLU/traj0/turn0",
                                                                "step7/L2/6_Gemm_ScaledSigmoid_Sum/traj0/turn0"]
    assert [(r.round, r.live) for r in result.rounds] == [(0, 8), (1, 8), (2, 8)]
    timing = result.timing
    assert (timing.groups, timing.overlap, len(timing.parts)) == (2, False, 6)
    assert [(p.group, p.round) for p in timing.parts] == [(g, r) for r in range(3) for g in range(2)]


def test_prompts_carry_code_summary_and_feedback_never_thoughts():
    runner, policy, evaluator = make_runner(kevin_like_script())
    trajs = runner.run(tasks()).trajectories
    tok = runner.tokenizer
    leaky = trajs[0]
    assert leaky.turns[0].prompt_tokens == runner.renderer.first_turn(tasks()[0].source).token_ids
    second = tok.decode(leaky.turns[1].prompt_tokens, skip_special_tokens=False)
    third = tok.decode(leaky.turns[2].prompt_tokens, skip_special_tokens=False)
    assert "Attempt 1:" in second and "Attempt 2:" not in second
    assert "BUG: slope applied to the positive side" in second          # the earlier code
    assert "first try at LeakyReLU" in second                           # the model's own summary
    assert "Output mismatch" in second                                  # the evaluator's feedback
    assert "Attempt 2:" in third and "Correct. Speedup 0.80x" in third
    for turn in leaky.turns:
        assert "SECRET-THOUGHT" not in tok.decode(turn.prompt_tokens, skip_special_tokens=False)
        assert turn.parsed["thought"].startswith("SECRET-THOUGHT")      # the thought is recorded in the turn
    for batch in evaluator.batches:                                     # and never sent to the evaluator
        assert all("SECRET-THOUGHT" not in r.response and "class ModelNew" in r.response for r in batch)


def test_tokens_logprobs_scores_returns_and_advantages():
    runner, policy, _ = make_runner(kevin_like_script())
    trajs = runner.run(tasks()).trajectories
    reward = RewardConfig()
    assign_returns(trajs, reward, AdvantageConfig())
    for traj in trajs:
        assert [t.score for t in traj.turns] == pytest.approx([0.0, 1.1, 1.8])
        np.testing.assert_allclose([t.return_ for t in traj.turns], discounted_returns([0.0, 1.1, 1.8], reward))
        for t in traj.turns:
            assert t.stop_reason == "eos"
            assert t.response_logprobs == [-0.001 * (k + 1) for k in range(len(t.response_tokens))]
            assert t.response_tokens[-1] == runner.tokenizer.convert_tokens_to_ids("<|im_end|>")
            assert "<|im_end|>" not in t.response_text
    for task_id in TASK_IDS:
        adv = np.array([t.advantage for tr in trajs if tr.task_id == task_id for t in tr.turns])
        assert len(adv) == 12 and abs(adv.mean()) < 1e-9 and adv.std() == pytest.approx(1.0, abs=1e-5)


def test_sampled_token_ids_are_kept_not_retokenised():
    tok = chatml_tokenizer()
    answer = scripted_answer(SOLUTIONS[("L1/1_LeakyReLU", "correct")], summary="kept as sampled")

    class CharSplitPolicy:  # samples "Summary" letter by letter: a valid but non-canonical tokenisation
        def generate(self, prompts, max_new_tokens, seed):
            head, tail = answer.split("Summary: ", 1)
            ids = (tok(head, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(c) for c in "Summary:"]
                   + tok(" " + tail, add_special_tokens=False)["input_ids"])
            return [Generation(list(ids), [0.0] * len(ids), "stop") for _ in prompts]

    runner = EpisodeRunner(CharSplitPolicy(), EvaluatorFake(), tok, EnvConfig(num_turns=1, num_trajectories=1),
                           RewardConfig())
    turn = runner.run(tasks()[:1]).trajectories[0].turns[0]
    assert turn.response_text == answer
    assert turn.response_tokens != tok(answer, add_special_tokens=False)["input_ids"]
    assert tok.decode(turn.response_tokens, skip_special_tokens=False) == answer
    assert turn.parsed["summary"] == "kept as sampled"


@pytest.mark.parametrize("mode,turns", [("never", [4] * 8), ("first_correct", [2] * 8), ("no_improvement", [4] * 8)])
def test_early_stop_modes(mode, turns):
    # scores: wrong, 0.3+0.8, 0.3+1.5, 0.3+1.2: "no_improvement" would stop at turn 3, the last one anyway
    runner, policy, _ = make_runner(kevin_like_script((None, 0.8, 1.5, 1.2)), num_turns=4, early_stop=mode)
    trajs = runner.run(tasks()).trajectories
    assert [len(t.turns) for t in trajs] == turns
    if mode == "first_correct":
        assert sum(len(c["prompts"]) for c in policy.calls) == 16


def test_no_improvement_stops_at_the_first_turn_that_does_not_beat_the_best():
    runner, policy, _ = make_runner(kevin_like_script((None, 1.5, 1.2, 2.0, 3.0)), num_turns=5,
                                    early_stop="no_improvement")
    trajs = runner.run(tasks()).trajectories
    assert [len(t.turns) for t in trajs] == [3] * 8  # wrong, 1.8, 1.5 (no improvement) -> stop
    assert sum(len(c["prompts"]) for c in policy.calls) == 24


def test_budget_drops_earliest_attempts_within_an_episode():
    runner, _, _ = make_runner(kevin_like_script(), num_trajectories=1)
    full = runner.run(tasks()[:1]).trajectories[0]
    budget = len(full.turns[2].prompt_tokens) - 1  # one token short of showing both attempts
    assert budget >= len(full.turns[1].prompt_tokens)
    runner, _, _ = make_runner(kevin_like_script(), num_trajectories=1, max_prompt_tokens=budget)
    traj = runner.run(tasks()[:1]).trajectories[0]
    third = runner.tokenizer.decode(traj.turns[2].prompt_tokens, skip_special_tokens=False)
    assert len(traj.turns[2].prompt_tokens) <= budget
    assert "Attempt 2:" in third and "Attempt 1:" not in third and "first try" not in third


def test_a_trajectory_whose_history_cannot_fit_stops(caplog):
    runner, _, _ = make_runner(kevin_like_script(), num_trajectories=2)
    first = runner.renderer.first_turn(tasks()[0].source)
    runner, policy, _ = make_runner(kevin_like_script(), num_trajectories=2, max_prompt_tokens=len(first.token_ids))
    with caplog.at_level(logging.WARNING):
        trajs = runner.run(tasks()[:1]).trajectories
    assert [len(t.turns) for t in trajs] == [1, 1] and len(policy.calls) == 1
    assert "stops before turn 1" in caplog.text
    runner, _, _ = make_runner(kevin_like_script(), max_prompt_tokens=len(first.token_ids) - 1)
    with pytest.raises(PromptTooLongError):
        runner.run(tasks()[:1])


def test_length_limit_inside_the_thought_is_a_format_failure():
    runner, _, evaluator = make_runner(kevin_like_script(), num_turns=2, num_trajectories=1, max_response_tokens=5)
    traj = runner.run(tasks()[:1]).trajectories[0]
    for turn in traj.turns:
        assert turn.stop_reason == "length" and len(turn.response_tokens) == 5
        assert turn.parsed["thought_complete"] is False and turn.parsed["format_error"]
        assert turn.score == 0.0
    assert evaluator.batches[0][0].response == ""  # nothing outside the thought
    assert "no code" in runner.tokenizer.decode(traj.turns[1].prompt_tokens, skip_special_tokens=False)


def test_jsonl_round_trip_rescore_and_replay(tmp_path):
    runner, _, _ = make_runner(kevin_like_script())
    trajs = runner.run(tasks()).trajectories
    assign_returns(trajs, RewardConfig(), AdvantageConfig())
    path = tmp_path / "traj.jsonl"
    write_trajectories(path, trajs[:5])
    write_trajectories(path, trajs)               # written again: replaced, not appended
    loaded, report = read_trajectories(path, one_evaluation=True)
    assert (report.lines, report.accepted, report.problems) == (8, 8, [])
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in trajs]
    assert not list(tmp_path.glob("*.tmp"))
    assert isinstance(loaded[0], Trajectory)

    same = rescore(loaded, RewardConfig(), AdvantageConfig())
    assert [t.to_dict() for t in same] == [t.to_dict() for t in trajs]
    heavier = rescore(loaded, RewardConfig(correct_weight=1.0, return_aggregation="single_turn"), AdvantageConfig())
    assert [t.score for t in heavier[0].turns] == pytest.approx([0.0, 1.8, 2.5])
    assert [t.return_ for t in heavier[0].turns] == pytest.approx([0.0, 1.8, 2.5])
    assert loaded[0].turns[1].score == pytest.approx(1.1)  # rescore copies

    # The per-turn baseline reaches the rollout: each task's advantages at each turn sum to zero.
    per_turn = rescore(loaded, RewardConfig(), AdvantageConfig(baseline="turn_mean"))
    sums = {}
    for traj in per_turn:
        for t in traj.turns:
            sums[traj.task_id, t.turn] = sums.get((traj.task_id, t.turn), 0.0) + t.advantage
    assert len(sums) > 1 and all(abs(v) < 1e-9 for v in sums.values())
    assert any(abs(a.advantage - b.advantage) > 1e-6 for x, y in zip(same, per_turn) for a, b in zip(x.turns, y.turns))

    all_fast = EvaluatorFake(lambda r: {"correct": True, "speedup": 2.0, "feedback": "Correct."})
    again = replay(loaded, all_fast, TASKS.by_id(), RewardConfig())
    assert len(all_fast.batches) == 1 and len(all_fast.batches[0]) == 24
    assert all("SECRET-THOUGHT" not in r.response for r in all_fast.batches[0])
    assert all(t.score == pytest.approx(2.3) for tr in again for t in tr.turns)
    assert all(t.parsed["thought"].startswith("SECRET-THOUGHT") for tr in again for t in tr.turns)
    with pytest.raises(ValueError, match="unknown task"):
        replay(loaded, all_fast, {}, RewardConfig())


def test_a_turn_is_scored_once_when_played():
    """The runner scores each turn (kevin_jax.reward); returns and advantages read Turn.score and never score again:
    a compile-only run gets its proxy score at play time, and a score set on a turn is what its return is made of."""
    compiled_only = EvaluatorFake(lambda r: {"mode": "compile_only", "correct": None, "speedup": None}
                                  if "WRONG" not in r.response and "// BUG:" not in r.response else
                                  {"mode": "compile_only", "compiled": False, "correct": None, "speedup": None})
    tok = chatml_tokenizer()
    env = EnvConfig(num_turns=3, num_trajectories=2, max_prompt_tokens=200_000, max_response_tokens=100_000)
    runner = EpisodeRunner(ScriptedPolicyFake(tok, kevin_like_script()), compiled_only, tok, env, RewardConfig(),
                           compile_only_score=0.25)
    trajs = runner.run(tasks()).trajectories
    assert [t.score for t in trajs[0].turns] == [0.0, 0.25, 0.25]          # turn 0 did not compile
    trajs[0].turns[2].score = 10.0                                         # whatever the turn was given
    assign_returns(trajs, RewardConfig(gamma=0.5), AdvantageConfig())
    assert [t.return_ for t in trajs[0].turns] == pytest.approx([0.0 + 0.5 * (0.25 + 0.5 * 10.0), 0.25 + 5.0, 10.0])


def test_replay_uses_the_round_loops_request_ids():
    runner, _, _ = make_runner(kevin_like_script())
    trajs = runner.run(tasks(), step=3).trajectories
    evaluator = EvaluatorFake()
    replay(trajs[:1], evaluator, TASKS.by_id(), RewardConfig(), request_prefix="again/")
    assert [r.request_id for r in evaluator.batches[0]] == [
        f"again/step3/{TASK_IDS[0]}/traj0/turn{k}" for k in range(3)]


def test_bad_inputs():
    with pytest.raises(ValueError, match="early_stop"):
        EnvConfig(early_stop="sometimes")
    with pytest.raises(ValueError, match="num_turns"):
        EnvConfig(num_turns=0)
    with pytest.raises(ValueError, match="pipeline_groups"):
        EnvConfig(pipeline_groups=0)
    with pytest.raises(TypeError):
        EnvConfig(num_turn=4)

    class ShortPolicy:
        def generate(self, prompts, max_new_tokens, seed):
            return [Generation([1], [0.0], "eos")]

    runner = EpisodeRunner(ShortPolicy(), EvaluatorFake(), chatml_tokenizer(), EnvConfig(num_trajectories=2),
                           RewardConfig())
    with pytest.raises(RuntimeError, match="returned 1 results for 2 inputs"):
        runner.run(tasks()[:1])
    with pytest.raises(ValueError, match="no tasks"):
        runner.run([])
    with pytest.raises(ValueError):
        Generation([1, 2], [0.0], "eos")
    with pytest.raises(ValueError):
        Generation([1], [0.0], "finished")


def test_read_trajectories_reports_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "L1/1_A", "traj_index": 0, "step": 0, "seed": 0, "turns": []}\n\n{"oops": 1}\n')
    trajectories, report = read_trajectories(path)
    assert [t.task_id for t in trajectories] == ["L1/1_A"]
    assert report.problems == [LineProblem(3, "not a trajectory record (missing ['task_id', 'traj_index', 'turns'])")]
    assert "bad.jsonl: 1 record(s) accepted of 2 line(s), 1 garbage line(s) refused: line 3" in report.describe()
    path.write_text('{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"no valid record in .*bad.jsonl: .*line 1"):
        read_trajectories(path)


@pytest.mark.gpu
@pytest.mark.slow
def test_scripted_policy_with_the_real_evaluator_gives_the_expected_verdicts(tmp_path):
    """The device check (benchmarks/env_scripted.py) on three built-in tasks: wrong solutions incorrect, correct ones
    correct, through the real evaluator."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "benchmarks" / "env_scripted.py"
    out = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "env.json"), "--tasks",
                          "L1/1_LeakyReLU,L1/8_CrossEntropyLoss,L2/5_Conv2d_BatchNorm_Scaling"],
                         capture_output=True, text=True, timeout=1200, env=dict(os.environ))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads((tmp_path / "env.json").read_text())
    assert result["failures"] == 0 and len(result["turns"]) == 6


def test_rollout_scalars_count_contended_timings_among_timed_kernels():
    """rollout/timing_contended_rate: the share of timed (correct) kernels whose verdict says the GPU ran the cached
    reference >1.5x slower than when it was cached (cuda_eval's meta.timing_contended); untimed kernels don't count."""
    from kevin_jax.rl.rollout_stats import rollout_scalars

    def turn(i, speedup, contended=False):
        verdict = {"compiled": True, "correct": speedup is not None, "speedup": speedup, "hack_flags": [],
                   "meta": {"timing_contended": True} if contended else {}}
        return Turn(i, [1], [2], [0.0], "eos", "Okay", {"format_error": None}, verdict)

    trajs = [Trajectory("t", 0, 0, 0, [turn(0, 1.2, contended=True), turn(1, None)]),
             Trajectory("t", 1, 0, 0, [turn(0, 0.8), turn(1, 0.9), turn(2, None, contended=True)])]
    assert rollout_scalars(trajs, 3)["timing_contended_rate"] == pytest.approx(1 / 3)
    assert "timing_contended_rate" not in rollout_scalars([Trajectory("t", 0, 0, 0, [turn(0, None)])], 1)


def test_rollout_scalars_report_each_turns_mean_advantage():
    """rollout/turn{i}/advantage_mean shows a turn pushed down on average (advantage.baseline="mean": the last turn)."""
    from kevin_jax.rl.rollout_stats import rollout_scalars

    def turn(i, correct):
        verdict = {"compiled": True, "correct": correct, "speedup": 1.0 if correct else None, "hack_flags": []}
        return Turn(i, [1], [2], [0.0], "eos", "Okay", {"format_error": None}, verdict)

    def trajs():
        return [Trajectory("t", 0, 0, 0, [turn(0, True), turn(1, True)]),
                Trajectory("t", 1, 0, 0, [turn(0, True), turn(1, False)])]

    kevin = rescore(trajs(), RewardConfig(), AdvantageConfig())     # hand-made turns: scored here
    out = rollout_scalars(kevin, 2)
    assert out["turn1/advantage_mean"] < 0 < out["turn0/advantage_mean"]
    per_turn = rescore(trajs(), RewardConfig(), AdvantageConfig(baseline="turn_mean"))
    out = rollout_scalars(per_turn, 2)
    assert out["turn0/advantage_mean"] == pytest.approx(0.0) and out["turn1/advantage_mean"] == pytest.approx(0.0)


def test_rollout_scalars_report_each_turns_sharpness():
    """rollout/turn{i}/sampled_nll and tail_token_rate show a turn whose samples un-sharpen (as in a failed demo seed:
    later turns drew more tokens from the tail and derailed more often)."""
    from kevin_jax.rl.rollout_stats import TAIL_PROB, rollout_scalars

    def turn(i, logprobs):
        verdict = {"compiled": True, "correct": True, "speedup": 1.0, "hack_flags": []}
        return Turn(i, [1], [2] * len(logprobs), logprobs, "eos", "Okay", {"format_error": None}, verdict)

    tail = math.log(TAIL_PROB) - 0.01
    trajs = [Trajectory("t", 0, 0, 0, [turn(0, [0.0, -0.2]), turn(1, [0.0, 0.0, tail])]),
             Trajectory("t", 1, 0, 0, [turn(0, [-0.1, -0.1]), turn(1, [-0.5, -0.5, -0.5])])]
    out = rollout_scalars(trajs, 2)
    assert out["turn0/sampled_nll"] == pytest.approx(0.1)                 # both samples: 0.1 per token
    assert out["turn1/sampled_nll"] == pytest.approx((-tail / 3 + 0.5) / 2)
    assert out["turn0/tail_token_rate"] == 0.0                            # p = e^-0.2 is no tail draw
    assert out["turn1/tail_token_rate"] == 0.5                            # one of two drew below TAIL_PROB
