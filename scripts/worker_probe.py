"""Start one evaluator worker and one judge on the GPU, sandboxed and not, and say how far each gets (a start-up
hang's stack).

    python scripts/worker_probe.py --timeout 60

Then one honest candidate through the whole Evaluator. Prints every worker's stderr: the start-up milestones.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "cuda_eval"))


def _ready(sock, timeout: float) -> str:
    from cuda_eval.protocol import channel
    try:
        header, _ = channel.recv(sock, deadline=time.monotonic() + timeout)
        return json.dumps(header, default=str)[:600]
    except channel.ChannelError as e:
        return f"no ready message ({e})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    from cuda_eval.sandbox import runner as sandbox
    for module in ("cuda_eval.worker", "cuda_eval.judge"):
        # 1. plain subprocess (root, full environment): isolates sandbox effects.
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", module, "--device-type", "cuda", "--channel-fd", str(theirs.fileno())]
        work = tempfile.mkdtemp(prefix="probe_plain_", dir="/tmp")
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                pass_fds=(theirs.fileno(),), env=dict(os.environ, PYTHONPATH=str(REPO)))
        theirs.close()
        print(f"[plain {module}] ready: {_ready(ours, args.timeout)} after {time.monotonic() - t0:.1f}s", flush=True)
        ours.close()  # the process sees the end of its socket and exits
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        print(f"[plain {module}] exit {proc.returncode}\n{err.decode(errors='replace')[-4000:]}", flush=True)
        # 2. sandboxed, like the pool.
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", module, "--device-type", "cuda"]
        work = tempfile.mkdtemp(prefix="probe_sb_", dir="/tmp")
        limits = sandbox.SandboxLimits(address_space_bytes=None, wall_timeout_s=args.timeout, processes=4096,
                                       cpu_seconds=3600, open_files=4096)
        t0 = time.monotonic()
        proc = sandbox.spawn_sandboxed(argv, work, limits, extra_env={"PYTHONUNBUFFERED": "1",
                                                                      "PYTHONFAULTHANDLER": "1"},
                                       pass_fds=(theirs.fileno(),))
        theirs.close()
        print(f"[sandbox {module}] uid {proc.uid} ready: {_ready(ours, args.timeout)} after "
              f"{time.monotonic() - t0:.1f}s", flush=True)
        ours.close()
        res = proc.wait(30)
        print(f"[sandbox {module}] exit {res.get('exit_code')} signal {res.get('signal')} timed_out "
              f"{res.get('timed_out')}\n{res['stderr'].decode(errors='replace')[-4000:]}", flush=True)
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
