"""benchmarks/tracer_overhead.py runs and prints its table (no timing asserted: a benchmark's numbers live in
docs/LOG.md)."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_tracer_overhead_table():
    proc = subprocess.run([sys.executable, "benchmarks/tracer_overhead.py", "--calls", "20", "--rounds", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = re.findall(r"^\| ([^|]+) \| ([0-9.]+) \|$", proc.stdout, re.M)
    assert [name for name, _ in rows] == ["untraced", "ForwardTrace",
                                         "ForwardTrace, sys's hook functions guarded (the worker)"], proc.stdout
    assert all(float(us) > 0 for _, us in rows), proc.stdout
