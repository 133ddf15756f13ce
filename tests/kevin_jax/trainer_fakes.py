"""Helpers for the trainer tests: an evaluator fake for subprocess runs of the RL loop, the warm-started tiny policy
(made once, cached on disk), and the command line of tests/kevin_jax/trainer_driver.py. Fakes live only in tests."""
from __future__ import annotations

import ast
import fcntl
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cuda_eval.api import EvalResult, extract_code

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "trainer_driver.py"
WARM_CACHE = Path(os.environ.get("KEVIN_JAX_TEST_CACHE", Path(tempfile.gettempdir()) / "kevin_jax_tests"))
WARM_VERSION = "warm_tiny_v2"


class ParseOnlyEvaluatorFake:
    """Stands in for cuda_eval's compile-only evaluator without nvcc: a program "compiles" when it is valid Python
    that defines a __global__ kernel and calls load_inline. Deterministic, instant."""
    mode = "compile_only"

    def __init__(self):
        self.calls = 0

    def evaluate(self, requests):
        self.calls += 1
        out = []
        for r in requests:
            extraction = extract_code(r.response)
            result = EvalResult(request_id=r.request_id, task_id=r.task_id, mode="compile_only",
                                format_ok=extraction.code is not None, format_error=extraction.error,
                                code=extraction.code)
            if extraction.code is not None:
                try:
                    ast.parse(extraction.code)
                    result.compiled = "__global__" in extraction.code and "load_inline" in extraction.code
                except SyntaxError as e:
                    result.compiled = False
                    result.compile_log = f"SyntaxError: {e.msg} (line {e.lineno})"
            result.feedback = "Compiled." if result.compiled else "Compilation failed."
            out.append(result)
        return out


def tiny_config(**overrides):
    """configs/tiny_cpu.py with dotted overrides {"rl.kl_coef": 0.1, ...}."""
    sys.path.insert(0, str(REPO))
    from configs import tiny_cpu

    config = tiny_cpu.get_config()
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


def warm_tiny_checkpoint() -> Path:
    """An HF checkpoint dir of the tiny policy after tiny_cpu's warm start (so that it writes the LeakyReLU kernel),
    made once per machine (file-locked; $KEVIN_JAX_TEST_CACHE or the temp dir)."""
    target = WARM_CACHE / WARM_VERSION
    WARM_CACHE.mkdir(parents=True, exist_ok=True)
    with open(WARM_CACHE / f"{WARM_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            subprocess.run([sys.executable, str(DRIVER), "--make-warm-checkpoint", str(target)], check=True,
                           env=driver_env(), timeout=1800)
    return target


def driver_env(devices: int = 1, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
                "JAX_COMPILATION_CACHE_DIR": str(WARM_CACHE / "jax_cache"),
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "PYTHONPATH": str(REPO)})
    env.update(extra or {})
    return env


def run_driver(workdir, overrides: dict, *, real_evaluator: bool = False, devices: int = 1, timeout: int = 900,
               extra_env: dict | None = None, wait: bool = True, kill_at: tuple[str, int] | None = None):
    """Runs kevin_jax.train.run in a fresh process (its own session, so that a SIGKILLed run's children can be
    reaped); returns the CompletedProcess, or the Popen when wait=False. kill_at: (phase, step) to SIGKILL it at
    (kill_at_phase.py)."""
    cmd = [sys.executable, str(DRIVER), str(workdir), json.dumps(overrides)]
    if real_evaluator:
        cmd.append("--real-evaluator")
    if kill_at:
        cmd.append(f"--kill-at={kill_at[0]}:{kill_at[1]}")
    kwargs = dict(env=driver_env(devices, extra_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                  start_new_session=True)
    proc = subprocess.Popen(cmd, **kwargs)
    if not wait:
        return proc
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        reap(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def reap(proc) -> None:
    """Kills what is left of a driver's process group (the children of a SIGKILLed trainer)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
