"""Multi-host plumbing: meshes whose data axis spans hosts, each host's no-copy view of the policy parameters for
sampling, gathering plain-data results from every host, and moving arrays between a host and a (possibly
multi-process) global array.

Layout: devices are ordered by (process, id) and the global mesh is (data, fsdp, tensor) with `data` outermost, so
each host holds whole replicas of the parameters (parameters are never sharded over `data`). A host samples with its
own replica: `sampling_view` re-wraps the host's shards of each global parameter as an array over the host-local
mesh (the same device buffers, nothing copied), which the sampler can use in computations that involve that host
only. The update runs on the global mesh with every process taking part.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from kevin_jax import parallel, placement

log = logging.getLogger(__name__)


def build_meshes(config: parallel.ParallelConfig) -> tuple[Mesh, Mesh]:
    """(global mesh for the update, this host's mesh for sampling); the same mesh twice on a single host."""
    if jax.process_count() == 1:
        mesh = parallel.make_mesh(config)
        return mesh, mesh
    processes = jax.process_count()
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    local = [d for d in devices if d.process_index == jax.process_index()]
    resolved = placement.multihost_mesh(config, processes)       # the mesh placement sized the host pools for
    if resolved != config:
        config = resolved
        log.info("multi-host: %d processes, so mesh.data=%d (one parameter replica per host)", processes, processes)
    data, fsdp, tensor = parallel.mesh_shape(config, len(devices))
    replica = fsdp * tensor
    if len(local) % replica:
        raise ValueError(f"multi-host: a parameter replica (mesh fsdp x tensor = {replica} devices) must fit within "
                         f"one host ({len(local)} devices); shard across hosts with mesh.data (got data={data}, "
                         f"fsdp={fsdp}, tensor={tensor})")
    auto = (jax.sharding.AxisType.Auto,) * len(parallel.MESH_AXES)
    global_mesh = Mesh(np.array(devices).reshape(data, fsdp, tensor), parallel.MESH_AXES, axis_types=auto)
    local_mesh = Mesh(np.array(local).reshape(len(local) // replica, fsdp, tensor), parallel.MESH_AXES,
                      axis_types=auto)
    return global_mesh, local_mesh


def sampling_view(params: Any, local_mesh: Mesh) -> Any:
    """The host-local view of globally sharded parameters (same buffers); identity on a single host."""
    if jax.process_count() == 1:
        return params

    def to_local(x: jax.Array) -> jax.Array:
        spec = x.sharding.spec
        if any(entry == "data" or (isinstance(entry, tuple) and "data" in entry) for entry in spec):
            raise ValueError(f"a parameter is sharded over the data axis ({spec}): hosts hold no whole replica")
        sharding = NamedSharding(local_mesh, spec)
        by_device = {shard.device: shard.data for shard in x.addressable_shards}
        arrays = [by_device[d] for d in sharding.addressable_devices_indices_map(x.shape)]
        return jax.make_array_from_single_device_arrays(x.shape, sharding, arrays)

    return jax.tree.map(to_local, params)


def gather_json(obj: Any) -> list[Any]:
    """[obj of process 0, obj of process 1, ...] on every process (obj must be JSON-serialisable)."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    payload = np.frombuffer(json.dumps(obj).encode("utf-8"), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.array([payload.size], np.int64))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:payload.size] = payload
    everything = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
    return [json.loads(bytes(everything[i, :n]).decode("utf-8")) for i, n in enumerate(lengths)]


def host_share(items: list, process_index: int | None = None, process_count: int | None = None) -> list:
    """This host's share of a step's tasks (round robin)."""
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    return items[index::count]


def to_host(x) -> np.ndarray:
    """Host value of a (possibly multi-process) array: replicated values are read locally, sharded ones gathered."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def put_global(array: np.ndarray, sharding) -> jax.Array:
    """A global array from a host copy that every process holds in full (works single- and multi-process)."""
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])
