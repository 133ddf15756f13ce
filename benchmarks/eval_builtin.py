"""Device run of launch/eval.py on the built-in tasks: the table, metrics.json and plots, as a user gets them.

    python benchmarks/eval_builtin.py --out $OUT/eval                 # parts A and B (~4-6 min, cold caches)
    python benchmarks/eval_builtin.py --out $OUT/eval_policy --parts=C   # the one-GPU config's policy

A. reference_solutions/: the built-in solutions as an "external model" (launch/eval.py --external): per task two
   trajectories of two turns, [wrong, correct] and [correct, wrong]. Expected with the real evaluator: correct
   avg 50% / best@2 100% after 1 turn, avg 100% after 2; performance = the solutions' speedups over eager. The
   script exits 1 if a verdict differs (wrong solutions must be incorrect, correct ones correct and unflagged).
B. torch_compile/: the same on the first --compile-tasks level-1 tasks with --torch_compile_baseline: speedups vs
   eager and vs torch.compile side by side.
C. one_gpu_policy/: `launch/eval.py --config=configs/one_gpu.py --part=all` with 4 trajectories x 2
   turns: the config's starting policy (Qwen2.5-0.5B shape, built-in tokenizer, 150-step warm start on the
   training tasks' reference solutions) sampled by the JAX sampler and judged by cuda_eval on the same GPU.
Each part is one launch/eval.py process (the real command line); their tables are printed and saved in its folder.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kevin_jax.tasks import builtin_solutions, load_builtin_tasks  # noqa: E402

PLANS = (("wrong", "correct"), ("correct", "wrong"))


def answer(code: str, kind: str) -> str:
    return f"Here is the kernel.\n\n```python\n{code}\n```\n\nSummary: the built-in {kind} solution."


def write_reference_responses(path: Path, task_ids=None) -> int:
    by_kind: dict[tuple[str, str], str] = {}
    for s in builtin_solutions():
        by_kind.setdefault((s.task_id, s.kind), s.source)       # the first of each kind
    tasks = [t.task_id for t in load_builtin_tasks().tasks if task_ids is None or t.task_id in task_ids]
    rows = [{"task_id": t, "trajectory": j, "turn": i, "response": answer(by_kind[(t, kind)], kind),
             "model": "built-in reference solutions"}
            for t in tasks for j, plan in enumerate(PLANS) for i, kind in enumerate(plan)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(tasks)


def launch(args: list[str], log_path: Path, timeout_s: float) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, str(REPO / "launch" / "eval.py"), *args]
    print("$", " ".join(cmd), flush=True)
    with open(log_path, "w") as log:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=timeout_s, cwd=REPO)
    print(done.stdout, flush=True)
    if done.returncode != 0:
        print(log_path.read_text()[-4000:], file=sys.stderr)
        raise SystemExit(f"launch/eval.py failed ({done.returncode}); log: {log_path}")
    return time.perf_counter() - t0


def check_reference(out: Path, torch_compile: bool = False) -> list[str]:
    """Every built-in solution judged as expected (wrong = incorrect, correct = correct and clean); with
    `torch_compile`, every correct one also has a torch.compile timing (part B once flagged every honest kernel
    and the script still exited 0, because part B went unchecked)."""
    problems = []
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        traj = json.loads(line)
        for turn in traj["turns"]:
            kind = PLANS[traj["traj_index"]][turn["turn"]]
            v = turn["verdict"]
            ok = v.get("correct") is True and not v.get("hack_flags")
            if ok != (kind == "correct"):
                problems.append(f"{traj['task_id']} {kind}: correct={v.get('correct')} flags="
                                f"{[f['code'] for f in v.get('hack_flags') or []]} {v.get('feedback', '')[:200]}")
            elif ok and torch_compile:
                compiled = (v.get("meta") or {}).get("ref_compile_timing") or {}
                if not compiled.get("median_ms"):
                    problems.append(f"{traj['task_id']} {kind}: no torch.compile timing: {compiled}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=str(REPO / "configs" / "one_gpu.py"))
    parser.add_argument("--tasks", default="", help="comma-separated task ids for part A (default: all built-in)")
    parser.add_argument("--compile-tasks", type=int, default=3, help="tasks for part B (0 = skip B)")
    parser.add_argument("--parts", default="A,B", help="which parts to run (A, B, C; see above)")
    parser.add_argument("--policy-trajectories", type=int, default=4)
    parser.add_argument("--policy-turns", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=540)
    args = parser.parse_args()
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    times = {}
    config = f"--config={args.config}"

    parts = {p.strip().upper() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"A", "B", "C"}:
        parser.error(f"--parts takes a comma-separated subset of A,B,C, got {args.parts!r}")
    n, mode, problems = 0, None, []
    if "A" in parts:
        responses = out / "reference_responses.jsonl"
        n = write_reference_responses(responses, set(args.tasks.split(",")) if args.tasks else None)
        times["A_reference"] = launch([config, f"--external={responses}", f"--out={out / 'reference_solutions'}",
                                       "--title=built-in reference solutions"], out / "reference.log", args.timeout_s)
        mode = json.loads((out / "reference_solutions" / "metrics.json").read_text())["metrics"]["mode"]
        problems = check_reference(out / "reference_solutions") if mode == "full" else []
        if mode != "full":
            print("compile-only verdicts (no GPU): the expected verdicts were not checked", flush=True)

    if "B" in parts and args.compile_tasks:
        level1 = [t.task_id for t in load_builtin_tasks(levels=[1]).tasks][:args.compile_tasks]
        subset = out / "compile_responses.jsonl"
        write_reference_responses(subset, set(level1))
        times["B_torch_compile"] = launch([config, f"--external={subset}", f"--out={out / 'torch_compile'}",
                                           "--torch_compile_baseline",
                                           "--title=built-in solutions vs eager and torch.compile"],
                                          out / "torch_compile.log", args.timeout_s)
        if json.loads((out / "torch_compile" / "metrics.json").read_text())["metrics"]["mode"] == "full":
            problems += [f"B: {p}" for p in check_reference(out / "torch_compile", torch_compile=True)]
    if "C" in parts:
        times["C_policy"] = launch([config, "--part=all", f"--out={out / 'one_gpu_policy'}",
                                    f"--config.env.num_trajectories={args.policy_trajectories}",
                                    f"--config.env.num_turns={args.policy_turns}"],
                                   out / "policy.log", args.timeout_s)
    summary = {"tasks": n, "mode": mode, "times_s": times, "reference_problems": problems}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    if problems:
        print(f"{len(problems)} built-in solution verdict(s) differ from the expectation", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
