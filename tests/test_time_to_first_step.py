"""benchmarks/time_to_first_step.py: milestones read from a command's log as it runs (a fake training command)."""
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("time_to_first_step", REPO / "benchmarks" / "time_to_first_step.py")
ttfs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ttfs)

FAKE_TRAINING = """
import sys, time
print("warm_start step 80/400: answer NLL 1.2", flush=True)
print("warm_start step 400/400: answer NLL 0.01", flush=True)
time.sleep(0.3)
print("I1126 episode.py:323] round 0 (group 1/2): 16 live, generate 3.0s, evaluate 4.0s, 3 correct", flush=True)
print("I1126 train.py:343] step 1/10: score 0.9, correct 0.7", flush=True)
time.sleep(60)
print("step 2/10: score 1.0", flush=True)
"""


def test_milestones_in_order_and_the_command_stopped_after_the_last(tmp_path):
    log, out = tmp_path / "log.txt", tmp_path / "out.json"
    t0 = time.monotonic()
    rc = ttfs.main(["--log", str(log), "--out", str(out), "--", sys.executable, "-c", FAKE_TRAINING])
    assert rc == 0 and time.monotonic() - t0 < 30          # not the fake's 60 s: stopped after step 1
    result = json.loads(out.read_text())
    reached = result["reached"]
    assert list(reached) == ["warm_start_done", "first_round", "first_rl_step"]
    assert reached["warm_start_done"] < reached["first_round"] <= reached["first_rl_step"]
    assert reached["first_round"] - reached["warm_start_done"] >= 0.25
    assert "400/400" in result["lines"]["warm_start_done"] and result["stopped_after_last_milestone"]
    text = log.read_text()
    assert "step 80/400" in text and "step 2/10" not in text


def test_a_milestone_never_reached_fails_and_says_so(tmp_path, capsys):
    rc = ttfs.main(["--milestone", "first_rl_step=step 1/\\d+: score", "--", sys.executable, "-c",
                    "print('warm_start step 400/400: answer NLL 0.01')"])
    assert rc == 1
    assert "| first_rl_step | not reached |" in capsys.readouterr().out


def test_the_time_limit_stops_a_silent_command(tmp_path):
    t0 = time.monotonic()
    rc = ttfs.main(["--limit-s", "1", "--", sys.executable, "-c", "import time; time.sleep(60)"])
    assert rc == 1 and time.monotonic() - t0 < 30


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit, match="NAME=REGEX"):
        ttfs.main(["--milestone", "no_equals_sign", "--", "true"])
    with pytest.raises(SystemExit, match="bad regular expression"):
        ttfs.main(["--milestone", "x=(", "--", "true"])
    with pytest.raises(SystemExit):
        ttfs.main([])
