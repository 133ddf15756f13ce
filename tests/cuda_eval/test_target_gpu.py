"""The GPU a user has: the arch candidates are built for and the card a prompt names come from the evaluator's own
devices (nvidia-smi, no CUDA context), for any compute capability; EvalConfig.arch overrides. A fake nvidia-smi
stands in for the machines we do not have."""
import os
import stat
import sys

import pytest

from cuda_eval.orchestrator import devices
from cuda_eval.api import EvalConfig
from cuda_eval.compile import toolchain as tc
from cuda_eval.static import flag_policy

CAPABILITIES = [("7.5", "sm_75"), ("8.0", "sm_80"), ("8.6", "sm_86"), ("8.9", "sm_89"), ("9.0", "sm_90"),
                ("10.0", "sm_100"), ("10.3", "sm_103"), ("12.0", "sm_120"), ("12.1", "sm_121")]

FAKE_NVIDIA_SMI = r'''#!{python}
"""FakeNvidiaSmi: the GPUs of $FAKE_GPUS ("name|capability;..."), answering the queries cuda_eval makes."""
import os, sys
gpus = [g.split("|") for g in os.environ.get("FAKE_GPUS", "").split(";") if g]
args = sys.argv[1:]
if "-L" in args:
    for i, (name, _) in enumerate(gpus):
        print(f"GPU {{i}}: {{name}} (UUID: GPU-fake-{{i}})")
    sys.exit(0 if gpus else 9)
picked = range(len(gpus))
if "-i" in args:
    picked = [int(args[args.index("-i") + 1])]
fields = next(a for a in args if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
for i in picked:
    name, cap = gpus[i]
    print(", ".join({{"name": name, "compute_cap": cap}}[f] for f in fields))
'''


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """set(description): this process sees the GPUs described, through FakeNvidiaSmi first on PATH."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI.format(python=sys.executable))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def set_gpus(description: str) -> None:
        monkeypatch.setenv("FAKE_GPUS", description)
        count = len([g for g in description.split(";") if g])
        monkeypatch.setattr(devices, "visible_gpu_count", lambda: count)
    return set_gpus


@pytest.mark.parametrize("capability, arch", CAPABILITIES)
def test_arch_of_each_compute_capability(capability, arch):
    assert devices.arch_of_capability(capability) == arch
    assert tc.normalize_arch(capability) == arch


@pytest.mark.parametrize("capability, arch", [("8.0", "sm_80"), ("8.9", "sm_89"), ("9.0", "sm_90"),
                                              ("10.0", "sm_100"), ("12.0", "sm_120")])
def test_the_build_targets_the_cards_arch(fake_gpus, capability, arch):
    """A card of each capability: the evaluator's arch is its own, torch's flags for it name it (-gencode), and a
    candidate may ask for that arch but not a newer one."""
    fake_gpus(f"NVIDIA card {capability}|{capability}")
    assert devices.target_arch(EvalConfig()) == arch
    num = arch[3:]
    flags = tc.describe(arch)["templates"]["1/0/0"]["cuda_cflags"]
    assert f"-gencode=arch=compute_{num},code=sm_{num}" in flags, flags
    assert not any("compute_90" in f for f in flags) or arch == "sm_90"
    flag_policy.check(extra_cuda_cflags=[f"-arch={arch}"], target_arch=arch)
    newer = f"sm_{int(num[:-1]) + 1}0"
    with pytest.raises(ValueError):
        flag_policy.check(extra_cuda_cflags=[f"-arch={newer}"], target_arch=arch)


def test_the_evaluators_own_devices_decide(fake_gpus, monkeypatch):
    fake_gpus("NVIDIA H100 80GB HBM3|9.0;NVIDIA L40S|8.9")
    assert devices.target_arch(EvalConfig(devices="1")) == "sm_89"
    assert devices.target_gpu_name(EvalConfig(devices="1")) == "NVIDIA L40S"
    assert devices.target_gpu_name(EvalConfig(devices="0")) == "NVIDIA H100 80GB HBM3"
    with pytest.raises(ValueError, match="different architectures"):
        devices.target_arch(EvalConfig(devices="all"))
    assert devices.target_arch(EvalConfig(devices="all", arch="8.9")) == "sm_89"     # the override
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")                               # device 0 = physical 1
    monkeypatch.setattr(devices, "visible_gpu_count", lambda: 1)
    assert devices.target_gpu_name(EvalConfig(devices="0")) == "NVIDIA L40S"


def test_without_a_gpu_the_card_of_the_arch_is_named(fake_gpus):
    fake_gpus("")
    assert devices.target_arch(EvalConfig()) == tc.DEFAULT_ARCH == "sm_90"
    assert devices.target_gpu_name(EvalConfig()) == devices.DEFAULT_GPU_NAME == "NVIDIA H100"
    assert devices.target_gpu_name(EvalConfig(arch="8.0")) == "NVIDIA A100"
    assert devices.target_gpu_name(EvalConfig(arch="sm_100")) == "NVIDIA B200"
    assert devices.target_gpu_name(EvalConfig(arch="sm_87")) == "NVIDIA GPU of compute capability 8.7"


def test_an_nvcc_that_cannot_build_for_the_card_is_said_at_start(tmp_path):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho sm_75 sm_80 sm_86 sm_89 sm_90\n")
    nvcc.chmod(0o755)
    devices.check_nvcc_arch("sm_90", str(nvcc))
    devices.check_nvcc_arch("sm_90a", str(nvcc))
    with pytest.raises(RuntimeError, match="cannot build for sm_120"):
        devices.check_nvcc_arch("sm_120", str(nvcc))
