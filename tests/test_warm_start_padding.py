"""benchmarks/warm_start_padding.py on configs/one_gpu.py's real warm-start examples (host side, no model): the
length-bucketed layout the config now uses must carry clearly less padding than random batches."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_length_buckets_cut_the_padding_of_one_gpu_warm_start():
    proc = subprocess.run([sys.executable, "benchmarks/warm_start_padding.py", "--config", "configs/one_gpu.py",
                           "--batches", "50", "--length-buckets", "8"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    share = {label: float(v) for label, v in re.findall(r"^\| (random batches \(|length-bucketed).*? \| ([0-9.]+) \|",
                                                        proc.stdout, re.M)}
    assert share["random batches ("] > 0.45 and share["length-bucketed"] < 0.4, proc.stdout
    ratio = float(re.search(r"length-bucketed / random batches: ([0-9.]+)", proc.stdout).group(1))
    assert ratio < 0.8, proc.stdout
