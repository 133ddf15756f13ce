"""One case per process, for the benchmarks that compile or allocate on a fresh JAX each time (aot_memory,
sampler_aot, optimizer_offload): the benchmark runs itself again with `--worker <case>`, the child prints its result
as one tagged JSON line (`report`) and the parent collects it (`run_case`), so that one case's crash, out-of-memory
or hang costs that case only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Mapping, Sequence

TAG = "CASE_RESULT "


def report(result: Mapping) -> None:
    """The child's result: the one line the parent reads."""
    print(TAG + json.dumps(result), flush=True)


def run_case(script: str, case: str, argv: Sequence[str], timeout_s: float,
             env: Mapping[str, str] | None = None) -> dict:
    """`python <script> --worker <case> <argv>`: the child's result (printed once its case is done, so kept even if
    the process then fails on its way out), or {"error": ...} saying why there is none (it timed out, or its exit
    code and the last lines of its output)."""
    cmd = [sys.executable, os.path.abspath(script), "--worker", case, *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env=None if env is None else dict(env))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s}s"}
    found = [line for line in proc.stdout.splitlines() if line.startswith(TAG)]
    if found:
        return json.loads(found[-1][len(TAG):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}" + (": " + " | ".join(tail) if tail else "")}
