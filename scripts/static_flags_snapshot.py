"""The static policy's flags on every program on disk, as JSON, so that a change of the rules can be checked against
every program the repository holds (corpora, built-in solutions, benchmark candidates, the warm-start corpus) and
KernelBench's task files: what moved, and nothing else.

    python scripts/static_flags_snapshot.py --out before.json [--kernelbench /path/to/KernelBench]
    python scripts/static_flags_snapshot.py --diff before.json after.json

A program is every .py file of the repository (cuda_eval's own modules too: they only have to stay the same) and
every Python block of a response in kevin_jax/data/*.jsonl; each is checked under the "kevin" and "cpu" policies.
"""
import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuda_eval.static import checks  # noqa: E402

_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
_SKIP = {".git", "build", "__pycache__", ".venv", "venv"}


def programs(kernelbench: Path | None) -> dict[str, str]:
    found: dict[str, str] = {}
    roots = [REPO] + ([kernelbench] if kernelbench else [])
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if _SKIP & set(path.relative_to(root).parts):
                continue
            label = str(path.relative_to(REPO)) if root == REPO else f"kernelbench/{path.relative_to(root)}"
            found[label] = path.read_text(errors="replace")
    for path in sorted((REPO / "kevin_jax" / "data").glob("*.jsonl")):
        for i, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            blocks = [b for s in _strings(json.loads(line)) for b in _BLOCK.findall(s)]  # responses, turns
            for j, block in enumerate(blocks):
                found[f"{path.relative_to(REPO)}:{i}:{j}"] = block
    return found


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [s for v in value for s in _strings(v)] if isinstance(value, list) else []


def snapshot(kernelbench: Path | None) -> dict[str, dict[str, list[str]]]:
    out = {}
    for label, code in programs(kernelbench).items():
        out[label] = {policy: sorted(f"{f.code}: {f.reason}" for f in
                                     checks.static_check(code, checks.StaticPolicy.named(policy)))
                      for policy in ("kevin", "cpu")}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="write the snapshot here")
    p.add_argument("--kernelbench", default="/work/shared/kernelbench",
                   help="KernelBench's task files (level1..3), when present")
    p.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two snapshots")
    args = p.parse_args()
    if args.diff:
        before, after = (json.loads(Path(x).read_text()) for x in args.diff)
        changed = 0
        for label in sorted(set(before) | set(after)):
            if before.get(label) != after.get(label):
                changed += 1
                print(f"{label}:\n  before {before.get(label)}\n  after  {after.get(label)}")
        common = len(set(before) & set(after))
        print(f"{len(before)} programs before, {len(after)} after, {common} in both; {changed} changed")
        return
    kb = Path(args.kernelbench) if args.kernelbench and Path(args.kernelbench).is_dir() else None
    snap = snapshot(kb)
    text = json.dumps(snap, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text)
    flagged = sum(1 for v in snap.values() if v["kevin"])
    print(f"{len(snap)} programs, {flagged} with flags under the kevin policy")


if __name__ == "__main__":
    main()
