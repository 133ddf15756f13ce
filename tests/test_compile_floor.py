"""benchmarks/compile_floor.py --lines-only: the units it compares are what it says they are (host side, no nvcc
run): naming at::Tensor parses far more than a plain kernel, one ATen operator header adds ATen/Context.h on top, and
a real candidate's light-header unit is no smaller than that, unless its operator headers are the lean ones, and torch/extension.h is far larger still."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc and g++")
def test_the_floor_units_grow_as_their_headers_do():
    proc = subprocess.run([sys.executable, "benchmarks/compile_floor.py", "--lines-only"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [int(n.replace(",", "")) for n in re.findall(r"^\| [^|]+ \| ([0-9,]+) \| - \| - \|$", proc.stdout, re.M)]
    assert len(lines) == 6, proc.stdout
    plain, tensor, operator, light, lean, extension = lines
    assert tensor > 5 * plain and operator > 1.3 * tensor and light >= operator, proc.stdout
    assert lean < 0.75 * light and lean < operator, proc.stdout  # what the lean operator headers spare
    assert extension > 1.5 * light, proc.stdout        # what the light header spares a candidate's unit
