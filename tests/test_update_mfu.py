"""benchmarks/update_mfu.py's padding table (host side, no model) at configs/kevin32b.py's 4-GPU layout and Kevin's
length mix: the bucketed rows the config uses must pad far less than one row length for the whole batch."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bucketed_rows_cut_the_padding_of_a_kevin_batch():
    proc = subprocess.run([sys.executable, "benchmarks/update_mfu.py", "--padding-only"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    padding = {label.strip(): float(v) for label, v in
               re.findall(r"^(\S.{27})\s+\d+\s+\d+\s+\S+\s+\S+\s+\S+\s+([0-9.]+)%", proc.stdout, re.M)}
    assert padding["uniform (one row length)"] > 50, proc.stdout
    assert padding["bucketed, step 1024"] < 8, proc.stdout
    assert "512 samples, 4 data-parallel devices, 65536 tokens per micro-batch" in proc.stdout
