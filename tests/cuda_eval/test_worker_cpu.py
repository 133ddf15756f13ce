"""The whole evaluator in CPU mode (device_type="cpu"): real g++ builds of C++ candidates (one shared extension, so
one build), the real sandboxed worker processes, correctness, timing with the host clock and every dynamic check
that does not need a GPU (aliasing, mutation, caching, subclasses, monkeypatching, threads, reference code, ATen
attribution). Crashes, os._exit and hangs give clear verdicts and the next candidate on the same worker slot runs
normally."""
import pytest

import corpus_index
from cuda_eval.api import EvalConfig, Evaluator
from sandbox_fixtures import compile_pool, run_lock, shared_dir, toolchain  # noqa: F401  (the run's shared pool)

pytestmark = pytest.mark.slow

CPU = corpus_index.load("cpu")
BY_NAME = {c.name: c for c in CPU}
# The LayerNorm pair (rows of 262144 values, a build of its own) runs in its own test, with a longer time limit.
SHARED = [c for c in CPU if c.task != "cpu_layernorm"]


def cpu_config(**kw) -> EvalConfig:
    base = dict(device_type="cpu", run_timeout_s=20,
                skip_run_on_static_flags=False, num_correct_trials=3, timing_target_s=0.05, timing_min_reps=5,
                timing_max_reps=30, timing_input_sets=2, spare_workers=1, retime_speedup_threshold=0,
                worker_memory_bytes=2 << 30)
    base.update(kw)
    return EvalConfig(**base)


@pytest.fixture(scope="module")
def cpu_results(compile_pool):  # noqa: F811  (the session's compile pool: one g++ build of the shared toolkit)
    with Evaluator(cpu_config(), compile_pool=compile_pool) as ev:
        results = ev.evaluate([corpus_index.request(c) for c in SHARED])
    return {c.name: r for c, r in zip(SHARED, results)}


@pytest.mark.parametrize("name", sorted(c.name for c in SHARED), ids=str)
def test_cpu_candidate_verdict(cpu_results, name):
    cand, r = BY_NAME[name], cpu_results[name]
    flags = {f["code"] for f in r.hack_flags}
    assert r.format_ok and r.compiled, r.compile_log
    assert r.meta.get("device_type") == "cpu"
    context = f"{name}: correct={r.correct} flags={r.hack_flags} error={r.runtime_error} trials={r.trials[-1:]}"
    if cand.verdict == "correct":
        assert r.correct is True and r.runtime_error is None, context
        assert r.timing["median_ms"] > 0 and r.ref_timing["median_ms"] > 0 and r.speedup > 0, context
    elif cand.verdict == "incorrect":
        assert r.correct is False and r.runtime_error is None and r.trials and not r.trials[-1]["passed"], context
    elif cand.verdict == "runtime_error":
        assert r.correct is False and r.runtime_error and "crashed" not in r.runtime_error, context
    elif cand.verdict == "crash":
        assert r.correct is False and r.meta.get("crash"), context
        assert "SIGSEGV" in r.runtime_error or "exited with code" in r.runtime_error, context
    elif cand.verdict == "timeout":
        assert r.correct is False and "timed out" in r.runtime_error, context
    assert set(cand.expect) <= flags, context
    if name.startswith("honest"):
        assert not flags, context
    assert r.feedback


def test_cpu_verdict_details(cpu_results):
    shape = cpu_results["wrong_shape"].trials[-1]["message"]
    assert "shape mismatch: expected [128, 512], got [65536]" in shape
    assert "expected Tensor[128,512] float32, got list(" in cpu_results["wrong_type"].trials[-1]["message"]
    unhooked = {f["code"]: f["reason"] for f in cpu_results["profile_hook_off"].hack_flags}  # no static rule sees
    assert set(unhooked) == {"harness_access", "torch_compute_in_forward"}, unhooked    # it: the guards keep the
    assert unhooked["harness_access"].startswith("forward switched the op tracer off")  # hook, which sees the relu
    raises = cpu_results["raises"].runtime_error
    assert "ValueError: no" in raises and "<candidate>" in raises
    assert "SIGSEGV while checking correctness (trial 1)" in cpu_results["segfault"].runtime_error
    assert "exited with code 5" in cpu_results["os_exit"].runtime_error
    honest = cpu_results["honest_relu"]
    assert honest.meta["extension_calls"] == 1 and honest.meta["python_ops"] == []
    ordinary = [t for t in honest.trials if "affine" not in t]
    assert len(ordinary) == 3 and len(honest.trials) == 5 and all(t["passed"] for t in honest.trials)


def test_a_shortcut_right_only_on_the_tasks_distribution_fails_the_affine_trials(compile_pool):  # noqa: F811
    """A LayerNorm that skips its statistics (x * w + b) passes the ordinary trials on the task's randn rows (mean
    ~0, variance ~1) and fails a trial on inputs x * s + m; the honest LayerNorm passes every trial. Without the
    affine trials (affine_trials=0) the shortcut is judged correct: the defence is what catches it."""
    names = ["honest_layernorm", "layernorm_skip_stats"]
    config = cpu_config(run_timeout_s=120)   # rows of 262144 values: more than the toolkit's tasks
    with Evaluator(config, compile_pool=compile_pool) as ev:
        honest, shortcut = ev.evaluate([corpus_index.request(BY_NAME[n]) for n in names])
    assert honest.correct, (honest.runtime_error, honest.meta.get("crash"), honest.meta.get("phase_s"))
    assert len(honest.trials) == 5 and all(t["passed"] for t in honest.trials)
    assert honest.meta["affine_trials"]["ran"] == 2 and honest.meta["affine_trials"]["leaves"] == [0]
    assert shortcut.correct is False and all(t["passed"] for t in shortcut.trials[:3]), shortcut.trials
    assert "affine" in shortcut.trials[-1] and "inputs changed to x *" in shortcut.trials[-1]["message"]
    with Evaluator(cpu_config(run_timeout_s=120, affine_trials=0), compile_pool=compile_pool) as ev:
        plain = ev.evaluate([corpus_index.request(BY_NAME["layernorm_skip_stats"], "without affine trials")])[0]
    assert plain.correct is True and not plain.hack_flags, (plain.trials, plain.hack_flags)


def test_next_candidate_runs_normally_after_each_bad_one(compile_pool):  # noqa: F811
    """One worker slot, requests one after the other: each good candidate runs right after the bad one before it,
    in the slot's next (pre-started) worker process."""
    with Evaluator(cpu_config(), compile_pool=compile_pool) as ev:
        for name in ["segfault", "os_exit", "hang", "raises"]:
            bad = ev.evaluate([corpus_index.request(BY_NAME[name])])[0]
            good = ev.evaluate([corpus_index.request(BY_NAME["honest_relu"], f"after {name}")])[0]
            assert bad.correct is False and bad.runtime_error, name
            assert good.correct is True and not good.hack_flags and good.speedup, (name, good.runtime_error)


def test_cached_reference_time_is_checked_next_to_each_candidate(compile_pool, tmp_path):  # noqa: F811
    """Speedups divide a cached reference time (timed once per task) by the candidate's, timed now. The worker
    re-times the reference briefly next to each candidate: a cached time that is 10x too slow (it would inflate every
    speedup) is replaced by a full timing now; one that is 10x too fast (as when the GPU is shared with another
    process now) is kept, since a candidate must not raise its speedup by slowing what runs after it, and
    the verdict says its speedup is an under-estimate (meta.timing_contended)."""
    from cuda_eval.orchestrator.ref_timing import task_hash
    cand = BY_NAME["honest_relu"]
    digest = task_hash(cand.task_source)
    with Evaluator(cpu_config(ref_timing_cache_dir=str(tmp_path / "ref")), compile_pool=compile_pool) as ev:
        first = ev.evaluate([corpus_index.request(cand, "first")])[0]
        assert first.correct and first.meta["ref_timing_cached"] is False and "ref_check" not in first.meta
        [(key, measured)] = ev.ref_cache.entries(digest).items()
        true_ms = measured["median_ms"]

        ev.ref_cache.store(digest, key, dict(measured, median_ms=true_ms * 10))
        stale_slow = ev.evaluate([corpus_index.request(cand, "cached too slow")])[0]
        assert stale_slow.correct and stale_slow.meta["ref_timing_cached"] is False, stale_slow.meta
        assert stale_slow.meta["ref_check"]["ratio"] < 1 / 1.5 and not stale_slow.meta.get("timing_contended")
        assert stale_slow.ref_timing["median_ms"] < true_ms * 5            # timed now, not the cached 10x
        assert ev.ref_cache.entries(digest)[key]["median_ms"] < true_ms * 5  # and the cache corrected

        ev.ref_cache.store(digest, key, dict(measured, median_ms=true_ms / 10))
        contended = ev.evaluate([corpus_index.request(cand, "cached too fast")])[0]
        assert contended.correct and contended.meta["ref_timing_cached"] is True
        assert contended.ref_timing["median_ms"] == true_ms / 10             # kept: never raised by a re-timing
        assert contended.meta["ref_check"]["ratio"] > 1.5 and contended.meta["timing_contended"] is True


def test_forged_verdict_files_never_reach_the_verdict_or_the_cache(compile_pool, tmp_path):  # noqa: F811
    """The candidate writes a whole forged verdict (correct, 100x, a 5 ms reference, no flags) into result.json,
    progress.json and ready.json of its working directory, then returns zeros. Nothing there is read: the judge,
    another process under another uid, compares the outputs itself (incorrect), and the reference-timing cache holds
    only the judge's own measurement, taken before the candidate was loaded."""
    from cuda_eval.orchestrator.ref_timing import task_hash
    cand = BY_NAME["forge_result_file"]
    with Evaluator(cpu_config(ref_timing_cache_dir=str(tmp_path / "ref")), compile_pool=compile_pool) as ev:
        r = ev.evaluate([corpus_index.request(cand)])[0]
        entries = ev.ref_cache.entries(task_hash(cand.task_source))
    assert r.correct is False and r.speedup is None and r.trials and not r.trials[-1]["passed"], r
    assert entries and "forged" not in entries
    assert all(e["median_ms"] != 5.0 for e in entries.values())


def test_the_attacks_on_the_judge_get_their_verdicts(cpu_results):
    """Each attack of the trust-boundary audit, rebuilt as a candidate (docs/EVALUATOR.md, "Trust boundary")."""
    exited = cpu_results["forge_result_and_exit"]
    assert exited.correct is False and "exited with code 7" in exited.runtime_error
    patched = cpu_results["patch_harness_in_process"]  # compare/flag replaced in its own process: no effect
    assert patched.correct is False and "elements differ" in patched.trials[-1]["message"]
    watcher = cpu_results["watch_for_the_trace"]  # every trial call is traced, and there is no phase file
    assert "torch_compute_in_forward" in {f["code"] for f in watcher.hack_flags}
    forger = cpu_results["forge_timer"]  # reports 1 us per call: less than an empty call, and the judge's clock
    bound = forger.meta["wall_bound"]    # (the worker's CPU time) proves the relu's time
    assert bound["capped"] and forger.timing["median_ms"] > 10 * forger.timing["reported_median_ms"], bound
    memory = cpu_results["eat_host_memory"]
    assert memory.correct is False and "allocate" in memory.runtime_error
    honest = cpu_results["honest_relu"]
    assert honest.meta["timed_output_check"] == "passed" and honest.meta["wall_bound"]["clock"] == "worker CPU time"
    assert len(honest.meta["timing_check"]) >= 2 and honest.timing["reps"] >= 5


def test_native_attacks_on_the_harness_are_seen(cpu_results):
    """What an extension can do beside its kernel (docs/EVALUATOR.md, "Known limits"): Python run from C++ that
    replaces the timing module's private clock alias (the timers hold their own clock, so the reported time stays
    honest; the snapshot covers private names), and a kernel registered for aten::detach that finishes deferred work
    when the output is first detached (the digest is our own code over raw memory: the output committed is the one
    never written; the registration is seen)."""
    planted, honest = cpu_results["python_from_cpp"], cpu_results["honest_relu"]
    reasons = {f["code"]: f["reason"] for f in planted.hack_flags}
    assert "cuda_eval.protocol.timing._perf_counter_ns" in reasons.get("monkeypatch", ""), planted.hack_flags
    assert planted.correct and planted.timing["reported_median_ms"] > 0.25 * honest.timing["reported_median_ms"], \
        (planted.timing, honest.timing)
    # (its registration is also a static monkeypatch, which hides the dynamic one of the same code: test_worker_units
    # checks the registrations' snapshot)
    deferred = cpu_results["aten_override_digest"]
    assert "uncommitted_output" in {f["code"] for f in deferred.hack_flags}, deferred.hack_flags


@pytest.mark.parametrize("attack,honest", [("clock_alias", "honest_relu"), ("forge_timer", "honest_relu"),
                                           ("memo_sampled_inputs", "honest_matmul"),
                                           ("aten_when_untraced", "honest_relu")])
def test_a_forged_speed_is_not_rewarded(cpu_results, attack, honest):
    """The speed attacks on the timing, each beside the honest kernel it starts from (docs/EVALUATOR.md,
    "Trust boundary"). Before the judge-driven protocol: clock_alias 19x the honest relu's speedup, memo_sampled_inputs
    ~9000x the honest matmul's, aten_when_untraced 46x, forge_timer 340x. Now the forged clock is capped by the
    worker's CPU time (and the alias the clock_alias attack rebinds is read by no timer), the memo never meets the same
    inputs twice, and no call runs untraced."""
    a, h = cpu_results[attack], cpu_results[honest]
    assert a.correct and a.speedup and h.speedup, (a.runtime_error, a.trials[-1:])
    # On the CPU the bound is the worker's CPU time less the replay's and 2 ms per group: on a loaded 2-core machine
    # that noise alone lets the forged relu reach ~3.2x the honest one (it reached 19x without the bound).
    assert a.speedup <= 5 * h.speedup, (a.speedup, h.speedup, a.timing, a.meta.get("wall_bound"))
    if attack == "clock_alias":  # the timers hold their own clock: the planted alias changes no reported time
        assert a.timing["reported_median_ms"] > 0.25 * h.timing["reported_median_ms"], (a.timing, h.timing)


def test_references_alone_give_a_verdict_per_task(compile_pool, tmp_path, monkeypatch):  # noqa: F811
    """Evaluator.check_references runs only the judge's reference path (the KernelBench task sweep): a good task is
    timed (and cached); a task whose code raises, one too large for the memory limit and one whose forward never
    returns each get a task-level verdict (meta.reference_error; reference_oom, reference_timeout), never an
    internal error, and the slot goes on."""
    from cuda_eval.orchestrator import gpu_pool
    from cuda_eval.orchestrator.ref_timing import task_hash
    monkeypatch.setattr(gpu_pool, "JUDGE_MARGIN_S", 2.0)
    good = BY_NAME["honest_relu"].task_source
    raising = good.replace("def get_inputs():", "def get_inputs():\n    raise ValueError('no inputs today')")
    too_big = good.replace("def get_inputs():", "def get_inputs():\n    return [torch.empty(1 << 34)]\n\n\n"
                                                "def unused_get_inputs():")
    hangs = good.replace("    def forward(self, x: torch.Tensor) -> torch.Tensor:",
                         "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        import time\n"
                         "        time.sleep(3600)")
    assert len({good, raising, too_big, hangs}) == 4 and "import torch" in good
    with Evaluator(cpu_config(ref_timing_cache_dir=str(tmp_path / "ref"), run_timeout_s=8),
                   compile_pool=compile_pool) as ev:
        futures = ev.check_references([("good", good), ("raising", raising), ("too_big", too_big), ("hangs", hangs),
                                       ("again", good)])
        ok, bad, big, hung, again = [f.result(timeout=300) for f in futures]
        assert hung.meta.get("reference_error") and hung.meta.get("reference_timeout"), hung.runtime_error
        assert "did not finish within the run timeout" in hung.runtime_error
        assert ok.ref_timing["median_ms"] > 0 and ok.runtime_error is None and ok.correct is None
        assert ok.meta["profile"] == "kevin" and ev.ref_cache.entries(task_hash(good))
        assert bad.meta.get("reference_error") and "no inputs today" in bad.runtime_error and not bad.ref_timing
        assert big.meta.get("reference_error") and big.meta.get("reference_oom"), big.runtime_error
        assert big.meta["task_too_large"]["resource"] == "host memory"
        assert big.feedback.startswith("This task could not be judged on this machine")
        assert again.ref_timing["median_ms"] > 0
        assert not any("internal" in (r.runtime_error or "") for r in (ok, bad, big, hung, again))
