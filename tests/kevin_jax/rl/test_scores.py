"""Scores, returns and advantages against hand-computed examples."""
import math

import numpy as np
import pytest

from cuda_eval.api import EvalResult
from kevin_jax.reward import RewardConfig, turn_score
from kevin_jax.env.trajectory import Turn
from kevin_jax.reward import discounted_returns
from kevin_jax.rl.advantages import AdvantageConfig, group_advantages, normalized_advantages


def verdict(correct=True, speedup=1.3, **kw):
    return {"format_ok": True, "correct": correct, "speedup": speedup, "hack_flags": [], **kw}


def kernel_turn(verdict: dict, format_error=None) -> Turn:
    return Turn.from_dict({"turn": 0, "parsed": {"format_error": format_error}, "verdict": verdict})


def kernel_score(verdict: dict, config: RewardConfig) -> float:
    return turn_score(kernel_turn(verdict), config)


def test_kernel_score_is_weight_plus_speedup_when_correct():
    cfg = RewardConfig()
    assert kernel_score(verdict(speedup=1.3), cfg) == pytest.approx(1.6)
    assert kernel_score(verdict(speedup=0.5), cfg) == pytest.approx(0.8)


@pytest.mark.parametrize("bad", [
    verdict(correct=False),
    verdict(correct=None),  # compile_only: not checked
    verdict(format_ok=False),
    verdict(hack_flags=[{"code": "torch_op", "reason": "torch.matmul in forward"}]),
])
def test_kernel_score_is_zero_when_not_clean_and_correct(bad):
    assert not kernel_turn(bad).correct
    assert kernel_score(bad, RewardConfig()) == 0.0
    # our parse saw no code block: not correct whatever the verdict says
    assert not kernel_turn(verdict(), format_error="no code block").correct
    assert turn_score(kernel_turn(verdict(), format_error="no code block"), RewardConfig()) == 0.0


def test_score_of_the_evaluators_own_verdict():
    result = EvalResult(request_id="r", task_id="t", mode="full", format_ok=True, compiled=True, correct=True,
                        speedup=2.0)
    assert kernel_score(result.to_dict(), RewardConfig()) == pytest.approx(2.3)


def test_speedup_transforms():
    assert kernel_score(verdict(speedup=math.e), RewardConfig(speedup_transform="log")) == pytest.approx(1.3)
    log_cfg = RewardConfig(speedup_transform="log")
    assert kernel_score(verdict(speedup=0.5), log_cfg) == pytest.approx(0.3 + math.log(0.5))
    assert kernel_score(verdict(speedup=50.0), RewardConfig(speedup_transform="clip", speedup_clip=4.0)) == \
        pytest.approx(4.3)
    # a correct kernel without a usable speedup keeps the correctness credit only
    for s in (None, float("nan"), float("inf"), 0.0):
        assert kernel_score(verdict(speedup=s), RewardConfig()) == pytest.approx(0.3)


def test_sum_returns_match_a_worked_example():
    r = discounted_returns([0.0, 0.0, 1.3], RewardConfig(gamma=0.4))
    np.testing.assert_allclose(r, [0.208, 0.52, 1.3], rtol=0, atol=1e-12)


def test_sum_returns_hand_example_with_every_turn_scoring():
    # R3 = 2, R2 = 0.3 + 0.4*2 = 1.1, R1 = 0 + 0.4*1.1 = 0.44, R0 = 1 + 0.4*0.44 = 1.176
    r = discounted_returns([1.0, 0.0, 0.3, 2.0], RewardConfig(gamma=0.4))
    np.testing.assert_allclose(r, [1.176, 0.44, 1.1, 2.0], atol=1e-12)


def test_max_returns():
    # R2 = 2, R1 = max(0, 0.4*2) = 0.8, R0 = max(1.0, 0.4*0.8) = 1.0  (= max_i gamma^(i-t) S_i)
    r = discounted_returns([1.0, 0.0, 2.0], RewardConfig(gamma=0.4, return_aggregation="max"))
    np.testing.assert_allclose(r, [1.0, 0.8, 2.0], atol=1e-12)
    scores = np.array([0.3, 1.7, 0.0, 2.5])
    brute = [max(0.4 ** (i - t) * scores[i] for i in range(t, 4)) for t in range(4)]
    np.testing.assert_allclose(discounted_returns(scores, RewardConfig(return_aggregation="max")), brute, atol=1e-12)


def test_single_turn_returns_are_the_scores():
    np.testing.assert_allclose(discounted_returns([0.0, 1.3, 0.3], RewardConfig(return_aggregation="single_turn")),
                               [0.0, 1.3, 0.3])


def test_mean_std_advantages():
    adv = normalized_advantages([1.0, 2.0, 3.0, 4.0], AdvantageConfig(std_eps=0.0))
    std = math.sqrt(1.25)
    np.testing.assert_allclose(adv, [-1.5 / std, -0.5 / std, 0.5 / std, 1.5 / std], atol=1e-12)


def test_advantages_without_std_division_and_leave_one_out():
    np.testing.assert_allclose(normalized_advantages([1.0, 2.0, 3.0], AdvantageConfig(normalize_std=False)),
                               [-1.0, 0.0, 1.0])
    # baseline of sample i = mean of the others: 2.5, 2.0, 1.5
    np.testing.assert_allclose(
        normalized_advantages([1.0, 2.0, 3.0], AdvantageConfig(normalize_std=False, baseline="leave_one_out")),
        [-1.5, 0.0, 1.5])
    assert normalized_advantages([5.0], AdvantageConfig(baseline="leave_one_out")).tolist() == [0.0]


def test_equal_returns_give_zero_advantage_not_nan():
    adv = normalized_advantages([0.3] * 64, AdvantageConfig())
    assert np.all(adv == 0.0)


def test_group_advantages_normalise_each_task_separately():
    returns = [1.0, 3.0, 10.0, 10.0, 30.0, 2.0]
    groups = ["a", "a", "b", "b", "b", "a"]
    adv = group_advantages(returns, groups, AdvantageConfig(normalize_std=False))
    np.testing.assert_allclose(adv, [-1.0, 1.0, -6.666666666666666, -6.666666666666666, 13.333333333333334, 0.0])
    with pytest.raises(ValueError, match="group labels"):
        group_advantages([1.0], ["a", "b"], AdvantageConfig())


def test_turn_mean_baseline_removes_the_per_turn_offset_and_keeps_the_task_std():
    # Two trajectories of 3 turns, every kernel scoring 1.0 in one and 0.0 in the other: returns (gamma 0.4)
    # 1.56, 1.4, 1.0 and 0, 0, 0. One baseline for all turns pushes the good last turn (1.0) below the task mean
    # (0.66) far less than its first turn; per turn, each good turn is +half its turn's gap, each bad one -half.
    config = AdvantageConfig(std_eps=0.0)
    scores = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    returns = np.concatenate([discounted_returns(s, RewardConfig()) for s in scores])
    turns = [0, 1, 2, 0, 1, 2]
    std = returns.std()
    adv = group_advantages(returns, ["t"] * 6, AdvantageConfig(std_eps=0.0, baseline="turn_mean"), turns)
    np.testing.assert_allclose(adv, [0.78 / std, 0.7 / std, 0.5 / std, -0.78 / std, -0.7 / std, -0.5 / std],
                               atol=1e-12)
    # The offset it removes: with one baseline, the mean advantage per turn decreases with the turn index.
    kevin = group_advantages(returns, ["t"] * 6, config)
    per_turn = [kevin[[i, i + 3]].mean() for i in range(3)]
    assert per_turn[0] > per_turn[1] > per_turn[2] and per_turn[2] < 0
    # Groups stay separate; within a group, samples of a turn are compared with that turn only.
    adv = group_advantages([2.0, 0.0, 5.0, 5.0], ["a", "a", "b", "b"],
                           AdvantageConfig(normalize_std=False, baseline="turn_mean"), [0, 1, 0, 0])
    np.testing.assert_allclose(adv, [0.0, 0.0, 0.0, 0.0])


def test_turn_mean_baseline_needs_the_turns():
    with pytest.raises(ValueError, match="turn index"):
        normalized_advantages([1.0, 2.0], AdvantageConfig(baseline="turn_mean"))
    with pytest.raises(ValueError, match="turn indices"):
        group_advantages([1.0, 2.0], ["a", "a"], AdvantageConfig(baseline="turn_mean"), [0])


@pytest.mark.parametrize("config,field,value", [
    (RewardConfig, "speedup_transform", "sqrt"), (RewardConfig, "return_aggregation", "mean"),
    (RewardConfig, "gamma", 1.5), (RewardConfig, "speedup_clip", 0.0), (AdvantageConfig, "baseline", "median")])
def test_bad_config_is_an_error(config, field, value):
    with pytest.raises(ValueError, match=field):
        config(**{field: value})


def test_unknown_config_field_is_an_error():
    with pytest.raises(TypeError):
        RewardConfig(gama=0.4)
    with pytest.raises(TypeError):                  # the advantage baseline is the advantage section's
        RewardConfig(baseline="mean")
