"""Device check of the environment: the episode runner with a scripted policy and the REAL evaluator on the built-in
tasks, asserting the expected verdicts.

    python benchmarks/env_scripted.py --out $OUT/env_scripted.json

Every built-in task gets one trajectory of two turns, replayed from kevin_jax/tasks/builtin_solutions/:
  turn 0: the task's wrong solution        -> expected: compiles, runs, incorrect
  turn 1: the task's correct solution      -> expected: correct, no hack flag, a speedup
The policy only replays text; everything else is the product path: prompts rendered with the built-in tokenizer,
parse, one cuda_eval evaluate() call per round, scores, returns, advantages, JSONL. Prints a table (one row per
turn), the per-round wall times, and exits 1 if any verdict differs from the expectation. On a machine without a GPU
the evaluator runs in compile_only mode: then only "compiles" is checked.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuda_eval.api import EvalConfig, Evaluator  # noqa: E402
from kevin_jax.env.episode import EnvConfig, EpisodeRunner  # noqa: E402
from kevin_jax.env.policy import Generation  # noqa: E402
from kevin_jax.model.tokenizer import load_tokenizer  # noqa: E402
from kevin_jax.reward import RewardConfig  # noqa: E402
from kevin_jax.env.trajectory import Turn, write_trajectories  # noqa: E402
from kevin_jax.rl.advantages import AdvantageConfig, assign_returns  # noqa: E402
from kevin_jax.tasks import builtin_solutions, load_builtin_tasks  # noqa: E402

PLAN = ("wrong", "correct")


class ScriptedSolutionsPolicy:
    """Replays the built-in solutions: recognises the task by its source in the prompt and the turn by the number of
    earlier attempts shown. Log-probs are zeros (nothing is trained here)."""

    def __init__(self, tokenizer, tasks, solutions):
        self.tok = tokenizer.hf
        self.tasks = tasks
        self.solutions = solutions

    def generate(self, prompts, max_new_tokens, seed):
        out = []
        for prompt in prompts:
            text = self.tok.decode(list(prompt), skip_special_tokens=False, clean_up_tokenization_spaces=False)
            task = next(t for t in self.tasks if t.source.strip() in text)
            turn = text.count("\nAttempt ")
            kind = PLAN[turn]
            code = self.solutions[(task.task_id, kind)].source
            answer = (f"I will use the {kind} solution.\n</think>\n\n```python\n{code}\n```\n\n"
                      f"Summary: replayed the built-in {kind} solution.")
            ids = self.tok(answer, add_special_tokens=False)["input_ids"] + [self.tok.convert_tokens_to_ids(
                "<|im_end|>")]
            out.append(Generation(ids, [0.0] * len(ids), "eos"))
        return out


def expectation_failures(kind: str, turn: Turn) -> list[str]:
    verdict = turn.verdict
    problems = []
    if not verdict["format_ok"]:
        problems.append(f"format error: {verdict['format_error']}")
    if verdict["compiled"] is not True:
        problems.append("did not compile")
    if verdict["mode"] != "full":
        return problems  # compile_only: nothing ran, correctness is not checked
    if verdict["runtime_error"]:
        problems.append("runtime error")
    if kind == "correct" and not turn.correct:
        problems.append(f"expected correct, got correct={verdict['correct']} flags={verdict['hack_flags']}")
    if kind == "correct" and not verdict.get("speedup"):
        problems.append("no speedup")
    if kind == "wrong" and verdict["correct"] is not False:
        problems.append(f"expected incorrect, got correct={verdict['correct']}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="env_scripted.json", help="JSON results (the trajectories go next to it)")
    parser.add_argument("--devices", default="all", help="GPUs for the evaluator")
    parser.add_argument("--gpu-name", default="auto", help="the GPU named in the prompt (auto: the evaluator's)")
    parser.add_argument("--tasks", default="", help="comma-separated task ids (default: all built-in tasks)")
    parser.add_argument("--cache-dir", default="/var/tmp/cuda_eval_cache",
                        help="the evaluator's build cache (must be readable by the sandbox uids)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    tasks = list(load_builtin_tasks().tasks)
    if args.tasks:
        wanted = set(args.tasks.split(","))
        tasks = [t for t in tasks if t.task_id in wanted]
    solutions = {}
    for s in builtin_solutions():
        solutions.setdefault((s.task_id, s.kind), s)  # the first (alphabetical) solution of each kind
    tokenizer = load_tokenizer()
    policy = ScriptedSolutionsPolicy(tokenizer, tasks, solutions)
    env = EnvConfig(num_turns=len(PLAN), num_trajectories=1, max_prompt_tokens=60_000, max_response_tokens=60_000,
                    gpu_name=args.gpu_name)
    t0 = time.perf_counter()
    with Evaluator(EvalConfig(devices=args.devices, mode="auto", cache_dir=args.cache_dir)) as evaluator:
        start_s = time.perf_counter() - t0
        result = EpisodeRunner(policy, evaluator, tokenizer, env, RewardConfig()).run(tasks, step=0, seed=0)
    assign_returns(result.trajectories, RewardConfig(), AdvantageConfig())   # the environment scores turns; RL the rest
    total_s = time.perf_counter() - t0

    rows, failures = [], 0
    header = f"{'task':38s} {'turn':>4s} {'solution':28s} {'mode':12s} {'compiled':8s} {'correct':7s} " \
             f"{'ref_ms':>7s} {'cand_ms':>8s} {'speedup':>7s} {'score':>6s} {'flags':5s} {'compile_s':>9s} " \
             f"{'run_s':>6s}  verdict"
    print(header)
    print("-" * len(header))
    for traj in result.trajectories:
        for turn in traj.turns:
            v = turn.verdict
            kind = PLAN[turn.turn]
            problems = expectation_failures(kind, turn)
            failures += bool(problems)
            st = v.get("stage_times") or {}
            speedup = f"{v['speedup']:.2f}" if v.get("speedup") else "-"
            ref_ms, cand_ms = (f"{t['median_ms']:.3f}" if t else "-" for t in (v.get("ref_timing"), v.get("timing")))
            print(f"{traj.task_id:38s} {turn.turn:4d} {solutions[(traj.task_id, kind)].name:28.28s} {v['mode']:12s} "
                  f"{str(v['compiled']):8s} {str(v['correct']):7s} {ref_ms:>7s} {cand_ms:>8s} {speedup:>7s} "
                  f"{turn.score:6.2f} "
                  f"{len(v['hack_flags']):5d} {st.get('compile', 0):9.1f} {st.get('run', 0):6.1f}  "
                  f"{'OK' if not problems else 'FAIL: ' + '; '.join(problems)}")
            if problems:
                print("    feedback: " + (v.get("feedback") or "")[:600].replace("\n", "\n    "))
            rows.append({"task_id": traj.task_id, "turn": turn.turn, "solution": solutions[(traj.task_id, kind)].name,
                         "expected": kind, "problems": problems, "score": turn.score, "return": turn.return_,
                         "verdict": v})
    print()
    print(f"{'round':>5s} {'live':>4s} {'generate_s':>10s} {'evaluate_s':>10s} {'total_s':>8s}")
    for r in result.rounds:
        print(f"{r.round:5d} {r.live:4d} {r.generate_s:10.2f} {r.evaluate_s:10.2f} {r.total_s:8.2f}")
    fast_refs = sorted({r["task_id"] for r in rows if (r["verdict"].get("ref_timing") or {}).get("median_ms", 1) < 0.1})
    if fast_refs:
        print(f"\nreference median below 0.1 ms (too short to time well; enlarge the task): {', '.join(fast_refs)}")
    print(f"\nevaluator start {start_s:.1f} s, whole run {total_s:.1f} s; {failures} of {len(rows)} verdicts differ "
          f"from the expectation")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_trajectories(out.with_suffix(".trajectories.jsonl"), result.trajectories)
    out.write_text(json.dumps({"failures": failures, "turns": rows, "evaluator_start_s": start_s,
                               "total_s": total_s, "rounds": [vars(r) for r in result.rounds]}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
