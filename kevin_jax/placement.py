"""Which GPUs JAX (the policy) uses and which cuda_eval (the kernels under test) uses; must run before JAX starts.
Also the `mesh` config section (ParallelConfig: how JAX's devices are laid out, and the processes of a multi-host
run), read by kevin_jax.parallel, here so that the config can be built without jax.

This module does not import jax: `apply_gpu_placement` sets the environment that JAX reads when its GPU backend is
created (launch/train.py calls it right after parsing the config, before importing anything that imports jax).

- Shared GPU(s) (one-GPU runs): JAX's memory pool is capped at `jax_memory_fraction` of each GPU and not
  preallocated, leaving the rest to the cuda_eval workers (which load candidate kernels with torch).
- Split node (e.g. 6 GPUs for the policy, 2 for kernels): `jax_devices="0,1,2,3,4,5"`, eval.devices="6,7"; JAX then
  sees only its own GPUs (jax_cuda_visible_devices) and may take them whole.
The cuda_eval workers are separate processes: they see every GPU and pick theirs from eval.devices.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

log = logging.getLogger(__name__)


class NoGpuError(RuntimeError):
    """Kernels must run (the evaluator is not asked for compile-only verdicts) but no GPU is visible. The message
    says what to do instead; the launchers print it and exit with status 2."""


def require_gpu_for_kernels(eval_config: Any, num_gpus: int, message: str) -> None:
    """Raises NoGpuError(message) where cuda_eval would have to run kernels on a CUDA device and `num_gpus` is 0: a
    run without a GPU must ask for compile-only verdicts explicitly (never a silent compile-only run)."""
    if eval_config.device_type == "cuda" and eval_config.mode != "compile_only" and num_gpus == 0:
        raise NoGpuError(message)


@dataclasses.dataclass
class GpuConfig:
    """GPU placement (config section `gpu`).

    jax_devices: GPU indices JAX uses: "all" or e.g. "0,1,2,3".
    jax_memory_fraction: cap on JAX's share of each GPU it shares with cuda_eval (XLA_PYTHON_CLIENT_MEM_FRACTION).
    preallocate: let JAX preallocate its pool (on shared GPUs it never does: cuda_eval needs room to grow).
    """
    jax_devices: str = "all"
    jax_memory_fraction: float = 0.6
    preallocate: bool = True

    def __post_init__(self):
        if not 0.05 <= self.jax_memory_fraction <= 1.0:
            raise ValueError(f"gpu.jax_memory_fraction must be in [0.05, 1], got {self.jax_memory_fraction}")
        parse_indices(self.jax_devices, "gpu.jax_devices")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Mesh shape and multi-host start-up (config section `mesh`; kevin_jax.parallel reads it).

    Attributes:
      data: size of the pure data-parallel axis.
      fsdp: size of the fully-sharded data-parallel axis; -1 = every device not used by `data` and `tensor`.
      tensor: size of the tensor-parallel axis (must divide query heads, KV heads, MLP width and vocabulary).
      coordinator_address: "host:port" of process 0 for multi-host runs; None = single host, or let
        jax.distributed discover it from the cluster environment (SLURM, Open MPI, Kubernetes).
      num_processes: number of processes (hosts) of a multi-host run; None = discover.
      process_id: this process's index; None = discover.
    """
    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def parse_indices(value: Any, name: str) -> list[int] | None:
    """None for "all", else the list of indices."""
    if value is None or value == "all":
        return None
    if isinstance(value, int):
        return [value]
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return [int(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        raise ValueError(f"{name} must be 'all' or comma-separated GPU indices, got {value!r}") from None


def shared_gpus(jax_devices: Any, eval_devices: Any, num_gpus: int) -> list[int]:
    jax_set = set(parse_indices(jax_devices, "gpu.jax_devices") or range(num_gpus))
    eval_set = set(parse_indices(eval_devices, "eval.devices") or range(num_gpus))
    return sorted(jax_set & eval_set)


def host_memory_gib() -> int:
    """This machine's physical memory in GiB (rounded down)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 30


def apply_gpu_placement(config: GpuConfig, eval_devices: Any, num_gpus: int,
                        environ: dict | None = None, offload: str = "none") -> dict[str, str]:
    """Sets JAX's device list and memory settings in `environ` (default os.environ); returns what it set.

    offload: optim.offload. With the optimiser state in pinned host memory, XLA's pinned-host pool of each GPU
    (XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB, 64 GiB by default) must hold that GPU's share of it (QwQ-32B on 4 GPUs:
    98 GB each): it is capped at the machine's memory instead, which the state's own size check stays under."""
    environ = os.environ if environ is None else environ
    changes: dict[str, str] = {}
    if num_gpus == 0:
        return changes
    if offload == "pinned_host":
        changes["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] = str(host_memory_gib())
    jax_list = parse_indices(config.jax_devices, "gpu.jax_devices")
    if jax_list is not None:
        bad = [i for i in jax_list if not 0 <= i < num_gpus]
        if bad:
            raise ValueError(f"gpu.jax_devices names GPU(s) {bad} but {num_gpus} are visible")
        # JAX_CUDA_VISIBLE_DEVICES restricts JAX only; CUDA_VISIBLE_DEVICES would hide GPUs from cuda_eval's workers.
        changes["JAX_CUDA_VISIBLE_DEVICES"] = ",".join(map(str, jax_list))
    shared = shared_gpus(config.jax_devices, eval_devices, num_gpus)
    if shared:
        changes["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{config.jax_memory_fraction:.3f}"
        changes["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        log.info("GPU(s) %s shared by JAX and cuda_eval: JAX capped at %.0f%% of memory, no preallocation", shared,
                 100 * config.jax_memory_fraction)
    elif not config.preallocate:
        changes["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    for key, value in changes.items():
        if key in environ and environ[key] != value:
            log.warning("%s=%s from the environment overrides the placement's %s", key, environ[key], value)
            continue
        environ[key] = value
    return changes
