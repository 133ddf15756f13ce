"""tests/kevin_jax/kill_at_phase.py, in-process and without killing anything (os.kill recorded): each phase fires in
its step only, and the evaluator it wraps keeps its own face (submit where it has one, mode, device_share, context
manager). The real kills and resumes are test_resume.py and test_train_e2e.py."""
import signal

import pytest

import kill_at_phase
from kill_at_phase import KillAt


@pytest.fixture
def kills(monkeypatch):
    sent = []
    monkeypatch.setattr(kill_at_phase.os, "kill", lambda pid, sig: sent.append(sig))
    monkeypatch.setattr(kill_at_phase.logging, "shutdown", lambda: None)
    return sent


class FakeSubmittingEvaluator:
    mode = "full"

    def __init__(self):
        self.entered = self.exited = False

    def submit(self, requests):
        return [f"future {r}" for r in requests]

    def evaluate(self, requests):
        return [f"verdict {r}" for r in requests]

    def device_share(self, gpu):
        return f"share {gpu}"

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        self.exited = True


class FakeEvaluateOnlyEvaluator:
    mode = "compile_only"

    def evaluate(self, requests):
        return [f"verdict {r}" for r in requests]


def test_the_evaluator_keeps_its_face_and_the_kill_comes_once_a_batch_is_handed_over(kills):
    kill = KillAt("evaluation", 2)
    inner = FakeSubmittingEvaluator()
    wrapped = kill.wrap_evaluator(inner)
    with wrapped as entered:
        assert entered is wrapped and inner.entered
        assert wrapped.mode == "full" and wrapped.device_share(1) == "share 1"
        kill.current_step = 1
        assert wrapped.submit(["a"]) == ["future a"] and kills == []          # another step: nothing
        kill.current_step = 2
        assert wrapped.submit(["a", "b"]) == ["future a", "future b"] and kills == [signal.SIGKILL]
    assert inner.exited
    # without `submit` the runner calls `evaluate` (on a thread): the kill comes after it
    only = kill.wrap_evaluator(FakeEvaluateOnlyEvaluator())
    assert getattr(only, "submit", None) is None and only.mode == "compile_only"
    assert only.evaluate(["x"]) == ["verdict x"] and kills == [signal.SIGKILL] * 2


def test_install_wraps_the_trainers_pieces_and_each_phase_fires_in_its_step_only(kills, monkeypatch):
    from kevin_jax import checkpoint, train
    from kevin_jax.rl import state
    from kevin_jax.sampler import policy

    for owner, name in ((train, "run_episodes"), (train, "make_evaluator"), (policy.SamplerPolicy, "generate"),
                        (state.Updater, "update"), (checkpoint.Checkpointer, "save")):
        monkeypatch.setattr(owner, name, getattr(owner, name))            # restored after the test
    monkeypatch.setattr(train, "run_episodes", lambda runner, tasks, step, *a: ("rolled out", step))
    monkeypatch.setattr(policy.SamplerPolicy, "generate", lambda self, *a: "generations")
    monkeypatch.setattr(state.Updater, "update", lambda self, *a, **k: "updated")
    monkeypatch.setattr(checkpoint.Checkpointer, "save", lambda self, *a: "saving")
    monkeypatch.setattr(train, "make_evaluator", lambda spec: FakeSubmittingEvaluator())
    with pytest.raises(ValueError, match="kill_at_phase must be one of"):
        KillAt("optimizer", 1)
    kill = KillAt("update", 3)
    kill.install()
    assert isinstance(train.make_evaluator(None), kill_at_phase._KillingEvaluator)
    for step in (1, 2, 3):
        assert train.run_episodes(None, [], step, 0, None, None) == ("rolled out", step) and kill.current_step == step
        assert policy.SamplerPolicy.generate(object()) == "generations"
        assert checkpoint.Checkpointer.save(object(), step) == "saving"
        assert kills == []
        assert state.Updater.update(object(), None, [], first=True) == "updated"
        assert kills == ([signal.SIGKILL] if step == 3 else [])
