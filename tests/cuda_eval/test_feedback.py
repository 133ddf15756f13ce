"""feedback.render: one branch per outcome, each saying what the model needs to fix."""
from cuda_eval.api import EvalResult
from cuda_eval.orchestrator.feedback import render


def result(**kw) -> EvalResult:
    base = dict(request_id="r", task_id="L1/19_ReLU", mode="full", format_ok=True, code="...")
    base.update(kw)
    return EvalResult(**base)


def test_format_error():
    text = render(result(format_ok=False, code=None, format_error="no ```python code block in the response"))
    assert "no ```python code block" in text and "class ModelNew" in text


def test_rejected_before_running():
    text = render(result(hack_flags=[{"code": "try_except", "reason": "try/except at line 3: fallbacks are not "
                                                                      "allowed"}]))
    assert "rejected without being run" in text and "try/except at line 3" in text


def test_compile_error_shows_log_trimmed():
    log = "cuda_sources[0]:12: error: expected a ';'\n" + "x" * 5000
    text = render(result(compiled=False, compile_log=log), max_chars=300)
    assert text.startswith("Your kernel failed to compile:")
    assert "cuda_sources[0]:12: error: expected a ';'" in text
    assert len(text) <= 300 and text.endswith("(trimmed)")


def test_runtime_error():
    text = render(result(compiled=True, correct=False, runtime_error="trial 0: RuntimeError: CUDA error: an illegal "
                                                                     "memory access was encountered"))
    assert "failed at run time" in text and "illegal memory access" in text


def test_reference_failure_is_not_blamed_on_the_model():
    text = render(result(compiled=True, runtime_error="the reference program failed: boom",
                         meta={"reference_error": True}))
    assert "not of your kernel" in text


def test_incorrect_names_trial_and_errors():
    trials = [{"trial": 0, "passed": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "mismatch_frac": 0.0,
               "message": None},
              {"trial": 1, "passed": False, "max_abs_err": 0.5, "max_rel_err": 2.0, "mismatch_frac": 0.25,
               "message": "10 of 40 elements differ (max abs err 0.5, max rel err 2, atol=0.01, rtol=0.01)"}]
    text = render(result(compiled=True, correct=False, trials=trials, meta={"num_trials": 5}))
    assert "incorrect (trial 2 of 5)" in text and "10 of 40 elements differ" in text
    shape = [{"trial": 0, "passed": False, "max_abs_err": 0.0, "max_rel_err": 0.0, "mismatch_frac": 1.0,
              "message": "shape mismatch: expected [4, 4], got [16]"}]
    assert "shape mismatch: expected [4, 4], got [16]" in render(result(compiled=True, correct=False, trials=shape))


def test_correct_but_flagged():
    text = render(result(compiled=True, correct=True, speedup=40.0, timing={"median_ms": 0.01},
                         ref_timing={"median_ms": 0.4},
                         hack_flags=[{"code": "unsynced_stream", "reason": "work left on another stream"}]))
    assert "rejected (score 0)" in text and "work left on another stream" in text
    assert "speedup" not in text


def test_compile_only():
    text = render(result(mode="compile_only", compiled=True, correct=None))
    assert "compiled successfully" in text and "not run" in text


def test_correct_with_speedup():
    fast = render(result(compiled=True, correct=True, trials=[{"passed": True}] * 5, speedup=1.5,
                         timing={"median_ms": 0.2}, ref_timing={"median_ms": 0.3}))
    assert "correct (5/5 trials passed)" in fast and "0.2 ms" in fast and "1.50x" in fast
    slow = render(result(compiled=True, correct=True, trials=[{"passed": True}] * 5, speedup=0.5,
                         timing={"median_ms": 0.6}, ref_timing={"median_ms": 0.3}))
    assert "slower than the reference" in slow


def test_refused_compiler_flag_says_which_and_what_is_allowed():
    log = ("compiler flag '-wrapper' in extra_cflags is not allowed here: it runs a program of your choosing around "
           "every compiler step; allowed: -O0..-O3/-Os/-Ofast, ...")
    text = render(result(compiled=False, compile_log=log, meta={"compile_error_kind": "flag_rejected"}))
    assert "not compiled" in text and "'-wrapper'" in text and "allowed: -O0..-O3" in text
    assert "failed to compile" not in text
