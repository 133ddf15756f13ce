"""Shared pytest set-up. GPU tests are marked `gpu` and skip cleanly where no NVIDIA GPU is visible (CI, dev boxes)."""
import os
import shutil
import subprocess

import pytest

def _has_nvidia_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


HAS_GPU = _has_nvidia_gpu()
HAS_NVCC = shutil.which("nvcc") is not None

# JAX: 8 fake CPU devices so that sharding tests run on CI; without a GPU, keep JAX on the CPU (no plugin probing).
# Must happen before anything imports jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
if not HAS_GPU:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (run these on a GPU machine: README, 'GPU tests')")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc on PATH")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not HAS_NVCC:
            item.add_marker(skip_nvcc)
