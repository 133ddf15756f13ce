"""Writes the warm-start corpus (kevin_jax/data/warm_start_corpus.jsonl) from the built-in solutions.

    python scripts/make_warm_start_corpus.py            # rewrite the shipped file
    python scripts/make_warm_start_corpus.py --check    # exit 1 if the shipped file is out of date (the tests run it)
    python scripts/make_warm_start_corpus.py --speedups $OUT/builtin_speedups.json --fast-share 0.2 --out corpus.jsonl

For every built-in task (kevin_jax/tasks/builtin_solutions), answers of several qualities, as the policy would write
them (a short thought, the program in a ```python block, a summary). Which correct solution is faster is a
measurement, not a name: the speed mix below is built only from measured speedups (benchmarks/builtin_speed_variants.py
writes them; `--speedups`, default kevin_jax/data/builtin_speedups.json). Without that file every task gets the plain
records, and every speedup in them is a placeholder.

Plain records (no measurements, or a task without a measured slow/fast pair), per task, with its plain solution
(PLAIN_SOLUTIONS: the correct program the corpus was built on before speed variants existed):
- first turn, "correct": the plain solution;
- first turn, "wrong": each wrong_*.py (compiles and runs, computes something else);
- first turn, "compile_error": a copy of the plain solution with one deliberate CUDA error (`threadIdx.x` misspelt
  `threadIdx_x` in its cuda_sources: nvcc's `identifier "threadIdx_x" is undefined`);
- refinement, "correct": (the compile-error attempt, its feedback) -> the correct program; (the wrong attempt, its
  feedback) -> the correct program; and (compile error, wrong) -> correct as a third turn;
- refinement, "correct", origin "<solution>:kept": after a correct attempt (first turn, or a fix, or a kept one;
  turns 2-4), the same correct program again. Without these, every refinement context after a correct kernel was
  new to the warm policy, and RL that made first turns correct made the later turns derail (second-turn answers
  parsed 0.8 -> 0.5-0.6, third- and fourth-turn kernels 7% / 0% correct even before RL: docs/LOG.md, "multi-turn RL
  learns the first turn").
The feedback of a correct attempt needs timings: where the plain solution was measured (a task measured without a
usable pair) they are its measured speedup and reference time ("feedback_speedups": "measured"); without
measurements they are ILLUSTRATIVE_SPEEDUPS and a made-up reference time per task, placeholders, and every record
that shows one says so ("feedback_speedups": "illustrative"); the answer after them is the same whatever the number.

The speed mix (a task whose measured correct solutions include a slow one S and a fast one F, F's speedup at least
--min-ratio (1.5) times S's; S = the slowest, F = the fastest measured-correct solution, any others unused), so that
the warm policy mostly writes the slow kernel and RL, not SFT, has to raise the share of fast ones:
- first turn, "correct": S and F in the ratio --fast-share (default 0.2: S four times, F once; the records are
  repeated, because kevin_jax.sft draws examples uniformly). At sampling temperature T the policy draws the rare
  branch at about p^(1/T) / (p^(1/T) + (1-p)^(1/T)): ~6% for p = 0.2 at the demo's T = 0.5, ~3% for p = 0.15;
- wrong and compile_error first answers, and the three fixes, as in the plain records, with S as the correct program;
- after a correct S attempt, keep S (the six chains above), and, in the two commonest contexts (turn 2 after a first
  correct S; turn 3 after S, S), the same --fast-share split between keeping S and rewriting it as F
  ("improve" records, origin "<S>-><F>") after feedback such as "a speedup of 0.42x ... slower than the reference";
- after a correct F attempt ([F], [S, F], [S, S, F], [F, F]), keep F: a trajectory that found F must not derail.
Each record of the mix carries the measured speedup of its answer ("speedup", null for a kernel that is not
correct), its role ("variant": "slow" | "fast") and "feedback_speedups": "measured"; the feedback of a correct
attempt shows the measured speedup of that program and the task's measured reference time.
The attempts are stored as the environment carries them (code and summary as env.parse extracts them from the earlier
answer, plus the feedback text), and kevin_jax.sft renders them through the environment's PromptRenderer. Feedback is
cuda_eval's feedback.render of a hand-built EvalResult: a compile error (the log in the shape cuda_eval's cleaned nvcc
log has), a wrong output (no error magnitudes: none were measured) or a correct kernel with its timing.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from a checkout: the repo's packages

from cuda_eval.orchestrator import feedback
from cuda_eval.api import EvalResult

from kevin_jax.env.parse import parse_response
from kevin_jax.sft import BUILTIN_CORPUS, THOUGHT
from kevin_jax.tasks import builtin_solutions

GENERIC_SUMMARY = "a custom CUDA kernel replaces the PyTorch operators."
BROKEN_IDENTIFIER = "threadIdx_x"
NUM_TRIALS = 5          # EvalConfig.num_correct_trials' default: what the feedback's "trial 1 of N" says
# Speedups shown in the feedback of correct attempts: some slower than the reference, some faster (not measured).
ILLUSTRATIVE_SPEEDUPS = (0.62, 1.18, 0.87, 1.41, 0.35, 0.96)


def answer(code: str, summary: str, thought: str = THOUGHT) -> str:
    """A QwQ-style answer as the policy writes it after the template's opening <think>."""
    return f"{thought}\n</think>\n\n```python\n{code.strip()}\n```\n\nSummary: {summary}"


def with_compile_error(source: str) -> tuple[str, str]:
    """(program with `threadIdx.x` misspelt in its first CUDA string literal, the cleaned compiler log)."""
    pos = source.find("threadIdx.x")
    if pos < 0:
        raise ValueError("no threadIdx.x to break in this solution")
    literal_start = source.rfind('r"""', 0, pos)
    if literal_start < 0 or source.find('"""', literal_start + 4, pos) >= 0:
        raise ValueError("threadIdx.x is not inside a r\"\"\" CUDA string literal")
    broken = source[:pos] + BROKEN_IDENTIFIER + source[pos + len("threadIdx.x"):]
    # load_inline's cuda.cu puts `#line 1 "cuda_sources[0]"` before the string: line 1 is its first line
    string_text = broken[literal_start + 4:pos]
    line_number = string_text.count("\n") + 1
    line_start = broken.rfind("\n", 0, pos) + 1
    line_end = broken.find("\n", pos)
    line = broken[line_start:line_end].rstrip()
    caret = " " * (pos - line_start) + "^"
    log = f'cuda_sources[0]({line_number}): error: identifier "{BROKEN_IDENTIFIER}" is undefined\n{line}\n{caret}'
    return broken, log


def compile_error_feedback(task_id: str, code: str, log: str) -> str:
    return feedback.render(EvalResult(request_id="corpus", task_id=task_id, mode="full", format_ok=True, code=code,
                                      compiled=False, compile_log=log))


def wrong_output_feedback(task_id: str, code: str) -> str:
    trial = {"trial": 0, "max_abs_err": None, "max_rel_err": None, "mismatch_frac": None, "passed": False,
             "message": None}
    return feedback.render(EvalResult(request_id="corpus", task_id=task_id, mode="full", format_ok=True, code=code,
                                      compiled=True, correct=False, trials=[trial],
                                      meta={"num_trials": NUM_TRIALS}))


def correct_feedback(task_id: str, code: str, speedup: float, ref_ms: float) -> str:
    trials = [{"trial": i, "passed": True} for i in range(NUM_TRIALS)]
    return feedback.render(EvalResult(request_id="corpus", task_id=task_id, mode="full", format_ok=True, code=code,
                                      compiled=True, correct=True, trials=trials, speedup=speedup,
                                      timing={"median_ms": ref_ms / speedup}, ref_timing={"median_ms": ref_ms},
                                      meta={"num_trials": NUM_TRIALS}))


def attempt_of(response: str, feedback_text: str) -> dict:
    """What the next prompt shows of an earlier answer: env.episode's Attempt(code, summary, feedback)."""
    parsed = parse_response(response, prompt_opens_thought=True)
    return {"code": parsed.code, "summary": parsed.summary, "feedback": feedback_text}


def plain_records(task_id: str, task_index: int, good, wrong: list, speedups, measurement: dict | None = None
                  ) -> list[dict]:
    """The plain records of one task (module docstring) with `good` as the correct program; the feedback of its
    correct attempts shows `measurement` ({speedup, ref_ms}: `good` measured on the GPU) where given, else the next
    illustrative placeholders."""
    out = []
    for s in [good] + wrong:
        out.append({"task_id": task_id, "kind": "first_turn", "quality": s.kind, "origin": s.name,
                    "attempts": [], "response": answer(s.source, GENERIC_SUMMARY)})
    broken_code, log = with_compile_error(good.source)
    broken_response = answer(broken_code, GENERIC_SUMMARY)
    out.append({"task_id": task_id, "kind": "first_turn", "quality": "compile_error",
                "origin": f"{good.name}+{BROKEN_IDENTIFIER}", "attempts": [], "response": broken_response})
    broken_attempt = attempt_of(broken_response, compile_error_feedback(task_id, broken_code, log))
    wrong_response = answer(wrong[0].source, GENERIC_SUMMARY)
    wrong_attempt = attempt_of(wrong_response, wrong_output_feedback(task_id, wrong[0].source))
    fix_compile = fix_compile_answer(good.source)
    fix_wrong = fix_wrong_answer(good.source)
    for attempts, fixed, history in (([broken_attempt], fix_compile, ["compile_error"]),
                                     ([wrong_attempt], fix_wrong, [wrong[0].kind]),
                                     ([broken_attempt, wrong_attempt], fix_wrong, ["compile_error", "wrong"])):
        out.append({"task_id": task_id, "kind": "refinement", "quality": "correct", "origin": good.name,
                    "attempt_qualities": history, "attempts": attempts, "response": fixed})
    # after a correct attempt: keep it (turns 2-4)
    ref_ms = measurement["ref_ms"] if measurement else 0.25 * (1 + task_index % 4)

    def as_correct(response: str) -> dict:
        speedup = measurement["speedup"] if measurement else next(speedups)
        return attempt_of(response, correct_feedback(task_id, good.source, speedup, ref_ms))

    keep = answer(good.source, "kept the kernel: it is correct, and no faster correct variant is known.",
                  "Okay, the previous kernel is correct. I do not see a change that keeps it correct and makes "
                  "it faster, so I will submit it again unchanged.")
    first_correct = answer(good.source, GENERIC_SUMMARY)
    for attempts, history in (([as_correct(first_correct)], ["correct"]),
                              ([broken_attempt, as_correct(fix_compile)], ["compile_error", "correct"]),
                              ([wrong_attempt, as_correct(fix_wrong)], ["wrong", "correct"]),
                              ([broken_attempt, wrong_attempt, as_correct(fix_wrong)],
                               ["compile_error", "wrong", "correct"]),
                              ([as_correct(first_correct), as_correct(keep)], ["correct", "correct"]),
                              ([as_correct(first_correct), as_correct(keep), as_correct(keep)],
                               ["correct", "correct", "correct"])):
        out.append({"task_id": task_id, "kind": "refinement", "quality": "correct", "origin": f"{good.name}:kept",
                    "attempt_qualities": history, "attempts": attempts, "response": keep,
                    "feedback_speedups": "measured" if measurement else "illustrative"})
    return out


def fix_compile_answer(source: str) -> str:
    return answer(source, f"fixed the compile error (`{BROKEN_IDENTIFIER}` -> `threadIdx.x`).",
                  "Okay, the previous attempt failed to compile: an undefined identifier in the kernel. "
                  "I will fix it and keep the rest of the kernel.")


def fix_wrong_answer(source: str) -> str:
    return answer(source, "rewrote the kernel so that it computes exactly what Model computes.",
                  "Okay, the previous attempt ran but its output was incorrect. I will check the "
                  "computation against the reference step by step and fix it.")


# ------------------------------------------------------------------------------------------ measured speed variants
DEFAULT_SPEEDUPS = BUILTIN_CORPUS.parent / "builtin_speedups.json"
DEFAULT_FAST_SHARE = 0.2
DEFAULT_MIN_RATIO = 1.5
MAX_COPIES = 10         # at most this many records per (context, split) to express --fast-share
# The correct program each task's plain records use: the one solution every task had before speed variants existed
# (judged correct on the GPU by benchmarks/eval_builtin.py and the demo runs of docs/LOG.md).
PLAIN_SOLUTIONS = {
    "L1/1_LeakyReLU": "correct_naive", "L1/2_GELU_tanh_": "correct_naive", "L1/3_Softmax_over_rows": "correct_naive",
    "L1/4_Sum_reduction_over_a_dimension": "correct_naive", "L1/5_Matmul_with_transposed_B": "correct_tiled",
    "L1/6_LayerNorm": "correct_naive", "L1/7_HingeLoss": "correct_naive", "L1/8_CrossEntropyLoss": "correct_naive",
    "L1/9_Large_tensor_scale__add": "correct_vectorized", "L1/10_Masked_fill_with_scalar": "correct_naive",
    "L1/11_Clamp_with_module_globals": "correct_naive", "L2/1_Gemm_BiasAdd_ReLU_Scaling": "correct_fused",
    "L2/2_Conv2d_Add_HardTanh": "correct_naive", "L2/3_Gemm_LayerNorm_GELU": "correct_two_kernels",
    "L2/4_Matmul_Dropout_Softmax_": "correct_two_kernels", "L2/5_Conv2d_BatchNorm_Scaling": "correct_naive",
    "L2/6_Gemm_ScaledSigmoid_Sum": "correct_two_kernels",
}


def load_speedups(path: str | Path | None) -> dict | None:
    """The measured speedups (benchmarks/builtin_speed_variants.py's JSON), or None when the file is absent."""
    if path is None or not Path(path).exists():
        return None
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data.get("solutions"), dict):
        raise ValueError(f"{path}: no 'solutions' table (expected benchmarks/builtin_speed_variants.py's output)")
    return data


def measured(data: dict | None, task_id: str, name: str) -> dict | None:
    """{speedup, ref_ms} of a solution measured correct with a positive speedup, else None."""
    entry = ((data or {}).get("solutions") or {}).get(task_id, {}).get(name)
    if not entry or entry.get("correct") is not True or not (entry.get("speedup") or 0) > 0:
        return None
    return {"speedup": float(entry["speedup"]), "ref_ms": float(entry["ref_median_ms"])}


def mix_counts(share: float, max_total: int = MAX_COPIES) -> tuple[int, int]:
    """(copies of the slow record, copies of the fast one) whose fast fraction is closest to `share` (ties: fewer
    records). share 0.2 -> (4, 1); 0.15 -> (6, 1) (1/7 = 0.143); 0.1 -> (9, 1); 0 -> (1, 0)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"fast share must be in [0, 1), got {share}")
    if share == 0.0:
        return 1, 0
    best = min(((n - f, f) for n in range(2, max_total + 1) for f in range(1, n)),
               key=lambda c: (round(abs(c[1] / (c[0] + c[1]) - share), 12), c[0] + c[1]))
    return best


def speed_pair(data: dict | None, task_id: str, correct: list, min_ratio: float):
    """(S, F, {name: measurement}) for a task with a measured slow/fast pair at least `min_ratio` apart, else None."""
    found = {s.name: m for s in correct if (m := measured(data, task_id, s.name)) is not None}
    if len(found) < 2:
        return None
    ordered = sorted((s for s in correct if s.name in found), key=lambda s: (found[s.name]["speedup"], s.name))
    slow, fast = ordered[0], ordered[-1]
    if found[fast.name]["speedup"] < min_ratio * found[slow.name]["speedup"]:
        return None
    return slow, fast, found


def speed_mix_records(task_id: str, slow, fast, found: dict, wrong: list, fast_share: float) -> list[dict]:
    """The speed mix of one task (module docstring)."""
    n_slow, n_fast = mix_counts(fast_share)
    sp_slow, sp_fast = found[slow.name]["speedup"], found[fast.name]["speedup"]
    ref_ms = sorted(m["ref_ms"] for m in found.values())[len(found) // 2]       # the task's reference time (median)
    meta = {"feedback_speedups": "measured"}

    def rec(kind, quality, origin, response, attempts=(), history=None, variant=None, speedup=None, copies=1):
        r = {"task_id": task_id, "kind": kind, "quality": quality, "origin": origin, "attempts": list(attempts),
             "response": response, "variant": variant, "speedup": speedup, **meta}
        if history is not None:
            r["attempt_qualities"] = history
        return [r] * copies

    out = []
    first_slow, first_fast = answer(slow.source, GENERIC_SUMMARY), answer(fast.source, GENERIC_SUMMARY)
    out += rec("first_turn", "correct", slow.name, first_slow, variant="slow", speedup=sp_slow, copies=n_slow)
    out += rec("first_turn", "correct", fast.name, first_fast, variant="fast", speedup=sp_fast, copies=n_fast)
    for w in wrong:
        out += rec("first_turn", "wrong", w.name, answer(w.source, GENERIC_SUMMARY))
    broken_code, log = with_compile_error(slow.source)
    broken_response = answer(broken_code, GENERIC_SUMMARY)
    out += rec("first_turn", "compile_error", f"{slow.name}+{BROKEN_IDENTIFIER}", broken_response)
    broken = attempt_of(broken_response, compile_error_feedback(task_id, broken_code, log))
    wrong_attempt = attempt_of(answer(wrong[0].source, GENERIC_SUMMARY),
                               wrong_output_feedback(task_id, wrong[0].source))
    fix_compile, fix_wrong = fix_compile_answer(slow.source), fix_wrong_answer(slow.source)
    for attempts, fixed, history in (([broken], fix_compile, ["compile_error"]),
                                     ([wrong_attempt], fix_wrong, ["wrong"]),
                                     ([broken, wrong_attempt], fix_wrong, ["compile_error", "wrong"])):
        out += rec("refinement", "correct", slow.name, fixed, attempts, history, "slow", sp_slow)

    def as_slow(response: str) -> dict:
        return attempt_of(response, correct_feedback(task_id, slow.source, sp_slow, ref_ms))

    def as_fast(response: str) -> dict:
        return attempt_of(response, correct_feedback(task_id, fast.source, sp_fast, ref_ms))

    keep_text = ("Okay, the previous kernel is correct. I will submit it again unchanged.", "kept the kernel: it is "
                 "correct.")
    keep_slow = answer(slow.source, keep_text[1], keep_text[0])
    keep_fast = answer(fast.source, keep_text[1], keep_text[0])
    improve = answer(fast.source, "rewrote the kernel for speed: same result, fewer and wider memory accesses.",
                     "Okay, the previous kernel is correct but slow. I will restructure how it reads and writes "
                     "memory and write a faster kernel that computes the same result.")
    # after a correct slow kernel: keep it; in the two commonest contexts, sometimes rewrite it as the fast one
    chains = (([as_slow(first_slow)], ["correct"], True),
              ([broken, as_slow(fix_compile)], ["compile_error", "correct"], False),
              ([wrong_attempt, as_slow(fix_wrong)], ["wrong", "correct"], False),
              ([broken, wrong_attempt, as_slow(fix_wrong)], ["compile_error", "wrong", "correct"], False),
              ([as_slow(first_slow), as_slow(keep_slow)], ["correct", "correct"], True),
              ([as_slow(first_slow), as_slow(keep_slow), as_slow(keep_slow)], ["correct", "correct", "correct"],
               False))
    for attempts, history, improvable in chains:
        copies = n_slow if improvable and n_fast else 1
        out += rec("refinement", "correct", f"{slow.name}:kept", keep_slow, attempts, history, "slow", sp_slow,
                   copies)
        if improvable and n_fast:
            out += rec("refinement", "correct", f"{slow.name}->{fast.name}", improve, attempts, history, "fast",
                       sp_fast, n_fast)
    # after a correct fast kernel: keep it
    if n_fast:
        for attempts, history in (([as_fast(first_fast)], ["correct"]),
                                  ([as_slow(first_slow), as_fast(improve)], ["correct", "correct"]),
                                  ([as_slow(first_slow), as_slow(keep_slow), as_fast(improve)],
                                   ["correct", "correct", "correct"]),
                                  ([as_fast(first_fast), as_fast(keep_fast)], ["correct", "correct"])):
            out += rec("refinement", "correct", f"{fast.name}:kept", keep_fast, attempts, history, "fast", sp_fast)
    return out


def plan(data: dict | None, min_ratio: float = DEFAULT_MIN_RATIO) -> dict[str, dict]:
    """Per task: which records it gets ("speed_mix" with S and F, or "plain" and why) and the measured speedups."""
    by_task: dict[str, list] = {}
    for sol in builtin_solutions():
        by_task.setdefault(sol.task_id, []).append(sol)
    out = {}
    for task_id, solutions in by_task.items():
        correct = [s for s in solutions if s.kind == "correct"]
        pair = speed_pair(data, task_id, correct, min_ratio)
        speeds = {s.name: (measured(data, task_id, s.name) or {}).get("speedup") for s in correct}
        if pair is None:
            why = ("no measured speedups" if data is None else
                   f"no two measured-correct solutions {min_ratio:g}x apart")
            out[task_id] = {"mix": "plain", "why": why, "speedups": speeds}
        else:
            out[task_id] = {"mix": "speed_mix", "slow": pair[0].name, "fast": pair[1].name, "speedups": speeds,
                            "unused": sorted(set(pair[2]) - {pair[0].name, pair[1].name})}
    return out


def records(data: dict | None = None, fast_share: float = DEFAULT_FAST_SHARE,
            min_ratio: float = DEFAULT_MIN_RATIO) -> list[dict]:
    """The corpus: per task the speed mix where `data` (load_speedups) has a measured pair, else the plain records."""
    mix_counts(fast_share)      # validates
    by_task: dict[str, list] = {}
    for sol in builtin_solutions():
        by_task.setdefault(sol.task_id, []).append(sol)
    out = []
    speedups = itertools.cycle(ILLUSTRATIVE_SPEEDUPS)
    for task_index, (task_id, solutions) in enumerate(by_task.items()):
        correct = [s for s in solutions if s.kind == "correct"]
        wrong = [s for s in solutions if s.kind == "wrong"]
        pair = speed_pair(data, task_id, correct, min_ratio)
        if pair is not None:
            out += speed_mix_records(task_id, *pair, wrong, fast_share)
            continue
        plain = PLAIN_SOLUTIONS.get(task_id)
        good = next((s for s in correct if s.name == plain), correct[0])
        out += plain_records(task_id, task_index, good, wrong, speedups, measured(data, task_id, good.name))
    return out


def corpus_text(data: dict | None = None, fast_share: float = DEFAULT_FAST_SHARE,
                min_ratio: float = DEFAULT_MIN_RATIO) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records(data, fast_share, min_ratio))


def describe(data: dict | None, path, min_ratio: float) -> str:
    """What the corpus is built from, said plainly (printed by main)."""
    tasks = plan(data, min_ratio)
    mixed = {t: p for t, p in tasks.items() if p["mix"] == "speed_mix"}
    if data is None:
        return (f"no measured speedups ({path} is absent): every task gets the plain records with no speed variant; "
                f"the speedups and reference times in the feedback of correct attempts are illustrative "
                f"placeholders {ILLUSTRATIVE_SPEEDUPS}, not measurements (records marked "
                f'"feedback_speedups": "illustrative"). Measure with benchmarks/builtin_speed_variants.py.')
    info = data.get("measured") or {}
    if info.get("mode") == "compile_only":
        return (f"{path} is a compile-only run (no GPU): nothing was measured, every task gets the plain records "
                f"with illustrative placeholder speedups {ILLUSTRATIVE_SPEEDUPS}")
    lines = [f"measured speedups from {path} ({info.get('gpu') or 'GPU not recorded'}): "
             f"{len(mixed)} of {len(tasks)} tasks get the speed mix"]
    for t, p in tasks.items():
        if p["mix"] == "speed_mix":
            lines.append(f"  {t}: slow {p['slow']} {p['speedups'][p['slow']]:.2f}x, fast {p['fast']} "
                         f"{p['speedups'][p['fast']]:.2f}x" + (f" (unused: {', '.join(p['unused'])})"
                                                               if p["unused"] else ""))
        else:
            plain = PLAIN_SOLUTIONS.get(t)
            shown = (f"measured {plain} {p['speedups'][plain]:.2f}x in the feedback" if p["speedups"].get(plain)
                     else "illustrative feedback speedups")
            lines.append(f"  {t}: plain records ({p['why']}; {shown})")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the shipped corpus is up to date")
    parser.add_argument("--out", default=str(BUILTIN_CORPUS))
    parser.add_argument("--speedups", default=str(DEFAULT_SPEEDUPS),
                        help="measured speedups (benchmarks/builtin_speed_variants.py); absent = no speed mix")
    parser.add_argument("--fast-share", type=float, default=DEFAULT_FAST_SHARE,
                        help="share of the fast variant among correct first answers and among the answers after a "
                             "correct slow kernel (default %(default)s)")
    parser.add_argument("--min-ratio", type=float, default=DEFAULT_MIN_RATIO,
                        help="a task gets the speed mix only if its fastest measured-correct solution is at least "
                             "this many times faster than its slowest (default %(default)s)")
    args = parser.parse_args(argv)
    data = load_speedups(args.speedups)
    text = corpus_text(data, args.fast_share, args.min_ratio)
    print(describe(data, args.speedups, args.min_ratio), file=sys.stderr)
    out = Path(args.out)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else ""
        if current != text:
            print(f"{out} is out of date: run python scripts/make_warm_start_corpus.py", file=sys.stderr)
            return 1
        print(f"{out} is up to date ({len(text.splitlines())} records, {len(text.encode())} bytes)")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}: {len(text.splitlines())} records, {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
