"""Writes the warm-start corpus (kevin_jax/data/warm_start_corpus.jsonl) from the built-in solutions.

    python scripts/make_warm_start_corpus.py            # rewrite the shipped file
    python scripts/make_warm_start_corpus.py --check    # exit 1 if the shipped file is out of date (the tests run it)

For every built-in task (kevin_jax/tasks/builtin_solutions), answers of several qualities, as the policy would write
them (a short thought, the program in a ```python block, a summary):
- first turn, "correct": each correct_*.py (no task has two correct solutions yet, so none is marked fast or slow:
  which one is faster is a measurement, not a name);
- first turn, "wrong": each wrong_*.py (compiles and runs, computes something else);
- first turn, "compile_error": a copy of the first correct solution with one deliberate CUDA error (`threadIdx.x`
  misspelt `threadIdx_x` in its cuda_sources: nvcc's `identifier "threadIdx_x" is undefined`);
- refinement, "correct": (the compile-error attempt, its feedback) -> the correct program; (the wrong attempt, its
  feedback) -> the correct program; and (compile error, wrong) -> correct as a third turn;
- refinement, "correct", origin "<solution>:kept": after a correct attempt (first turn, or a fix, or a kept one;
  turns 2-4), the same correct program again. Without these, every refinement context after a correct kernel was
  new to the warm policy, and RL that made first turns correct made the later turns derail (second-turn answers
  parsed 0.8 -> 0.5-0.6, third- and fourth-turn kernels 7% / 0% correct even before RL: docs/LOG.md, "multi-turn RL
  learns the first turn"). No task has a second, faster correct solution, so keeping the kernel is the best answer
  the corpus can show.
The attempts are stored as the environment carries them (code and summary as env.parse extracts them from the earlier
answer, plus the feedback text), and kevin_jax.sft renders them through the environment's PromptRenderer. Feedback is
cuda_eval.feedback.render of a hand-built EvalResult of the verdicts that need no timing: a compile error (the log in
the shape cuda_eval's cleaned nvcc log has) and a wrong output (no error magnitudes: none were measured). The
feedback of a correct attempt needs timings: those are illustrative inputs (ILLUSTRATIVE_SPEEDUPS, a reference time
per task), not measurements, and the answer after them is the same whatever the number.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from cuda_eval import feedback
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


def records() -> list[dict]:
    by_task: dict[str, list] = {}
    for sol in builtin_solutions():
        by_task.setdefault(sol.task_id, []).append(sol)
    out = []
    speedups = itertools.cycle(ILLUSTRATIVE_SPEEDUPS)
    for task_index, (task_id, solutions) in enumerate(by_task.items()):
        correct = [s for s in solutions if s.kind == "correct"]
        wrong = [s for s in solutions if s.kind == "wrong"]
        for s in correct + wrong:
            out.append({"task_id": task_id, "kind": "first_turn", "quality": s.kind, "origin": s.name,
                        "attempts": [], "response": answer(s.source, GENERIC_SUMMARY)})
        good = correct[0]
        broken_code, log = with_compile_error(good.source)
        broken_response = answer(broken_code, GENERIC_SUMMARY)
        out.append({"task_id": task_id, "kind": "first_turn", "quality": "compile_error",
                    "origin": f"{good.name}+{BROKEN_IDENTIFIER}", "attempts": [], "response": broken_response})
        broken_attempt = attempt_of(broken_response, compile_error_feedback(task_id, broken_code, log))
        wrong_response = answer(wrong[0].source, GENERIC_SUMMARY)
        wrong_attempt = attempt_of(wrong_response, wrong_output_feedback(task_id, wrong[0].source))
        fix_compile = answer(good.source, f"fixed the compile error (`{BROKEN_IDENTIFIER}` -> `threadIdx.x`).",
                             "Okay, the previous attempt failed to compile: an undefined identifier in the kernel. "
                             "I will fix it and keep the rest of the kernel.")
        fix_wrong = answer(good.source, "rewrote the kernel so that it computes exactly what Model computes.",
                           "Okay, the previous attempt ran but its output was incorrect. I will check the "
                           "computation against the reference step by step and fix it.")
        for attempts, fixed, history in (([broken_attempt], fix_compile, ["compile_error"]),
                                         ([wrong_attempt], fix_wrong, [wrong[0].kind]),
                                         ([broken_attempt, wrong_attempt], fix_wrong, ["compile_error", "wrong"])):
            out.append({"task_id": task_id, "kind": "refinement", "quality": "correct", "origin": good.name,
                        "attempt_qualities": history, "attempts": attempts, "response": fixed})
        # after a correct attempt: keep it (turns 2-4)
        ref_ms = 0.25 * (1 + task_index % 4)

        def as_correct(response: str) -> dict:
            return attempt_of(response, correct_feedback(task_id, good.source, next(speedups), ref_ms))

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
                        "attempt_qualities": history, "attempts": attempts, "response": keep})
    return out


def corpus_text() -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the shipped corpus is up to date")
    parser.add_argument("--out", default=str(BUILTIN_CORPUS))
    args = parser.parse_args(argv)
    text = corpus_text()
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
