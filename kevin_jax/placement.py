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
import math
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
    host_memory_floor: the trainer stops with an error when the host's available memory stays under this fraction
      of its RAM for seconds, or falls under half of it (kevin_jax.host_memory: a host out of memory with most of it
      pinned thrashes instead of failing); 0 = no watch.
    """
    jax_devices: str = "all"
    jax_memory_fraction: float = 0.6
    preallocate: bool = True
    host_memory_floor: float = 0.01

    def __post_init__(self):
        if not 0.05 <= self.jax_memory_fraction <= 1.0:
            raise ValueError(f"gpu.jax_memory_fraction must be in [0.05, 1], got {self.jax_memory_fraction}")
        if not 0.0 <= self.host_memory_floor < 0.5:
            raise ValueError(f"gpu.host_memory_floor must be in [0, 0.5), got {self.host_memory_floor}")
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


def mesh_shape(config: ParallelConfig, num_devices: int) -> tuple[int, int, int]:
    """Resolves -1 and checks that data * fsdp * tensor == num_devices."""
    sizes = {"data": config.data, "fsdp": config.fsdp, "tensor": config.tensor}
    unknown = [k for k, v in sizes.items() if v == -1]
    if len(unknown) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {sizes}")
    for name, size in sizes.items():
        if size == 0 or size < -1:
            raise ValueError(f"mesh axis {name}={size} must be positive (or -1 for 'the rest')")
    known = math.prod(v for v in sizes.values() if v != -1)
    if unknown:
        if num_devices % known:
            raise ValueError(f"{num_devices} devices cannot be split into a mesh with {sizes} "
                             f"({num_devices} is not a multiple of {known})")
        sizes[unknown[0]] = num_devices // known
    total = math.prod(sizes.values())
    if total != num_devices:
        raise ValueError(f"mesh data={sizes['data']} x fsdp={sizes['fsdp']} x tensor={sizes['tensor']} = {total} "
                         f"devices, but {num_devices} are available")
    return sizes["data"], sizes["fsdp"], sizes["tensor"]


def multihost_mesh(config: ParallelConfig, processes: int) -> ParallelConfig:
    """The mesh section as a run of `processes` hosts lays it out (kevin_jax.multihost.build_meshes): left at its
    default (data=1, fsdp=-1), the data axis spans the hosts, one parameter replica per host (each host samples
    with its own); anything else as given."""
    if processes > 1 and config.data == 1 and config.fsdp == -1:
        return dataclasses.replace(config, data=processes)
    return config


def state_shards(config: ParallelConfig, jax_gpus: int, processes: int) -> int:
    """How many ways the parameters, and so an offloaded optimiser state, are split: fsdp x tensor of the mesh a run
    of `processes` hosts of `jax_gpus` GPUs each builds (data-parallel replicas hold a whole share each)."""
    _, fsdp, tensor = mesh_shape(multihost_mesh(config, processes), jax_gpus * processes)
    return fsdp * tensor


def process_count(config: ParallelConfig, environ: dict | None = None) -> int:
    """Processes (hosts) of the run: mesh.num_processes, else what a cluster manager says (SLURM, Open MPI), else 1.
    A coordinator address with no count cannot be resolved before jax.distributed starts: refused."""
    if config.num_processes is not None:
        return int(config.num_processes)
    environ = os.environ if environ is None else environ
    for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        try:
            if int(environ.get(name, "0")) > 0:
                return int(environ[name])
        except ValueError:
            pass
    if environ.get("JAX_COORDINATOR_ADDRESS") or config.coordinator_address:
        raise ValueError("a multi-host run with the optimiser state in host memory needs mesh.num_processes "
                         "(the pinned-host pools are sized before jax.distributed starts)")
    return 1


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
    """This machine's memory in GiB (its container's, where that is less; rounded down)."""
    from cuda_eval.api import host_memory_total     # no torch, no jax
    return host_memory_total() >> 30


# The pinned-host pool of each GPU for an offloaded optimiser state (optim.offload="pinned_host"), sized by a model of
# XLA's allocator placing the state's buffers (pool_fits): XLA's pinned-host pools are TF's BFC allocator with
# growth, regions of doubling size taken from the host up to the cap, a buffer never spanning two, so regions end
# part-empty and the pool needs more than the state. The pool then takes its whole cap (the last region takes what
# is left up to it: 4 x 110 GiB in use on 4 x H200 for a 366 GiB state, docs/LOG.md 2026-11-27), so the cap is what
# the host gives the pools: sized to the allocations, not the share with slack.
POOL_FIRST_REGION = 2 << 20          # tsl BFCAllocator: the first region, doubled at each growth
POOL_MIN_ALLOCATION = 256            # kMinAllocationSize
POOL_MAX_INTERNAL_FRAGMENTATION = 128 << 20
RESTORE_ORDERS = 30                  # a restore allocates in orbax's order, not ours: the cap holds this many
#                                      seeded orders of the buffers (QwQ-32B, 4 GPUs, bf16 mu: 77 GiB fresh, up to 85)
HOST_POOL_EXTRA_GIB = 1              # rounding; staged transfers have a pool of their own


def pool_fits(sizes: list[int], limit: int) -> bool:
    """Whether buffers of `sizes` bytes (allocated in this order, none freed) fit a growing BFC pool capped at `limit`
    bytes: best fit over free chunks, a free chunk split only when the rest is worth keeping (TF's rule), a new region
    of doubling size when none fits (doubled until it holds the buffer), the last one whatever the cap leaves. A model
    of XLA's allocator, checked against its source by review and at full size by the runs it sized (docs/LOG.md)."""
    free: list[int] = []
    total, region = 0, POOL_FIRST_REGION
    for size in sizes:
        need = -(-size // POOL_MIN_ALLOCATION) * POOL_MIN_ALLOCATION
        fits = [c for c in free if c >= need]
        if not fits:
            available = limit - total
            if need > available:
                return False
            grew = False
            while need > region:
                region *= 2
                grew = True
            got = min(region, available)
            total += got
            free.append(got)
            if not grew:
                region *= 2
            fits = [got]
        chunk = min(fits)
        free.remove(chunk)
        if chunk >= 2 * need or chunk - need >= POOL_MAX_INTERNAL_FRAGMENTATION:
            free.append(chunk - need)
    return True


def least_pool_gib(sizes: list[int]) -> int:
    """The smallest whole-GiB cap under which pool_fits(sizes)."""
    lo, hi = 1, max(2, -(-2 * sum(sizes) // (1 << 30)) + 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if pool_fits(sizes, mid << 30):
            hi = mid
        else:
            lo = mid + 1
    return lo


def state_buffers(arch: Any, shards: int, mu_bytes: int = 4) -> list[tuple[int, bool]]:
    """(bytes per GPU, outside the layer stack) of each host buffer of the offloaded state (kevin_jax.rl.offload), in
    the trees' order: the float32 master weights, the first moment (mu_bytes a parameter, optim.mu_dtype), the float32
    second moment; each the embedding, final norm, layer stack ([num_layers, ...] leaves) and LM head, matrices
    sharded `shards` ways, biases and norm scales replicated (kevin_jax.model.qwen2's shardings)."""
    h, d, layers = arch.hidden_size, arch.head_dim, arch.num_hidden_layers
    q, kv, i = arch.num_attention_heads * d, arch.num_key_value_heads * d, arch.intermediate_size
    stacked = [layers * n // shards for n in (h * q, h * kv, h * kv, q * h, h * i, h * i, i * h)]
    stacked += [layers * n for n in (q, kv, kv, h, h)]
    table = arch.vocab_size * h // shards
    counts = [(table, True), (h, True)] + [(n, False) for n in stacked]
    counts += [] if arch.tie_word_embeddings else [(table, True)]
    return [(n * b, rest) for b in (4, mu_bytes, 4) for n, rest in counts]


def host_pool_gib(arch: Any, shards: int, mu_bytes: int = 4) -> int:
    """GiB of XLA's pinned-host pool per GPU for its share of an offloaded state (state_buffers), by the allocator
    model: the most any of these orders needs, followed by the optimiser step's new buffers of the parameters outside
    the layer stack (written whole, maybe beside the old ones; the layers' are written in place): the fresh build
    (largest first: kevin_jax.rl.offload.init_state), the trees' order and RESTORE_ORDERS seeded orders (a
    restore's)."""
    import random
    buffers = state_buffers(arch, shards, mu_bytes)
    state = [n for n, _ in buffers]
    update = [n for n, rest in buffers if rest]
    rng = random.Random(0)
    orders = [sorted(state, reverse=True), state] + [rng.sample(state, len(state)) for _ in range(RESTORE_ORDERS)]
    return max(least_pool_gib(order + update) for order in orders) + HOST_POOL_EXTRA_GIB


# Host memory beside the pools, by part (estimates calibrated on runs, not a model). At full size on 4 x H200 (503
# GiB; docs/LOG.md, 2026-11-27, "the host budget recalibrated"): 493 GiB in use through two RL steps beside 440 GiB of
# pools at their caps and an idle evaluator of 4 processes (~3.4 GiB), so the trainer and the kernel's share took ~50
# GiB together, 12 more than the first estimate (28 + 2% of RAM).
HOST_TRAINER_GIB = 40             # the trainer process: CUDA contexts, compiled programs, XLA's staging pool
EVAL_PROCESS_GIB = 0.8            # one idle cuda_eval process (a judge or a spare worker: torch and a CUDA context)
EVAL_JOB_GIB = 2.0                # a running candidate's inputs and outputs, judge and worker (KernelBench levels
#                                   1-2, median; the largest-output tasks need up to ~18 GiB a GPU: their output
#                                   buffers wait for room or get task_too_large, cuda_eval.orchestrator.gpu_pool)
COMPILE_JOB_GIB = 4.3             # one build of a candidate at its peak, its phases side by side (the .cu's host
#                                   and device chains, the binding object beside them): 4.29 GiB of anonymous memory
#                                   over 12 realistic candidates (benchmarks/compile_cost.py --workers 1); its largest
#                                   single process holds 0.91 GiB (benchmarks/compile_floor.py)
COMPILE_JOB_SEQUENTIAL_GIB = 2.1  # ... with the .cu's chains one after the other (eval.compile_parallel_phases=False;
#                                   compile_cost.py --sequential-phases): 2.06 GiB, 17.8 s of wall a build against 14.6
HOST_KERNEL_FRACTION = 0.02       # the kernel's own: page tables of the pinned pools, slabs, a working set of cache


def build_gib_of(eval_config: Any) -> float:
    """Host memory one build of the evaluator holds at its peak, by how it runs its phases."""
    return COMPILE_JOB_GIB if eval_config.compile_parallel_phases else COMPILE_JOB_SEQUENTIAL_GIB


@dataclasses.dataclass(frozen=True)
class EvaluatorFootprint:
    """The evaluator's processes beside the trainer: judges (one per GPU it runs kernels on), spare workers per
    GPU, concurrent builds."""
    gpus: int = 0
    spares: int = 0
    compile_workers: int = 0
    build_gib: float = COMPILE_JOB_GIB

    @classmethod
    def of(cls, eval_config: Any, num_gpus: int) -> "EvaluatorFootprint":
        """From the eval config section (cuda_eval.api's defaults for the zeros)."""
        from cuda_eval.api import compile_workers, spare_workers     # no torch, no jax
        build_gib = build_gib_of(eval_config)
        if getattr(eval_config, "backend", "local") == "ray":   # every judge, worker and build on other nodes
            return cls(0, 0, 0, build_gib)
        builds = compile_workers(eval_config)
        if eval_config.mode == "compile_only" or num_gpus == 0:
            return cls(0, 0, builds, build_gib)
        if eval_config.device_type == "cpu":      # CPU-mode slots, each with a judge and spares like a GPU's
            slots = max(1, eval_config.cpu_workers)
            return cls(slots, spare_workers(eval_config, slots), builds, build_gib)
        listed = parse_indices(eval_config.devices, "eval.devices")
        gpus = len(listed) if listed is not None else num_gpus
        return cls(gpus, spare_workers(eval_config, gpus), builds, build_gib)

    def gib(self) -> float:
        return (self.gpus * ((1 + self.spares) * EVAL_PROCESS_GIB + EVAL_JOB_GIB)
                + self.compile_workers * self.build_gib)


def host_budget_gib(pool_gib: int, jax_gpus: int, evaluator: EvaluatorFootprint, ram_gib: int,
                    floor: float = 0.0, checkpoint_gib: float = 0.0) -> dict:
    """Host memory of an offloaded run by part, GiB: the pinned pools (they grow to their caps), the trainer, the
    evaluator, a checkpoint being written or read (ckpt.concurrent_gb: orbax's bytes in flight), the kernel's share,
    the floor the trainer stops at (gpu.host_memory_floor, a fraction of RAM); and what is left."""
    parts = {"pools": pool_gib * jax_gpus, "trainer": HOST_TRAINER_GIB, "evaluator": evaluator.gib(),
             "checkpoint": checkpoint_gib, "kernel": HOST_KERNEL_FRACTION * ram_gib, "floor": floor * ram_gib}
    return {**parts, "left": ram_gib - sum(parts.values())}


def _offload_pool(arch: Any, mu_dtype: str, jax_gpus: int, mesh: ParallelConfig | None,
                  environ: dict | None, evaluator: EvaluatorFootprint, floor: float,
                  checkpoint_gib: float = 0.0) -> dict[str, str]:
    """The cap of XLA's pinned-host pool of each GPU for an offloaded state: what the allocator model needs to place
    the GPU's share of the state (host_pool_gib). XLA's default (64 GiB per GPU) holds less than one GPU's share of
    QwQ-32B on 4 GPUs; uncapped, each pool reserves regions of doubling size (64 GiB at a time near 100 GiB): on 4
    x H100 (503 GiB) the four pools took 472 GiB for a 366 GiB state and the kernel's OOM killer ended the run
    (docs/LOG.md, 2026-11-27, "4 x H100, second run"). The pools grow on demand up to the cap (preallocation would
    also give XLA's staging pool the same size: one pool more than the GPUs). A state the host cannot hold beside
    the trainer and the evaluator is refused here."""
    from kevin_jax.rl.config import MOMENT_BYTES     # no jax
    mesh = mesh or ParallelConfig()
    processes = process_count(mesh, environ)
    shards = state_shards(mesh, jax_gpus, processes)
    bytes_per_param = 4 + MOMENT_BYTES[mu_dtype] + 4
    pool = host_pool_gib(arch, shards, MOMENT_BYTES[mu_dtype])
    ram = host_memory_gib()
    budget = host_budget_gib(pool, jax_gpus, evaluator, ram, floor, checkpoint_gib)
    if budget["left"] < 0:
        raise ValueError(
            f"optim.offload='pinned_host': the optimiser state ({arch.param_count() * bytes_per_param / 1e9:.0f} GB: "
            f"float32 master weights, AdamW's first moment in {mu_dtype} and its float32 second moment, sharded "
            f"{shards} ways) needs a pinned-host "
            f"pool of {pool} GiB on each of this host's {jax_gpus} GPUs ({budget['pools']} GiB); with the trainer "
            f"({budget['trainer']} GiB), the evaluator ({evaluator.gpus} GPU(s) with {evaluator.spares} spare "
            f"worker(s) each, {evaluator.compile_workers} build(s) at once: {budget['evaluator']:.0f} GiB), a "
            f"checkpoint's bytes in flight ({budget['checkpoint']:.0f} GiB, ckpt.concurrent_gb), the kernel's share "
            f"({budget['kernel']:.0f} GiB) and the floor the trainer stops at ({budget['floor']:.0f} "
            f"GiB, gpu.host_memory_floor) that is {ram - budget['left']:.0f} GiB, and this machine has "
            f"{ram} GiB: set eval.spare_workers, eval.compile_workers or ckpt.concurrent_gb lower, build with "
            f"eval.compile_parallel_phases=False (half the memory a build), evaluate on fewer GPUs (eval.devices), "
            f"store the first moment in bf16 (optim.mu_dtype), shard the state over more GPUs (mesh), or use "
            f"optim.offload=none")
    log.info("host memory of the offloaded run, GiB: pinned pools %d (%d per GPU), trainer %d, evaluator %.1f, "
             "checkpoint %.1f, kernel %.1f, floor %.1f; %.1f of %d left", budget["pools"], pool, budget["trainer"],
             budget["evaluator"], budget["checkpoint"], budget["kernel"], budget["floor"], budget["left"], ram)
    return {"XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB": str(pool)}


def apply_gpu_placement(config: GpuConfig, eval_devices: Any, num_gpus: int, environ: dict | None = None,
                        offload: str = "none", arch: Any = None, mu_dtype: str = "float32",
                        mesh: ParallelConfig | None = None,
                        evaluator: EvaluatorFootprint | None = None, checkpoint_gib: float = 0.0) -> dict[str, str]:
    """Sets JAX's device list and memory settings in `environ` (default os.environ); returns what it set.

    offload, arch, mu_dtype, mesh: optim.offload, the policy's architecture (kevin_jax.model.shapes.Qwen2Config),
    optim.mu_dtype and the mesh section; evaluator: the
    evaluator's processes (default: a judge per GPU of eval_devices, nothing else); checkpoint_gib: the host memory
    a checkpoint in progress holds (ckpt.concurrent_gb). With the optimiser state in pinned
    host memory each GPU's pinned-host pool is capped at what the allocator needs to place its share of the state
    (_offload_pool); a state the machine cannot hold beside the trainer and the evaluator is refused here, before any
    work."""
    environ = os.environ if environ is None else environ
    changes: dict[str, str] = {}
    if num_gpus == 0:
        return changes
    jax_list = parse_indices(config.jax_devices, "gpu.jax_devices")
    if jax_list is not None:
        bad = [i for i in jax_list if not 0 <= i < num_gpus]
        if bad:
            raise ValueError(f"gpu.jax_devices names GPU(s) {bad} but {num_gpus} are visible")
        # JAX_CUDA_VISIBLE_DEVICES restricts JAX only; CUDA_VISIBLE_DEVICES would hide GPUs from cuda_eval's workers.
        changes["JAX_CUDA_VISIBLE_DEVICES"] = ",".join(map(str, jax_list))
    if offload == "pinned_host" and arch is not None:
        if evaluator is None:
            eval_list = parse_indices(eval_devices, "eval.devices")
            evaluator = EvaluatorFootprint(len(eval_list) if eval_list is not None else num_gpus)
        changes.update(_offload_pool(arch, mu_dtype, len(jax_list) if jax_list is not None else num_gpus, mesh,
                                     environ, evaluator, config.host_memory_floor, checkpoint_gib))
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


def place_run(config: Any, num_gpus: int, environ: dict | None = None) -> dict[str, str]:
    """apply_gpu_placement for a run's config (sections gpu, eval, optim, model, mesh), before JAX starts."""
    arch, evaluator, checkpoint_gib = None, None, 0.0
    if config.optim.offload == "pinned_host" and num_gpus:
        from kevin_jax.model import shapes   # no jax
        arch = shapes.architecture_of(config.model.hf_checkpoint, config.model.shape)
        evaluator = EvaluatorFootprint.of(config.eval, num_gpus)
        checkpoint_gib = config.ckpt.concurrent_gb * 1e9 / 2**30 if config.ckpt.enabled else 0.0
    return apply_gpu_placement(GpuConfig(**config.gpu), config.eval.devices, num_gpus, environ,
                               offload=config.optim.offload, arch=arch, mu_dtype=config.optim.mu_dtype,
                               mesh=ParallelConfig(**config.mesh), evaluator=evaluator,
                               checkpoint_gib=checkpoint_gib)
