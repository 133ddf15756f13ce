"""Where the sampler runs on a node: its own mesh (tensor parallelism over the KV heads), the layout of the weight copy
it decodes from, and the device memory that copy takes.

Why a mesh of its own. The trainer keeps its parameters FSDP-sharded (every device holds a slice of every matrix along
the embedding dimension): right for the update, wrong for decoding, where each step would all-gather the whole model
(65 GB at QwQ-32B) to every device. The sampler instead runs Megatron-style tensor parallelism over the same devices:
each device holds 1/T of every layer's heads, MLP width and vocabulary, reads only that slice per step, and the layer
outputs are all-reduced twice per layer ([B, hidden] activations: 0.66 MB at B = 64, hidden 5120). The KV cache is
split the same way, by KV heads, so attention needs no communication.

The copy. At the start of each generate call the parameters are copied once into that layout, in the compute dtype
(`StepFunctions.prepare`: one collective reshard and cast); the copy is freed when generate returns, so the update
never holds it. Its size is the model's size / T per device (16.4 GB per GPU for QwQ-32B in bf16 on 4 GPUs): the
memory plan (kv_cache.plan_pool) subtracts it before sizing the KV pool. One-device runs copy exactly as before (the
per-layer compute-dtype copies the unrolled decode reads).

T = sampler.tensor_parallel, or (0) the largest divisor of the device count that divides the KV heads, the query
heads, the MLP width and the vocabulary: all the devices for QwQ-32B (8 KV heads) on 1, 2, 4 or 8 GPUs. Devices left
over form a `data` axis of replicas that split the decode slots.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kevin_jax import parallel
from kevin_jax.model import qwen2
from kevin_jax.model.shapes import Qwen2Config


class SamplerWeights(NamedTuple):
    """What prefill and decode read: the model's parameters in the sampling layout. Made once per generate call
    (StepFunctions.prepare), in the compute dtype, or (layer_loop="scan", when the parameters already have the sampling
    layout) the parameters themselves."""
    embed: jax.Array            # [V, H]
    layers: tuple | nnx.State   # unrolled: num_layers States of one layer each (no layer axis); scan: one stacked State
    final_norm: nnx.State       # the final RMSNorm's state
    head: jax.Array | None      # [V, H] output projection; None = tied (the embedding)

    @property
    def stacked(self) -> bool:
        return not isinstance(self.layers, tuple)

    def head_weight(self) -> jax.Array:
        return self.embed if self.head is None else self.head


def extract(model: qwen2.Qwen2ForCausalLM, *, copy: bool, unrolled: bool) -> SamplerWeights:
    """The model's parameters as SamplerWeights. copy=True (inside jit): cast to the compute dtype, and for the
    unrolled decode split into per-layer arrays; copy=False: the parameter arrays themselves, layers stacked."""
    dtype = model.options.compute_dtype
    cast = (lambda x: x.astype(dtype)) if copy else (lambda x: x)
    stacked = nnx.split(model.layers)[1]
    if copy and unrolled:
        layers = tuple(jax.tree.map(lambda p, i=i: cast(p[i]), stacked) for i in range(model.config.num_hidden_layers))
    else:
        layers = jax.tree.map(cast, stacked)
    # .get_value(), not [...]: also works on abstract (ShapeDtypeStruct) parameters.
    head = None if model.lm_head is None else cast(model.lm_head.kernel.get_value())
    return SamplerWeights(embed=cast(model.embed_tokens.embedding.get_value()), layers=layers,
                          final_norm=nnx.split(model.final_norm)[1], head=head)


def tensor_parallel_size(config: Qwen2Config, num_devices: int, requested: int = 0) -> int:
    """Devices that split each layer: `requested`, or (0) the largest divisor of num_devices that divides every
    tensor-parallel dimension of the model."""
    dims = {"num_key_value_heads": config.num_key_value_heads, "num_attention_heads": config.num_attention_heads,
            "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size}
    if requested < 0:
        raise ValueError(f"sampler.tensor_parallel must be >= 0 (0 = automatic), got {requested}")
    if requested:
        if num_devices % requested:
            raise ValueError(f"sampler.tensor_parallel={requested} does not divide the {num_devices} devices the "
                             f"sampler runs on")
        bad = {name: size for name, size in dims.items() if size % requested}
        if bad:
            raise ValueError(f"sampler.tensor_parallel={requested} does not divide the model's {bad}: the KV cache "
                             f"and the layers are split by heads; choose a divisor of {math.gcd(*dims.values())}")
        return requested
    return max(t for t in range(1, num_devices + 1)
               if num_devices % t == 0 and all(size % t == 0 for size in dims.values()))


def sampling_mesh(mesh: Mesh | None, config: Qwen2Config, tensor_parallel: int = 0) -> Mesh | None:
    """The sampler's (data, fsdp=1, tensor) mesh over `mesh`'s devices, in their order (None for one device)."""
    if mesh is None or mesh.size == 1:
        return None
    devices = list(mesh.devices.flat)
    tensor = tensor_parallel_size(config, len(devices), tensor_parallel)
    shape = (len(devices) // tensor, 1, tensor)
    auto = (jax.sharding.AxisType.Auto,) * len(parallel.MESH_AXES)
    return Mesh(np.asarray(devices).reshape(shape), parallel.MESH_AXES, axis_types=auto)


def _layer_axes(path, stacked: bool) -> tuple[str, ...]:
    axes = qwen2.logical_axes_for(("layers",) + qwen2.param_path(path))
    return axes if stacked else axes[1:]


def weight_shardings(abstract: SamplerWeights, mesh: Mesh) -> SamplerWeights:
    """NamedShardings of the sampling layout for a (possibly abstract) SamplerWeights tree."""
    def by_axes(leaf, axes, name):
        return parallel.sharding_for(leaf.shape, axes, mesh, name=name)

    def layer_tree(tree, stacked):
        return jax.tree_util.tree_map_with_path(
            lambda path, leaf: by_axes(leaf, _layer_axes(path, stacked), "layers/" + parallel.path_name(path)), tree)

    layers = (layer_tree(abstract.layers, True) if abstract.stacked
              else tuple(layer_tree(layer, False) for layer in abstract.layers))
    return SamplerWeights(
        embed=by_axes(abstract.embed, ("vocab", "embed"), "embed"),
        layers=layers,
        final_norm=jax.tree.map(lambda leaf: by_axes(leaf, ("norm",), "final_norm"), abstract.final_norm),
        head=None if abstract.head is None else by_axes(abstract.head, ("vocab", "embed"), "head"))


def has_layout(tree, shardings) -> bool:
    """Whether every array of `tree` already has the sharding of `shardings` (same structure)."""
    leaves, targets = jax.tree.leaves(tree), jax.tree.leaves(shardings)
    return len(leaves) == len(targets) and all(
        isinstance(getattr(x, "sharding", None), jax.sharding.Sharding) and x.sharding.is_equivalent_to(s, x.ndim)
        for x, s in zip(leaves, targets))


def bytes_per_device(tree) -> int:
    """Bytes one device holds of a tree of sharded (or abstract, with .sharding) arrays: the largest shard per leaf."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total


def copy_bytes_per_device(config: Qwen2Config, dtype, tensor: int) -> int:
    """Device bytes of the sampler's weight copy, analytically: every parameter once in `dtype`, split `tensor` ways
    (norms replicated; the tied head shares the embedding)."""
    itemsize = np.dtype(dtype).itemsize
    h, layers = config.hidden_size, config.num_hidden_layers
    norms = (2 * layers + 1) * h
    split = config.param_count() - norms
    return (split // tensor + norms) * itemsize


def describe(mesh: Mesh | None) -> str:
    if mesh is None:
        return "one device"
    tensor, data = mesh.shape["tensor"], mesh.shape["data"]
    return f"{tensor}-way tensor parallel" + (f" x {data} replicas" if data > 1 else "")


def sharding_of_pool(mesh: Mesh | None, tensor_axis: str | None) -> NamedSharding | None:
    """KV pool [kv_heads, rows, page, head_dim]: heads over the tensor axis, replicated over the rest."""
    if mesh is None:
        return None
    return NamedSharding(mesh, PartitionSpec(tensor_axis, None, None, None))
