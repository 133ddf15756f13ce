"""scripts/make_warm_start_corpus.py with and without measured speedups: with them, a task with a measured slow/fast
pair gets the speed mix (its variants recorded with their measured speedups, the fast one rare among correct first
answers and among the answers after a correct slow kernel, slow -> fast rewrites after "0.30x" feedback, the fast one
kept once found); without them, plain records whose feedback speedups are marked as placeholders."""
import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_jax import sft
from kevin_jax.tasks import builtin_solutions

REPO = Path(__file__).resolve().parents[2]
LEAKY, SOFTMAX, HINGE, LAYERNORM = ("L1/1_LeakyReLU", "L1/3_Softmax_over_rows", "L1/7_HingeLoss", "L1/6_LayerNorm")


def _generator():
    spec = importlib.util.spec_from_file_location("make_warm_start_corpus",
                                                  REPO / "scripts" / "make_warm_start_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def entry(speedup, correct=True, ref_ms=0.5):
    return {"correct": correct, "speedup": speedup if correct else None, "ref_median_ms": ref_ms}


# Synthetic measurements (not real ones): LeakyReLU and Softmax have a pair >= 1.5x apart; HingeLoss's pair is only
# 1.2x apart; LayerNorm's slow variant was not correct on the GPU, so only one correct solution is measured.
MEASURED = {"measured": {"gpu": "synthetic", "mode": "full"}, "solutions": {
    LEAKY: {"correct_naive": entry(0.97), "correct_uncoalesced": entry(0.30)},
    SOFTMAX: {"correct_naive": entry(0.80, ref_ms=0.4), "correct_thread_per_row": entry(0.10, ref_ms=0.4)},
    HINGE: {"correct_naive": entry(3.0), "correct_unfused": entry(2.5)},
    LAYERNORM: {"correct_naive": entry(0.9), "correct_thread_per_row": entry(None, correct=False)},
}}


def by_task(records):
    out = collections.defaultdict(list)
    for r in records:
        out[r["task_id"]].append(r)
    return out


def code_of(response):
    from kevin_jax.env.parse import parse_response
    return parse_response(response, prompt_opens_thought=True).code.strip()


SOURCES = {(s.task_id, s.name): s.source.strip() for s in builtin_solutions()}


def test_the_variants_exist_and_every_task_has_a_plain_solution():
    correct = collections.defaultdict(set)
    for s in builtin_solutions():
        if s.kind == "correct":
            correct[s.task_id].add(s.name)
    assert set(gen.PLAIN_SOLUTIONS) == set(correct)
    assert all(gen.PLAIN_SOLUTIONS[t] in names for t, names in correct.items())
    assert all(len(names) >= 2 for names in correct.values()), {t: n for t, n in correct.items() if len(n) < 2}


def test_measured_pairs_get_the_speed_mix_with_their_speedups():
    tasks = by_task(gen.records(MEASURED, fast_share=0.2))
    plan = gen.plan(MEASURED)
    assert {k: plan[LEAKY][k] for k in ("mix", "slow", "fast", "unused")} == {
        "mix": "speed_mix", "slow": "correct_uncoalesced", "fast": "correct_naive", "unused": []}
    assert plan[LEAKY]["speedups"]["correct_uncoalesced"] == 0.30
    assert plan[HINGE]["mix"] == "plain" and plan[LAYERNORM]["mix"] == "plain"
    for task, slow, fast, sp_slow, sp_fast in ((LEAKY, "correct_uncoalesced", "correct_naive", 0.30, 0.97),
                                               (SOFTMAX, "correct_thread_per_row", "correct_naive", 0.10, 0.80)):
        recs = tasks[task]
        assert all(r["feedback_speedups"] == "measured" for r in recs)
        for r in recs:
            if r["quality"] != "correct":
                assert r["speedup"] is None and r["variant"] is None
                continue
            # every correct answer is S or F, recorded with its measured speedup and role
            code = code_of(r["response"])
            assert (code, r["variant"], r["speedup"]) in {(SOURCES[(task, slow)], "slow", sp_slow),
                                                          (SOURCES[(task, fast)], "fast", sp_fast)}
        # the feedback of every correct attempt shows the measured speedup of the attempt's program
        for r in recs:
            for a in r["attempts"]:
                if a["feedback"].startswith("Your kernel is correct"):
                    shown = float(a["feedback"].split("a speedup of ")[1].split("x.")[0])
                    expected = sp_slow if a["code"].strip() == SOURCES[(task, slow)] else sp_fast
                    assert shown == pytest.approx(expected, abs=0.005)
                    assert shown not in gen.ILLUSTRATIVE_SPEEDUPS


@pytest.mark.parametrize("share", [0.1, 0.15, 0.2])
def test_fast_is_rare_among_correct_first_answers_and_after_a_slow_kernel(share):
    recs = by_task(gen.records(MEASURED, fast_share=share))[LEAKY]
    first = [r for r in recs if r["kind"] == "first_turn" and r["quality"] == "correct"]
    fast_share = sum(r["variant"] == "fast" for r in first) / len(first)
    assert 0.1 <= fast_share <= 0.2 and fast_share == pytest.approx(share, abs=0.01)
    # after a correct slow kernel (the last attempt is S): keep S or rewrite as F, F in the same share per context
    after_slow = collections.defaultdict(list)
    for r in recs:
        if r["kind"] == "refinement" and r["attempts"] and r["attempts"][-1]["code"].strip() == SOURCES[
                (LEAKY, "correct_uncoalesced")] and r["attempts"][-1]["feedback"].startswith("Your kernel is correct"):
            after_slow[json.dumps(r["attempts"])].append(r["variant"])
    improvable = [v for v in after_slow.values() if "fast" in v]
    assert len(improvable) == 2                                    # turn 2 after S, turn 3 after S, S
    for variants in improvable:
        assert variants.count("fast") / len(variants) == pytest.approx(fast_share)
    assert sum("fast" in v for v in after_slow.values()) < len(after_slow)   # most contexts only keep S


def test_slow_to_fast_rewrites_follow_slow_feedback_and_fast_kernels_are_kept():
    recs = by_task(gen.records(MEASURED))[LEAKY]
    rewrites = [r for r in recs if r["origin"] == "correct_uncoalesced->correct_naive"]
    assert rewrites and all(r["variant"] == "fast" and r["speedup"] == 0.97 for r in rewrites)
    for r in rewrites:
        last = r["attempts"][-1]["feedback"]
        assert "a speedup of 0.30x" in last        # cuda_eval's feedback rendering of the measured slow kernel
        assert code_of(r["response"]) == SOURCES[(LEAKY, "correct_naive")]
    kept_fast = [r for r in recs if r["origin"] == "correct_naive:kept"]
    assert {len(r["attempts"]) for r in kept_fast} == {1, 2, 3}
    assert all(code_of(r["response"]) == r["attempts"][-1]["code"].strip() == SOURCES[(LEAKY, "correct_naive")]
               for r in kept_fast)
    # the mix keeps the corpus' other qualities: wrong, compile error (a broken slow kernel), the three fixes
    labels = collections.Counter((r["kind"], r["quality"]) for r in recs)
    assert labels[("first_turn", "wrong")] == 1 and labels[("first_turn", "compile_error")] == 1
    fixes = [r for r in recs if r["kind"] == "refinement" and r["origin"] == "correct_uncoalesced"]
    assert len(fixes) == 3


def test_corpus_records_load_and_render_as_sft_examples(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(gen.corpus_text(MEASURED))
    examples = sft.read_jsonl(path)
    assert len(examples) == len(gen.records(MEASURED))
    assert {e.label for e in examples} == {"first_turn/correct", "first_turn/wrong", "first_turn/compile_error",
                                           "refinement/correct"}


def test_without_measurements_the_records_are_plain_and_the_placeholders_say_so(tmp_path):
    assert gen.load_speedups(tmp_path / "absent.json") is None
    plain = gen.records(None)
    assert gen.corpus_text(None) != sft.BUILTIN_CORPUS.read_text(encoding="utf-8")  # shipped: from measurements
    assert not any("variant" in r or "speedup" in r for r in plain)
    for r in plain:
        shows_timing = any(a["feedback"].startswith("Your kernel is correct") for a in r["attempts"])
        assert (r.get("feedback_speedups") == "illustrative") == shows_timing
        if r["quality"] == "correct":
            assert code_of(r["response"]) == SOURCES[(r["task_id"], gen.PLAIN_SOLUTIONS[r["task_id"]])]
    # a task without a measured pair keeps the plain records beside measured tasks; its plain solution's measured
    # speedup (HingeLoss' correct_naive: 3.0x) replaces the placeholders in its feedback
    hinge, hinge_plain = by_task(gen.records(MEASURED))[HINGE], by_task(plain)[HINGE]
    assert [code_of(r["response"]) for r in hinge] == [code_of(r["response"]) for r in hinge_plain]
    shown = {a["feedback"].split("a speedup of ")[1].split("x.")[0] for r in hinge for a in r["attempts"]
             if a["feedback"].startswith("Your kernel is correct")}
    assert shown == {"3.00"}
    assert {r.get("feedback_speedups") for r in hinge} == {None, "measured"}
    assert "measured correct_naive 3.00x in the feedback" in gen.describe(MEASURED, "m.json", 1.5)
    assert "illustrative placeholders" in gen.describe(None, "x.json", 1.5)
    proc = subprocess.run([sys.executable, "scripts/make_warm_start_corpus.py", "--check", "--speedups",
                           str(tmp_path / "absent.json")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr  # the shipped corpus is the measured one, not the plain one
    assert "absent" in proc.stderr and "not measurements" in proc.stderr


def test_the_shipped_corpus_comes_from_the_shipped_gpu_measurements():
    """kevin_jax/data/warm_start_corpus.jsonl is what the generator writes from kevin_jax/data/builtin_speedups.json,
    and that file is a full GPU run (benchmarks/builtin_speed_variants.py), not a compile-only one: every task but one
    gets a measured slow/fast pair, and no record shows a placeholder speedup."""
    shipped = gen.load_speedups(gen.DEFAULT_SPEEDUPS)
    assert shipped is not None and shipped["measured"]["mode"] == "full" and "H100" in shipped["measured"]["gpu"]
    assert gen.corpus_text(shipped) == sft.BUILTIN_CORPUS.read_text(encoding="utf-8")
    records = gen.records(shipped)
    assert not any(r.get("feedback_speedups") == "illustrative" for r in records)
    with_pair = {r["task_id"] for r in records if r.get("variant") == "fast"}
    assert len(with_pair) == 16 and "L1/4_Sum_reduction_over_a_dimension" not in with_pair


def test_a_compile_only_run_is_never_taken_for_a_measurement(tmp_path):
    compiled = {"measured": {"mode": "compile_only"}, "solutions": {
        LEAKY: {"correct_naive": {"compiled": True, "correct": None, "speedup": None, "ref_median_ms": None},
                "correct_uncoalesced": {"compiled": True, "correct": None, "speedup": None, "ref_median_ms": None}}}}
    assert gen.plan(compiled)[LEAKY]["mix"] == "plain"
    assert "nothing was measured" in gen.describe(compiled, "c.json", 1.5)
    assert by_task(gen.records(compiled))[LEAKY] == by_task(gen.records(None))[LEAKY]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(MEASURED))
    assert gen.load_speedups(path) == MEASURED
    out = tmp_path / "c.jsonl"
    proc = subprocess.run([sys.executable, "scripts/make_warm_start_corpus.py", "--speedups", str(path), "--out",
                           str(out), "--fast-share", "0.15"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 of 17 tasks get the speed mix" in proc.stderr
    assert out.read_text() == gen.corpus_text(MEASURED, fast_share=0.15)


def test_mix_counts():
    assert gen.mix_counts(0.2) == (4, 1)
    assert gen.mix_counts(0.15) == (6, 1)
    assert gen.mix_counts(0.1) == (9, 1)
    assert gen.mix_counts(0.0) == (1, 0)
    with pytest.raises(ValueError):
        gen.mix_counts(1.0)
