"""Start one evaluator worker on the GPU, sandboxed and not, and say how far it gets (a start-up hang's stack).

    python benchmarks/device/worker_probe.py --timeout 60

Then one honest candidate through the whole Evaluator. Prints every worker's stderr: the start-up milestones.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    from cuda_eval import sandbox
    argv = [sys.executable, "-m", "cuda_eval.worker", "--device-type", "cuda", "--start-timeout",
            str(args.timeout - 5)]
    # 1. plain subprocess (root, full environment): isolates sandbox effects.
    work = tempfile.mkdtemp(prefix="probe_plain_", dir="/tmp")
    t0 = time.monotonic()
    try:
        res = subprocess.run(argv, cwd=work, input=b"", capture_output=True, timeout=args.timeout,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
        print(f"[plain] exit {res.returncode} after {time.monotonic() - t0:.1f}s\n{res.stderr.decode()[-4000:]}")
    except subprocess.TimeoutExpired as e:
        print(f"[plain] TIMEOUT after {args.timeout}s\n{(e.stderr or b'').decode()[-6000:]}")
    print("[plain] ready.json:", open(os.path.join(work, "ready.json")).read()[:600]
          if os.path.exists(os.path.join(work, "ready.json")) else None, flush=True)
    # 2. sandboxed, like the pool.
    work = tempfile.mkdtemp(prefix="probe_sb_", dir="/tmp")
    os.chmod(work, 0o777)
    limits = sandbox.SandboxLimits(address_space_bytes=None, wall_timeout_s=args.timeout, processes=4096,
                                   cpu_seconds=3600, open_files=4096)
    t0 = time.monotonic()
    res = sandbox.run_sandboxed(argv, work, limits, extra_env={"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})
    print(f"[sandbox] exit {res.get('exit_code')} signal {res.get('signal')} timed_out {res.get('timed_out')} "
          f"uid {res.get('uid')} after {time.monotonic() - t0:.1f}s")
    print(res["stderr"].decode(errors="replace")[-6000:])
    print("[sandbox] ready.json:", open(os.path.join(work, "ready.json")).read()[:600]
          if os.path.exists(os.path.join(work, "ready.json")) else None, flush=True)
    # 3. the Evaluator on one honest candidate.
    import corpus_index
    from cuda_eval.api import EvalConfig, Evaluator
    honest = {c.name: c for c in corpus_index.load("honest")}
    t0 = time.monotonic()
    with Evaluator(EvalConfig(devices="0", worker_start_timeout_s=args.timeout, run_timeout_s=60)) as ev:
        r = ev.evaluate([corpus_index.request(honest["relu_basic"])])[0]
    d = r.to_dict() if hasattr(r, "to_dict") else r.__dict__
    print(f"[evaluator] {time.monotonic() - t0:.1f}s", json.dumps(d, default=str)[:3000], flush=True)
    sys.exit(0 if r.correct else 1)


if __name__ == "__main__":
    main()
