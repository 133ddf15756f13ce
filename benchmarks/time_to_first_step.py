"""Wall time from a training command's start to its milestones, read from its log as it runs: the warm start's last
step, the first judged round, the first completed RL step (the README's "time to the first RL step").

    python benchmarks/time_to_first_step.py --out $OUT/first_step.json -- \\
        python launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_one_gpu

Runs the command in its own process group with its output (stdout and stderr) going to --log, every line prefixed
with the seconds since the start; prints a line per milestone when it is reached and, once the last milestone is
reached, stops the command (SIGTERM to its group, then SIGKILL) unless --keep-running. A command that ends, or the
--limit-s that passes, before a milestone leaves that milestone unreached in the table (and the exit status 1).
Milestones (regular expressions over the log lines, first match wins; --milestone NAME=REGEX replaces them):
  warm_start_done   "... step N/N: answer NLL ..." (launch/sft.py's and train.py's warm start: its last step)
  first_round       "round 0 ...: .. live, generate ..s, evaluate ..s, .. correct" (the first judged turn)
  first_rl_step     "step 1/N: score ..." (the first RL step, update included)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

MILESTONES = {
    "warm_start_done": r"step (\d+)/\1: answer NLL",
    "first_round": r"\bround 0\b.*\blive, generate ",
    "first_rl_step": r"\bstep 1/\d+: score ",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--milestone", action="append", default=[], metavar="NAME=REGEX",
                   help="replace the default milestones (repeatable; in the order they are expected)")
    p.add_argument("--limit-s", type=float, default=3600, help="stop the command after this many seconds")
    p.add_argument("--keep-running", action="store_true", help="let the command go on after the last milestone")
    p.add_argument("--log", default="", help="the command's output, each line with its time (default: none)")
    p.add_argument("--out", default="", help="write the milestones as JSON here")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no command given (put it after --)")
    return args


def milestones(specs: list[str]) -> dict[str, re.Pattern]:
    if not specs:
        return {name: re.compile(rx) for name, rx in MILESTONES.items()}
    out = {}
    for spec in specs:
        name, sep, rx = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"--milestone wants NAME=REGEX, got {spec!r}")
        try:
            out[name] = re.compile(rx)
        except re.error as e:
            raise SystemExit(f"--milestone {name}: bad regular expression: {e}") from None
    return out


def stop(process: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass


def watch(command: list[str], patterns: dict[str, re.Pattern], limit_s: float, keep_running: bool,
          log_path: str) -> dict:
    """Run `command`; return {"reached": {name: seconds}, "lines": {name: line}, "wall_s", "returncode", ...}."""
    t0 = time.monotonic()
    reached: dict[str, float] = {}
    lines: dict[str, str] = {}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", bufsize=1, start_new_session=True)
    timer = threading.Timer(limit_s, stop, (process,))
    timer.daemon = True
    timer.start()
    log = open(log_path, "w") if log_path else None
    stopped_after_last = False
    try:
        for line in process.stdout:
            t = time.monotonic() - t0
            if log:
                log.write(f"{t:9.1f} {line}")
                log.flush()
            for name, rx in patterns.items():
                if name not in reached and rx.search(line):
                    reached[name] = t
                    lines[name] = line.strip()[:300]
                    print(f"{t:9.1f} s  {name}: {lines[name]}", flush=True)
            if len(reached) == len(patterns) and not keep_running and not stopped_after_last:
                stopped_after_last = True
                stop(process)
        process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            stop(process)
        if log:
            log.close()
    return {"command": command, "reached": reached, "lines": lines, "wall_s": time.monotonic() - t0,
            "returncode": process.returncode, "stopped_after_last_milestone": stopped_after_last,
            "limit_s": limit_s, "milestones": {n: rx.pattern for n, rx in patterns.items()}}


def table(result: dict) -> str:
    rows = ["| milestone | seconds from start | minutes | line |", "|---|---|---|---|"]
    for name in result["milestones"]:
        t = result["reached"].get(name)
        rows.append(f"| {name} | {'not reached' if t is None else f'{t:.1f}'} | "
                    f"{'' if t is None else f'{t / 60:.2f}'} | {result['lines'].get(name, '')} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    patterns = milestones(args.milestone)
    result = watch(args.command, patterns, args.limit_s, args.keep_running, args.log)
    print(f"\n`{' '.join(args.command)}`: returncode {result['returncode']}, {result['wall_s']:.1f} s wall"
          f"{', stopped after the last milestone' if result['stopped_after_last_milestone'] else ''}\n")
    print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if len(result["reached"]) == len(patterns) else 1


if __name__ == "__main__":
    sys.exit(main())
