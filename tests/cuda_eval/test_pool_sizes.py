"""Worker counts follow the cores the process may use (its CPU affinity), not the host's: a job pinned to 16 of a
two-GPU host's 32 cores must not start 32 compilers (docs/LOG.md, "the speed demo's first seed")."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_worker_counts_follow_the_cpu_affinity():
    probe = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
             "from cuda_eval.orchestrator import devices; from cuda_eval.compile import pool as compile_pool; "
             "print(compile_pool.usable_cpus(), compile_pool.CompileConfig().workers, devices.auto_spare_workers(1), "
             "os.cpu_count())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout.split()
    usable, workers, spares, host = map(int, out)
    assert usable == 1 and workers == 1 and spares == 2     # auto spares: at least 2, at most cores // 2 otherwise
    assert host >= 1
