"""Which input leaves the affine trials change in each task of a KernelBench checkout, and why the others do not
(cuda_eval/judge/affine.py), without a GPU: every module-level integer of a task is shrunk to at most 64 before
get_inputs() runs (the leaves' distributions do not depend on their sizes), so all of levels 1 and 2 take seconds.

    python scripts/affine_exceptions.py ../shared/kernelbench [--levels 1 2] [--json out.json]

Prints one line per task: the leaves that change (signed / nonnegative), the others with the rule that keeps them,
and the tasks on affine.EXCEPTIONS with their reason; --keys prints the source keys of the named tasks, for
EXCEPTIONS.
"""
from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuda_eval.judge import affine  # noqa: E402

SHRINK = 64


def shrunk_inputs(source: str) -> list:
    module = types.ModuleType("kernelbench_task")
    exec(compile(source, "task", "exec"), module.__dict__)   # the task's constants, Model and get_inputs
    for name, value in list(vars(module).items()):
        if type(value) is int and value > SHRINK:
            setattr(module, name, SHRINK)
        elif type(value) is tuple and all(type(v) is int for v in value):
            setattr(module, name, tuple(min(v, SHRINK) for v in value))
    torch.manual_seed(0)
    return list(module.get_inputs())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root")
    parser.add_argument("--levels", nargs="*", default=["1", "2"])
    parser.add_argument("--json")
    parser.add_argument("--keys", nargs="*", default=[], help="tasks (level1/90_cumprod.py ...) to print keys of")
    args = parser.parse_args(argv)
    root = Path(args.root)
    rows = {}
    for level in args.levels:
        for path in sorted((root / f"level{level}").glob("*.py"), key=lambda p: int(p.name.split("_")[0])):
            name = f"level{level}/{path.name}"
            source = path.read_text()
            try:
                leaves, why = affine.plan(shrunk_inputs(source), source)
                rows[name] = {"changed": {str(i): kind for i, kind, _ in leaves}, "not_changed": why}
            except Exception as e:  # noqa: BLE001 - a task this shortcut cannot load: said so
                rows[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
            print(f"{name:70s} {json.dumps(rows[name])}")
    for name in args.keys:
        print(f"{affine.source_key((root / name).read_text())}  {name}")
    counts = {"changing some leaf": sum(bool(r.get("changed")) for r in rows.values()),
              "changing none": sum(not r.get("changed") and "error" not in r for r in rows.values()),
              "not loaded": sum("error" in r for r in rows.values())}
    print(json.dumps(counts))
    if args.json:
        Path(args.json).write_text(json.dumps({"tasks": rows, "counts": counts}, indent=1))


if __name__ == "__main__":
    main()
