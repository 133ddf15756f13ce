"""Facts about the GPUs and cores the evaluator runs on, read without torch and without a CUDA context: how many
GPUs this process sees, their names and architectures, the architecture builds target, how many builds and spare
workers to run."""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from cuda_eval.contract import EvalConfig


def _usable_cpus() -> int:
    from cuda_eval.compile.pool import usable_cpus  # the pool module loads lazily, with the evaluator
    return usable_cpus()


def compile_workers(config: EvalConfig) -> int:
    """Builds at once: EvalConfig.compile_workers, or one per usable core."""
    return config.compile_workers or _usable_cpus()


def spare_workers(config: EvalConfig, n_devices: int) -> int:
    """Spare workers per device: EvalConfig.spare_workers, or auto_spare_workers."""
    return config.spare_workers or auto_spare_workers(n_devices)


def auto_spare_workers(n_devices: int, cpu_count: int | None = None) -> int:
    """Spare workers per device when EvalConfig.spare_workers is 0. A device runs one candidate at a time (~0.9 s of
    worker wall on an H200) while a fresh worker needs seconds to import torch and initialise CUDA; with 2 spares
    the GPU mostly waited for workers (docs/LOG.md, "steps are evaluation-bound": 28% busy in eval_throughput, a
    68-kernel round took 117 s for ~0.9 s jobs). Enough spares to hide start-up, bounded by the cores (a start-up is
    CPU-bound) and by memory (a CUDA context each)."""
    cores = cpu_count if cpu_count is not None else max(2, _usable_cpus())
    return max(2, min(8, cores // (2 * max(1, n_devices))))



# --- helpers --------------------------------------------------------------------------------------------------
def visible_gpu_count() -> int:
    """GPUs this process may use, without importing torch or initialising CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    try:
        n = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        n = 0
    if n == 0 and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            n = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            n = 0
    if visible is not None and n:
        n = min(n, len([v for v in visible.split(",") if v.strip()]))
    return n


# The card named where no GPU is visible (compile_only): the one of the arch the build targets then.
DEFAULT_GPU_NAME = "NVIDIA H100"                 # toolchain.DEFAULT_ARCH, sm_90
ARCH_CARDS = {"sm_80": "NVIDIA A100", "sm_86": "NVIDIA A10", "sm_89": "NVIDIA L40S", "sm_90": "NVIDIA H100",
              "sm_90a": "NVIDIA H100", "sm_100": "NVIDIA B200", "sm_100a": "NVIDIA B200", "sm_103": "NVIDIA B300",
              "sm_120": "NVIDIA RTX PRO 6000 Blackwell"}


def arch_of_capability(capability: str) -> str:
    """A compute capability ("9.0", "12.0", as nvidia-smi and torch report it) -> the nvcc arch ("sm_90", "sm_120")."""
    from cuda_eval.compile.toolchain import normalize_arch
    major, _, minor = str(capability).strip().partition(".")
    if not (major.isdigit() and (minor or "0").isdigit()):
        raise ValueError(f"bad compute capability {capability!r} (expected e.g. '9.0')")
    return normalize_arch(f"sm_{int(major)}{int(minor or 0)}")


def card_of_arch(arch: str) -> str:
    """The card named for an arch when no GPU is there to ask (compile_only with eval.arch set)."""
    from cuda_eval.compile.toolchain import normalize_arch
    arch = normalize_arch(arch)
    if arch in ARCH_CARDS:
        return ARCH_CARDS[arch]
    digits = arch[3:].rstrip("abf")
    return f"NVIDIA GPU of compute capability {digits[:-1]}.{digits[-1]}"


def gpu_facts(devices: Any) -> list[dict]:
    """[{index, name, capability}] of the GPUs `devices` names (EvalConfig.devices: indices among the visible ones),
    read with nvidia-smi: no CUDA context, no torch. Empty without a GPU or nvidia-smi."""
    n = visible_gpu_count()
    smi = shutil.which("nvidia-smi")
    if not n or not smi:
        return []
    from cuda_eval.orchestrator.gpu_pool import _physical_device
    facts = []
    for index in resolve_devices(devices, n):
        try:
            out = subprocess.run([smi, "-i", _physical_device(str(index)), "--query-gpu=name,compute_cap",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            name, capability = (x.strip() for x in out.stdout.strip().splitlines()[0].rsplit(",", 1))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            continue
        facts.append({"index": index, "name": name, "capability": capability})
    return facts


def target_arch(config: EvalConfig) -> str:
    """The arch the candidates are built for: EvalConfig.arch, or ("auto") the compute capability of the GPUs the
    evaluator runs on (all must have the same: one build serves them all), else toolchain.DEFAULT_ARCH (no GPU)."""
    from cuda_eval.compile.toolchain import DEFAULT_ARCH, normalize_arch
    if config.arch != "auto":
        return normalize_arch(config.arch)
    if config.device_type != "cuda":
        return DEFAULT_ARCH
    archs = {arch_of_capability(f["capability"]) for f in gpu_facts(config.devices)}
    if len(archs) > 1:
        raise ValueError(f"EvalConfig.devices={config.devices!r} are GPUs of different architectures "
                         f"({', '.join(sorted(archs))}): one evaluator builds for one; run one per kind of GPU, or "
                         "set EvalConfig.arch to the lowest")
    return archs.pop() if archs else DEFAULT_ARCH


def target_gpu_name(config: EvalConfig) -> str:
    """The GPU the kernels will run on, as CUDA names it ("NVIDIA H100 80GB HBM3"): the first of the evaluator's
    devices; with none visible (compile_only), the card of EvalConfig.arch, or of the default arch."""
    if config.device_type == "cuda":
        facts = gpu_facts(config.devices)
        if facts:
            return facts[0]["name"]
    return card_of_arch(config.arch) if config.arch != "auto" else DEFAULT_GPU_NAME


def check_nvcc_arch(arch: str, nvcc: str | None = None) -> None:
    """RuntimeError when the installed nvcc cannot build for `arch` (every candidate would fail to compile): said
    once, at start-up, instead. Skipped where nvcc or its --list-gpu-code is missing."""
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        return
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return
    known = set(out.stdout.split())
    if out.returncode != 0 or not known:
        return
    base = arch.rstrip("af") if arch[-1:] in ("a", "f") and arch[-2:-1].isdigit() else arch
    if base not in known:
        raise RuntimeError(f"{nvcc} cannot build for {arch}, the GPU's architecture (it knows "
                           f"{' '.join(sorted(known))}): install a CUDA toolkit that supports it, or set "
                           "EvalConfig.arch")


def resolve_devices(devices: Any, available: int) -> list[int]:
    if devices == "all" or devices is None:
        return list(range(available))
    if isinstance(devices, int):
        chosen = [devices]
    elif isinstance(devices, str):
        chosen = [int(d) for d in devices.split(",") if d.strip()]
    else:
        chosen = [int(d) for d in devices]
    bad = [d for d in chosen if d < 0 or d >= max(available, 1) and available]
    if bad:
        raise ValueError(f"devices {bad} do not exist: {available} GPU(s) visible")
    return chosen

