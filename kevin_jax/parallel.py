"""Device mesh, logical-axis partition rules and multi-host start-up (the pjit model: jax.jit + NamedSharding).

Every array dimension that matters for sharding carries a *logical* name ("embed", "q_heads", "batch", ...). A rule
table maps logical names to mesh axes of a 3-D mesh ("data", "fsdp", "tensor"):

  data    pure data parallelism (params replicated across it)
  fsdp    data parallelism with parameters, gradients and optimizer state sharded across it (ZeRO-3)
  tensor  Megatron-style tensor parallelism over heads / MLP width / vocabulary

The model (kevin_jax.model.qwen2) says which logical axes each parameter has; this module turns that into
NamedShardings, checks divisibility with errors that name the parameter and dimension, and constrains activations
inside jit through `constrain` (a no-op unless an `activation_sharding(mesh)` context is active while tracing).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kevin_jax.placement import ParallelConfig, mesh_shape  # noqa: F401  (mesh_shape: jax-free, in placement)

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
LogicalRules = Mapping[str, str | tuple[str, ...] | None]

DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    # activations
    "batch": ("data", "fsdp"),
    "seq": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
    # parameters
    "layers": None,
    "embed": "fsdp",
    "vocab": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
}


# Environment variables that say "this process is one of several launched by a cluster manager"; jax.distributed
# reads the details from them itself.
_CLUSTER_MARKERS = (
    ("SLURM_NTASKS", lambda v: int(v) > 1),
    ("OMPI_COMM_WORLD_SIZE", lambda v: int(v) > 1),
    ("JAX_COORDINATOR_ADDRESS", bool),
)


def initialize_distributed(config: ParallelConfig) -> bool:
    """Starts jax.distributed when this is a multi-host run; returns whether it did. Call before any JAX work."""
    if jax.distributed.is_initialized():
        return True
    explicit = config.coordinator_address is not None or config.num_processes is not None
    if explicit:
        if config.num_processes is not None and config.num_processes > 1 and config.coordinator_address is None:
            raise ValueError("multi-host run: num_processes > 1 needs coordinator_address (host:port of process 0)")
        jax.distributed.initialize(coordinator_address=config.coordinator_address,
                                   num_processes=config.num_processes, process_id=config.process_id)
        return True
    for name, is_multi in _CLUSTER_MARKERS:
        value = os.environ.get(name)
        if value:
            try:
                multi = is_multi(value)
            except ValueError:
                multi = False
            if multi:
                logging.info("multi-host environment detected (%s=%s): jax.distributed.initialize()", name, value)
                jax.distributed.initialize()
                return True
    return False


def make_mesh(config: ParallelConfig = ParallelConfig(), devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices of all processes)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(config, len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def logical_to_spec(logical_axes: Sequence[str | None], rules: LogicalRules = DEFAULT_RULES) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions have these logical names (None = replicated)."""
    spec = []
    used: set[str] = set()
    for name in logical_axes:
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise KeyError(f"logical axis {name!r} has no partition rule; known: {sorted(rules)}")
        mesh_axes = rules[name]
        mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
        mesh_axes = tuple(a for a in mesh_axes if a not in used)   # a mesh axis may shard only one dimension
        used.update(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else (mesh_axes or None))
    return PartitionSpec(*spec)


def _axis_size(mesh: Mesh, entry) -> int:
    if entry is None:
        return 1
    names = (entry,) if isinstance(entry, str) else entry
    return math.prod(mesh.shape[n] for n in names)


def sharding_for(shape: Sequence[int], logical_axes: Sequence[str | None], mesh: Mesh,
                 rules: LogicalRules = DEFAULT_RULES, *, name: str = "array") -> NamedSharding:
    """NamedSharding for one parameter; raises a clear error when a mesh axis does not divide a dimension."""
    if len(shape) != len(logical_axes):
        raise ValueError(f"{name}: shape {tuple(shape)} has {len(shape)} dims but logical axes {tuple(logical_axes)}")
    spec = logical_to_spec(logical_axes, rules)
    for dim, (size, logical, entry) in enumerate(zip(shape, logical_axes, spec)):
        parts = _axis_size(mesh, entry)
        if size % parts:
            raise ValueError(
                f"{name}: dimension {dim} ({logical}={size}) is not divisible by mesh axis {entry} of size {parts}; "
                f"choose a mesh whose {entry} size divides {size}")
    return NamedSharding(mesh, spec)


def tree_shardings(abstract_tree: Any, logical_tree: Any, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> Any:
    """Maps a tree of arrays/ShapeDtypeStructs and a same-structure tree of logical-axis tuples to NamedShardings."""
    paths_and_leaves = jax.tree_util.tree_flatten_with_path(abstract_tree)[0]
    logical_leaves = jax.tree_util.tree_leaves(logical_tree, is_leaf=lambda x: isinstance(x, tuple))
    if len(paths_and_leaves) != len(logical_leaves):
        raise ValueError(f"logical axes tree has {len(logical_leaves)} leaves, params tree {len(paths_and_leaves)}")
    shardings = [sharding_for(leaf.shape, axes, mesh, rules, name=path_name(path))
                 for (path, leaf), axes in zip(paths_and_leaves, logical_leaves)]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(abstract_tree), shardings)


def path_name(path) -> str:
    """'layers/attn/q_proj/kernel' for a jax key path (nnx Variable '.value' leaves dropped)."""
    names = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                key = getattr(key, attr)
                break
        names.append(str(key))
    if names and names[-1] == "value":
        names.pop()
    return "/".join(names)


def batch_sharding(mesh: Mesh, ndim: int = 2, rules: LogicalRules = DEFAULT_RULES) -> NamedSharding:
    """Sharding of a [batch, seq, ...] input: batch over the data-parallel axes, the rest replicated."""
    return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), rules))


def check_batch_divisible(batch_size: int, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> None:
    parts = _axis_size(mesh, logical_to_spec(("batch",), rules)[0])
    if batch_size % parts:
        raise ValueError(f"batch size {batch_size} is not divisible by the data-parallel devices ({parts} = "
                         f"data x fsdp); use a multiple of {parts}")


# ----------------------------------------------------------------------------------------------- activations
_ACTIVE: contextvars.ContextVar[tuple[Mesh, LogicalRules] | None] = contextvars.ContextVar(
    "kevin_jax_activation_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> Iterator[None]:
    """While active (during tracing), `constrain` pins activations to shardings derived from `rules` on `mesh`."""
    token = _ACTIVE.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def traced_with_activation_sharding(fn: Callable, mesh: Mesh | None) -> Callable:
    """fn, traced under `mesh`'s activation-sharding rules (jit it: the model pins its activations through them while
    it is traced); fn itself without a mesh."""
    if mesh is None:
        return fn

    @functools.wraps(fn)
    def wrapped(*args):
        with activation_sharding(mesh):
            return fn(*args)

    return wrapped


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical names. Mesh axes that do not divide a dimension are dropped (e.g. a
    decode batch of 1), since activations, unlike parameters, may legitimately be small."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    spec = []
    for size, entry in zip(x.shape, logical_to_spec(logical_axes, rules)):
        spec.append(entry if size % _axis_size(mesh, entry) == 0 else None)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))


def describe(mesh: Mesh) -> str:
    sizes = " x ".join(f"{name}={size}" for name, size in mesh.shape.items())
    return f"{sizes} ({int(np.prod(list(mesh.shape.values())))} devices)"
