"""kevin_jax.rl.speed_metrics on hand-built scored turns: mean speedup of correct kernels, fast_1 / fast_1.5 among
correct kernels, mean score, per turn; Turn objects and the same turns read back from their JSON give the same
numbers."""
import dataclasses
import json

import pytest

from kevin_jax.env.trajectory import Trajectory, Turn
from kevin_jax.rl import speed_metrics
from kevin_jax.rl.speed_metrics import log_text, speed_metrics as metrics, speed_scalars


def turn(i, correct=True, speedup=1.0, score=None, format_error=None, flags=()):
    verdict = {"format_ok": True, "compiled": True, "correct": correct, "speedup": speedup if correct else None,
               "hack_flags": [{"code": c, "reason": c} for c in flags]}
    ok = correct and not flags and format_error is None
    return Turn.from_dict({"turn": i, "parsed": {"format_error": format_error}, "verdict": verdict,
                           "score": (0.3 + (speedup or 0.0)) if score is None and ok else (score or 0.0)})


# Turn 0: correct at 0.5x, 1.0x and 2.0x, one wrong.  Turn 1: correct at 1.5x, a flagged "correct" 3.0x kernel (not
# correct: scores 0), a format error whose verdict said correct (not correct), a correct kernel without a timing.
TURNS = [turn(0, speedup=0.5), turn(0, speedup=1.0), turn(0, speedup=2.0), turn(0, correct=False),
         turn(1, speedup=1.5), turn(1, speedup=3.0, flags=["torch_op"]),
         turn(1, speedup=1.2, format_error="no ```python code block in the response"), turn(1, speedup=None)]


def test_overall_and_per_turn_values_by_hand():
    m = metrics(TURNS)
    # correct: 0.5, 1.0, 2.0 (turn 0); 1.5 and the untimed one (turn 1) -> 5 of 8
    assert m["correct_rate"] == pytest.approx(5 / 8)
    assert m["correct_kernels"] == 5
    assert m["mean_speedup"] == pytest.approx((0.5 + 1.0 + 2.0 + 1.5) / 4)     # the untimed kernel has no speedup
    assert m["fast_1"] == pytest.approx(3 / 5)                                  # 1.0, 2.0, 1.5 (>= 1: 1.0 counts)
    assert m["fast_1.5"] == pytest.approx(2 / 5)                                # 2.0, 1.5
    assert m["score_mean"] == pytest.approx((0.8 + 1.3 + 2.3 + 0 + 1.8 + 0 + 0 + 0.3) / 8)
    assert m["turn0/mean_speedup"] == pytest.approx(3.5 / 3)
    assert m["turn0/fast_1"] == pytest.approx(2 / 3) and m["turn0/fast_1.5"] == pytest.approx(1 / 3)
    assert m["turn0/score_mean"] == pytest.approx((0.8 + 1.3 + 2.3) / 4)
    assert m["turn1/mean_speedup"] == pytest.approx(1.5)
    assert m["turn1/fast_1"] == pytest.approx(1 / 2) and m["turn1/fast_1.5"] == pytest.approx(1 / 2)
    assert m["turn1/correct_rate"] == pytest.approx(2 / 4) and m["turn1/correct_kernels"] == 2


def test_undefined_without_correct_kernels():
    m = metrics([turn(0, correct=False), turn(1, correct=False)])
    assert m["mean_speedup"] is None and m["fast_1"] is None and m["turn1/fast_1.5"] is None
    assert m["correct_rate"] == 0.0 and m["score_mean"] == 0.0
    assert metrics([])["score_mean"] is None
    scalars = speed_scalars([Trajectory("L1/x", 0, 1, 0, [turn(0, correct=False)])])
    assert "speed/mean_speedup" not in scalars and scalars["speed/correct_kernels"] == 0.0
    # one name per metric: the correct rate and mean score are rollout_stats' (rollout/correct_rate, ...)
    assert not {"speed/correct_rate", "speed/score_mean", "speed/turn0/correct_rate"} & set(scalars)
    assert log_text(scalars) == "speedup -x, fast_1 -, fast_1.5 -"


def test_turn_objects_and_their_json_agree():
    def as_turn(t):
        return Turn(turn=t.turn, prompt_tokens=[1], response_tokens=[2], response_logprobs=[-0.1],
                    stop_reason="eos", response_text="x", parsed=t.parsed, verdict=t.verdict, score=t.score)

    trajectories = [Trajectory("L1/x", 0, 1, 0, [as_turn(t) for t in TURNS[:4]]),
                    Trajectory("L1/x", 1, 1, 0, [as_turn(t) for t in TURNS[4:]])]
    from_objects = speed_scalars(trajectories)
    from_json = speed_scalars([Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) for t in trajectories])
    assert from_objects == pytest.approx(from_json)
    assert from_objects["speed/fast_1.5"] == pytest.approx(2 / 5)
    assert set(from_objects) >= {"speed/turn0/mean_speedup", "speed/turn1/fast_1"}
    assert log_text({f"rollout/{k}": v for k, v in from_objects.items()}, "rollout/speed/") == \
        "speedup 1.25x, fast_1 0.60, fast_1.5 0.40"


def test_thresholds_are_kevins_names():
    assert speed_metrics.FAST_P == (1.0, 1.5)
    from kevin_jax.evaluation.metrics import fast_name
    assert [speed_metrics.fast_key(p) for p in (1.0, 1.5, 2.0)] == [fast_name(p) for p in (1.0, 1.5, 2.0)]
    m = metrics([turn(0, speedup=2.0)], thresholds=(2.0,))
    assert m["fast_2"] == 1.0 and "fast_1" not in m
    assert dataclasses.is_dataclass(Turn)
