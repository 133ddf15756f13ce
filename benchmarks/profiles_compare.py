"""The same candidates under two evaluation profiles (orchestrator/scoring.py): which verdicts and flags differ between
Kevin's training rules and KernelBench's?

    python benchmarks/profiles_compare.py --out $OUT/profiles.json          # a GPU, ~5 min on an H100 + 16 cores

The set: the built-in tasks' solutions (correct, wrong and hacking ones), the honest corpus and the adversarial
corpus of tests/cuda_eval/corpus, plus benchmarks/candidates (leaderboard-style programs, some keeping PyTorch ops).
One Evaluator per profile over a shared build cache (the second profile's builds are cache hits), every candidate
judged under each. Per profile: accepted (correct, no flag that zeroes the score), rejected by flags, incorrect,
crashed/failed, and the number with advisory flags; then every candidate whose verdict differs, with the flags that
decide it. Expected: adversarial candidates are rejected under both where KernelBench's rules catch them, and
accepted-with-advisory-flags under kernelbench where only our runtime checks do (listed as such).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))

import corpus_index  # noqa: E402  (the corpus loader lives with the tests)

CANDIDATES = REPO / "benchmarks" / "candidates"


def the_set() -> list[tuple[str, str, str, str]]:
    """(id, task_id, task_source, response) of every candidate."""
    from kevin_jax.tasks import builtin_solutions, load_builtin_tasks
    out = [(c.id, c.task, c.task_source, c.response) for kind in ("honest", "adversarial")
           for c in corpus_index.load(kind)]
    tasks = load_builtin_tasks().by_id()
    out += [(f"builtin/{s.task_id}/{s.name}", s.task_id, tasks[s.task_id].source,
             f"```python\n{s.source.rstrip()}\n```\n") for s in builtin_solutions() if s.task_id in tasks]
    out += [(f"bench/{p.stem}", f"bench/{p.stem}", p.read_text(), f"```python\n{(CANDIDATES / p.name).read_text()}```\n")
            for p in sorted((CANDIDATES / "tasks").glob("*.py")) if (CANDIDATES / p.name).exists()]
    return out


def verdict(r) -> str:
    if not r.format_ok:
        return "format_error"
    if r.hack_flags and r.correct is None:
        return "rejected_unrun"
    if r.compiled is False:
        return "compile_error"
    if r.runtime_error and not r.correct:
        return "runtime_error"
    if r.correct is False:
        return "incorrect"
    if r.hack_flags:
        return "rejected"
    return "accepted" if r.correct else "unknown"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--profiles", default="kevin,kernelbench")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--compile-workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    from cuda_eval.api import EvalConfig, EvalRequest, Evaluator

    items = the_set()
    names = [n.strip() for n in args.profiles.split(",") if n.strip()]
    cache = tempfile.mkdtemp(prefix="profiles_cache_", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.chmod(cache, 0o755)
    results: dict[str, dict] = {}
    t0 = time.monotonic()
    for name in names:
        cfg = EvalConfig(profile=name, devices=str(args.device), compile_workers=args.compile_workers,
                         cache_dir=cache, share_identical=False)
        with Evaluator(cfg) as ev:
            rs = ev.evaluate([EvalRequest(task, src, resp, f"{name}:{cid}") for cid, task, src, resp in items])
        results[name] = {cid: {"verdict": verdict(r), "correct": r.correct, "speedup": r.speedup,
                               "flags": sorted({f["code"] for f in r.hack_flags}),
                               "advisory": sorted({f["code"] for f in r.advisory_flags}),
                               "error": (r.runtime_error or r.format_error or "")[:200]}
                         for (cid, *_), r in zip(items, rs)}
        print(f"profile {name}: {len(rs)} verdicts after {time.monotonic() - t0:.0f} s", flush=True)
    out = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "n": len(items), "results": results,
           "wall_s": time.monotonic() - t0}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))

    kinds = ["accepted", "rejected", "rejected_unrun", "incorrect", "runtime_error", "compile_error", "format_error"]
    print(f"\n## {len(items)} candidates under profiles {names}\n")
    print("| profile | " + " | ".join(kinds) + " | with advisory flags |")
    print("|---|" + "---|" * (len(kinds) + 1))
    for name in names:
        rs = results[name].values()
        print(f"| {name} | " + " | ".join(str(sum(r["verdict"] == k for r in rs)) for k in kinds)
              + f" | {sum(bool(r['advisory']) for r in rs)} |")
    if len(names) >= 2:
        a, b = names[0], names[1]
        print(f"\n| candidate | {a} | {a} flags | {b} | {b} flags | {b} advisory |\n|---|---|---|---|---|---|")
        for cid, *_ in items:
            ra, rb = results[a][cid], results[b][cid]
            if ra["verdict"] != rb["verdict"] or ra["flags"] != rb["flags"]:
                print(f"| {cid} | {ra['verdict']} | {','.join(ra['flags'])} | {rb['verdict']} | "
                      f"{','.join(rb['flags'])} | {','.join(rb['advisory'])} |")


if __name__ == "__main__":
    main()
