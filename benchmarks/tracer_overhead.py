"""What the worker's op tracer costs a forward call on the host: the same tiny forward untraced, under ForwardTrace
(dispatch-mode recorder and profile hook), and under ForwardTrace with sys's hook functions guarded, as the worker
runs every call of a candidate.

    python benchmarks/tracer_overhead.py                  # ~20 s on the dev box
    python benchmarks/tracer_overhead.py --calls 5000 --rounds 9

The forward is a candidate-like function compiled under the candidate's file name: one call of a builtin that
stands in for the extension, a multiply and an in-place add on 16 floats (CPU torch), so nearly all of its time is
the tracer's. Best round of --rounds, each --calls calls, in microseconds per call. Host time: on a GPU the gated
timer queues the calls behind its gate, so this moves the worker's CPU time, not the reported kernel times.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from cuda_eval.protocol import harness  # noqa: E402
from cuda_eval.worker import dynamic_checks  # noqa: E402

FORWARD = "def forward(x, ext):\n    ext(1.0)\n    y = x * 2\n    return y.add_(1)\n"


def timed_round(call, calls: int, guarded: bool) -> float:
    """Microseconds per call over `calls` calls; sys's hook functions guarded for the round if asked."""
    if guarded:
        dynamic_checks.install_hook_guards()
    try:
        started = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - started) / calls * 1e6
    finally:
        if guarded:
            dynamic_checks.remove_hook_guards()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    namespace: dict = {}
    exec(compile(FORWARD, harness.CANDIDATE_FILENAME, "exec"), namespace)
    forward, x, ext = namespace["forward"], torch.randn(16), math.fabs

    def traced(trace):
        def call():
            with trace:
                forward(x, ext)
        return call

    # (call, guarded): the variants take turns round by round, so that a load that comes and goes on the machine
    # reaches them alike; the best round of each counts
    variants = {"untraced": (lambda: forward(x, ext), False),
                "ForwardTrace": (traced(dynamic_checks.ForwardTrace([ext])), False),
                "ForwardTrace, sys's hook functions guarded (the worker)":
                    (traced(dynamic_checks.ForwardTrace([ext])), True)}
    for call, guarded in variants.values():      # first uses (the dispatch mode's machinery) out of the timing
        timed_round(call, 100, guarded)
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.rounds):
        for name, (call, guarded) in variants.items():
            best[name] = min(best[name], timed_round(call, args.calls, guarded))
    print(f"tiny forward, best of {args.rounds} x {args.calls} calls, Python {sys.version.split()[0]}, "
          f"torch {torch.__version__}")
    print("| forward call | us/call |\n|---|---|")
    for name, us in best.items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
