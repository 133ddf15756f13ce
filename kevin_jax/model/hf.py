"""Hugging Face checkpoints <-> sharded kevin_jax parameters, one tensor at a time.

Import (load_hf_params): the files are streamed tensor by tensor in file order. Reader threads copy each tensor's
slices for this process's devices out of a memory map of its file (HF layout and dtype; a slice is what that device
keeps, so a device's share of the whole model is all it ever receives) and put them on those devices; a jitted step
then changes the layout on the devices (HF's [out, in] matrices become [in, heads, head_dim] einsum kernels, per-layer
tensors are written into the scanned [num_layers, ...] parameters in place) and the dtype. The host holds at most
`max_host_bytes` of slices at a time and unmaps each shard file once it is read; no device holds the whole model.

Export: parameters are gathered one tensor (one layer's slice of a stacked parameter) at a time and written to
safetensors files of at most `max_shard_bytes`, with model.safetensors.index.json, config.json and tokenizer files,
so that transformers or vLLM can serve the result. Only process 0 writes; every process takes part in the gathers.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from safetensors import safe_open

from kevin_jax import parallel
from kevin_jax.multihost import to_host
from kevin_jax.model import qwen2
from kevin_jax.model.shapes import Qwen2Config, from_hf_config, to_hf_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "added_tokens.json", "chat_template.jinja", "generation_config.json")
# Buffers some old exports contain; they are derived, not parameters.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

_NUMPY_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float16": np.float16}

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint directory that does not match what the model needs (the message names file / tensor / dim)."""


# ----------------------------------------------------------------------------------------------- the mapping
@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One parameter: its path in the model state, its HF name ({i} = layer index) and the layout change.

    kind: "same" (identical layout), "transpose" (2-D [out, in] <-> [in, out]), "heads_in" (HF [N*D, H] <-> ours
      [H, N, D]), "heads_bias" ([N*D] <-> [N, D]), "heads_out" (HF [H, N*D] <-> ours [N, D, H]).
    """
    path: tuple[str, ...]
    hf_name: str
    kind: str
    per_layer: bool


def tensor_maps(config: Qwen2Config) -> list[TensorMap]:
    """In HF's canonical order: embeddings, then each layer's tensors, final norm, LM head."""
    layer = [
        TensorMap(("attn", "q_proj", "kernel"), "model.layers.{i}.self_attn.q_proj.weight", "heads_in", True),
        TensorMap(("attn", "q_proj", "bias"), "model.layers.{i}.self_attn.q_proj.bias", "heads_bias", True),
        TensorMap(("attn", "k_proj", "kernel"), "model.layers.{i}.self_attn.k_proj.weight", "heads_in", True),
        TensorMap(("attn", "k_proj", "bias"), "model.layers.{i}.self_attn.k_proj.bias", "heads_bias", True),
        TensorMap(("attn", "v_proj", "kernel"), "model.layers.{i}.self_attn.v_proj.weight", "heads_in", True),
        TensorMap(("attn", "v_proj", "bias"), "model.layers.{i}.self_attn.v_proj.bias", "heads_bias", True),
        TensorMap(("attn", "o_proj", "kernel"), "model.layers.{i}.self_attn.o_proj.weight", "heads_out", True),
        TensorMap(("mlp", "gate_proj", "kernel"), "model.layers.{i}.mlp.gate_proj.weight", "transpose", True),
        TensorMap(("mlp", "up_proj", "kernel"), "model.layers.{i}.mlp.up_proj.weight", "transpose", True),
        TensorMap(("mlp", "down_proj", "kernel"), "model.layers.{i}.mlp.down_proj.weight", "transpose", True),
        TensorMap(("input_norm", "scale"), "model.layers.{i}.input_layernorm.weight", "same", True),
        TensorMap(("post_attention_norm", "scale"), "model.layers.{i}.post_attention_layernorm.weight", "same", True),
    ]
    maps = [TensorMap(("embed_tokens", "embedding"), "model.embed_tokens.weight", "same", False)]
    maps += layer
    maps.append(TensorMap(("final_norm", "scale"), "model.norm.weight", "same", False))
    if not config.tie_word_embeddings:
        maps.append(TensorMap(("lm_head", "kernel"), "lm_head.weight", "same", False))
    return maps


def hf_shape(kind: str, ours: Sequence[int]) -> tuple[int, ...]:
    """HF tensor shape of one (per-layer) parameter of shape `ours`."""
    if kind == "same":
        return tuple(ours)
    if kind == "transpose":
        return (ours[1], ours[0])
    if kind == "heads_in":
        return (ours[1] * ours[2], ours[0])
    if kind == "heads_bias":
        return (ours[0] * ours[1],)
    if kind == "heads_out":
        return (ours[2], ours[0] * ours[1])
    raise ValueError(kind)


def to_hf_layout(kind: str, ours: np.ndarray) -> np.ndarray:
    if kind == "same":
        out = ours
    elif kind == "transpose":
        out = ours.T
    elif kind == "heads_in":
        out = ours.reshape(ours.shape[0], -1).T
    elif kind == "heads_bias":
        out = ours.reshape(-1)
    elif kind == "heads_out":
        out = ours.reshape(-1, ours.shape[2]).T
    else:
        raise ValueError(kind)
    return np.ascontiguousarray(out)


def hf_layout_spec(kind: str, ours: PartitionSpec, ndim: int) -> PartitionSpec:
    """The sharding, in HF's layout, of a tensor that is sharded `ours` in our layout (per-layer dims), such that
    changing the layout on the device (from_hf_layout) needs no communication. A sharded head_dim cannot be expressed
    on HF's fused [heads * head_dim] dim; that dim is then read whole (never the case with the default rules)."""
    entries = tuple(ours) + (None,) * (ndim - len(ours))
    if kind == "same":
        return PartitionSpec(*entries)
    if kind == "transpose":
        return PartitionSpec(entries[1], entries[0])
    if kind == "heads_in":
        hidden, heads, head_dim = entries
        return PartitionSpec(heads if head_dim is None else None, hidden)
    if kind == "heads_bias":
        heads, head_dim = entries
        return PartitionSpec(heads if head_dim is None else None)
    if kind == "heads_out":
        heads, head_dim, hidden = entries
        return PartitionSpec(hidden, heads if head_dim is None else None)
    raise ValueError(kind)


def from_hf_layout(kind: str, x, ours: Sequence[int]):
    """HF's per-layer tensor `x` in our layout of shape `ours` (jnp or np; inside jit it runs on the device)."""
    if kind == "same":
        return x
    if kind == "transpose":
        return x.T
    if kind == "heads_in":
        return x.reshape(ours[1], ours[2], ours[0]).transpose(2, 0, 1)
    if kind == "heads_bias":
        return x.reshape(tuple(ours))
    if kind == "heads_out":
        return x.reshape(ours[2], ours[0], ours[1]).transpose(1, 2, 0)
    raise ValueError(kind)


# ----------------------------------------------------------------------------------------------- reading
# safetensors dtype names -> numpy dtypes (the float types a Qwen2 checkpoint uses).
_SAFETENSORS_DTYPES = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64}
# Host memory the import may hold at once (tensors read but not yet on their devices); below one 5 GB shard file.
DEFAULT_MAX_HOST_BYTES = 4 * 2**30
DEFAULT_READ_THREADS = 8


def safetensors_header(path: str) -> tuple[dict[str, dict], int]:
    """({tensor name: {"dtype", "shape", "data_offsets"}}, byte offset of the data section) of a safetensors file."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
        length = int.from_bytes(prefix, "little")
        if length > os.path.getsize(path) - 8:
            raise CheckpointError(f"{path} is not a safetensors file (header length {length} exceeds the file)")
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise CheckpointError(f"{path}: unreadable safetensors header ({e})") from None
    header.pop("__metadata__", None)
    return header, 8 + length


def _weight_map(directory: str) -> dict[str, str]:
    """tensor name -> file name, from the index or the single file; clear errors for missing files."""
    index_path = os.path.join(directory, INDEX_FILE)
    single_path = os.path.join(directory, SINGLE_FILE)
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        if "weight_map" not in index:
            raise CheckpointError(f"{index_path} has no 'weight_map'")
        weight_map = dict(index["weight_map"])
        missing = sorted({fn for fn in weight_map.values() if not os.path.exists(os.path.join(directory, fn))})
        if missing:
            raise CheckpointError(f"checkpoint {directory}: shard file(s) listed in {INDEX_FILE} are missing: "
                                  f"{', '.join(missing)}")
        return weight_map
    if os.path.exists(single_path):
        return {name: SINGLE_FILE for name in safetensors_header(single_path)[0]}
    raise CheckpointError(f"checkpoint {directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


class _Reader:
    """Slices of tensors in safetensors files. Each file is checked by safetensors' own parser (safe_open) once, then
    read through a read-only memory map: a slice is one numpy copy of just its bytes, and the copy runs without the
    GIL (safetensors' get_slice holds it, which serialises the import's reader threads)."""

    def __init__(self, directory: str, weight_map: dict[str, str]):
        self.directory = directory
        self.weight_map = weight_map
        self._headers: dict[str, tuple[dict[str, dict], int]] = {}
        self._maps: dict[str, np.memmap] = {}
        self._lock = threading.Lock()

    def _header(self, filename: str) -> tuple[dict[str, dict], int]:
        with self._lock:
            if filename not in self._headers:
                path = os.path.join(self.directory, filename)
                try:
                    with safe_open(path, framework="numpy"):
                        pass
                except Exception as e:      # safetensors raises its own error types for corrupt files
                    raise CheckpointError(f"{path}: not a valid safetensors file ({e})") from None
                self._headers[filename] = safetensors_header(path)
            return self._headers[filename]

    def entry(self, name: str) -> dict:
        header, _ = self._header(self.weight_map[name])
        if name not in header:
            raise CheckpointError(f"{INDEX_FILE} places {name} in {self.weight_map[name]}, which does not hold it")
        return header[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entry(name)["shape"])

    def dtype(self, name: str) -> str:
        return self.entry(name)["dtype"]

    def order(self) -> list[str]:
        """Every tensor name, file by file (sorted) and by position inside each file: a sequential read."""
        names = []
        for filename in sorted(set(self.weight_map.values())):
            header, _ = self._header(filename)
            mine = [n for n in header if self.weight_map.get(n) == filename]
            names += sorted(mine, key=lambda n: header[n]["data_offsets"][0])
        return names

    def _array(self, name: str) -> np.ndarray:
        filename = self.weight_map[name]
        entry = self.entry(name)
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise CheckpointError(f"tensor {name} in {filename} has dtype {entry['dtype']}; a Qwen2 checkpoint holds "
                                  f"{', '.join(_SAFETENSORS_DTYPES)}")
        _, data_start = self._header(filename)
        with self._lock:
            if filename not in self._maps:
                self._maps[filename] = np.memmap(os.path.join(self.directory, filename), dtype=np.uint8, mode="r")
            whole = self._maps[filename]
        begin, end = entry["data_offsets"]
        return whole[data_start + begin:data_start + end].view(dtype).reshape(entry["shape"])

    def get(self, name: str, slices: tuple[slice, ...]) -> np.ndarray:
        return np.ascontiguousarray(self._array(name)[slices])

    def close_file(self, filename: str) -> None:
        with self._lock:
            self._maps.pop(filename, None)

    def close(self):
        with self._lock:
            self._maps.clear()


def _bounds(index: tuple[slice, ...], shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
    out = []
    for s, dim in zip(index, shape):
        start, stop, step = s.indices(dim)
        if step != 1:
            raise ValueError(f"strided shard index {s} is not supported")
        out.append((start, stop))
    return tuple(out)


def check_checkpoint(config: Qwen2Config, reader: _Reader) -> None:
    """Every expected tensor present with the right shape; nothing unexplained left over."""
    abstract = nnx.state(qwen2.abstract_model(config, qwen2.ModelOptions(dtype="float32", param_dtype="float32")))
    shapes = _state_shapes(abstract)
    expected: dict[str, tuple[int, ...]] = {}
    for m in tensor_maps(config):
        ours = shapes[("layers",) + m.path if m.per_layer else m.path]
        per_layer = ours[1:] if m.per_layer else ours
        names = [m.hf_name.format(i=i) for i in range(config.num_hidden_layers)] if m.per_layer else [m.hf_name]
        for name in names:
            expected[name] = hf_shape(m.kind, per_layer)
    available = set(reader.weight_map)
    missing = sorted(set(expected) - available)
    if missing:
        more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        raise CheckpointError(f"checkpoint {reader.directory} lacks tensors the config needs: "
                              f"{', '.join(missing[:8])}{more}")
    unexpected = sorted(n for n in available - set(expected) if not n.endswith(_IGNORED_SUFFIXES)
                        and not (config.tie_word_embeddings and n == "lm_head.weight"))
    if unexpected:
        more = f" (and {len(unexpected) - 8} more)" if len(unexpected) > 8 else ""
        raise CheckpointError(f"checkpoint {reader.directory} has tensors this Qwen2 config does not use: "
                              f"{', '.join(unexpected[:8])}{more} (wrong config.json, or not a Qwen2 checkpoint?)")
    for name, shape in expected.items():
        actual = reader.shape(name)
        if actual != shape:
            raise CheckpointError(f"tensor {name} in {reader.weight_map[name]} has shape {list(actual)} but "
                                  f"config.json implies {list(shape)} (hidden_size={config.hidden_size}, "
                                  f"heads={config.num_attention_heads}, kv_heads={config.num_key_value_heads}, "
                                  f"head_dim={config.head_dim}, intermediate_size={config.intermediate_size}, "
                                  f"vocab_size={config.vocab_size})")
        if reader.dtype(name) not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"tensor {name} in {reader.weight_map[name]} has dtype {reader.dtype(name)}; a "
                                  f"Qwen2 checkpoint holds {', '.join(_SAFETENSORS_DTYPES)}")


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What inspect_checkpoint found: the architecture (config.json), the tensors' dtypes in the files, shard files
    and bytes of tensor data."""
    config: Qwen2Config
    dtypes: tuple[str, ...]
    files: int
    tensor_bytes: int


def is_checkpoint_dir(path: str | os.PathLike) -> bool:
    """A directory laid out as a Hugging Face checkpoint: model.safetensors or its index, or a config.json of a
    model (model_type / architectures; a training workdir's config.json is the run config)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return False
    if os.path.exists(os.path.join(path, SINGLE_FILE)) or os.path.exists(os.path.join(path, INDEX_FILE)):
        return True
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and ("model_type" in config or "architectures" in config)


def inspect_checkpoint(directory: str | os.PathLike) -> CheckpointInfo:
    """Checks an HF Qwen2 checkpoint directory without reading its tensors' data (so that a bad one fails before any
    device work): config.json describes a Qwen2 model, every shard the index names exists and is a safetensors file,
    every tensor the architecture needs is there with its shape and a float dtype, and nothing else is."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise CheckpointError(f"checkpoint {directory} has no config.json (a Hugging Face checkpoint directory holds "
                              f"config.json and {SINGLE_FILE}, or {INDEX_FILE} and the shards it lists)")
    config = from_hf_config(directory)
    reader = _Reader(directory, _weight_map(directory))
    try:
        check_checkpoint(config, reader)
        names = [n for n in reader.weight_map if not n.endswith(_IGNORED_SUFFIXES)]
        nbytes = sum(int(np.prod(reader.shape(n), dtype=np.int64)) *
                     np.dtype(_SAFETENSORS_DTYPES[reader.dtype(n)]).itemsize for n in names)
        dtypes = tuple(sorted({reader.dtype(n) for n in names}))
    finally:
        reader.close()
    return CheckpointInfo(config, dtypes, len(set(reader.weight_map.values())), nbytes)


def _state_shapes(state) -> dict[tuple[str, ...], tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {qwen2.param_path(path): tuple(leaf.shape) for path, leaf in leaves}


@dataclasses.dataclass
class LoadStats:
    """What one import did (this process): tensors placed, bytes read from the files, the most host memory held by
    tensors read but not yet placed (bounded by max_host_bytes, or by the largest tensor when that is bigger), and the
    wall time."""
    tensors: int = 0
    bytes_read: int = 0
    peak_host_bytes: int = 0
    largest_tensor_bytes: int = 0
    seconds: float = 0.0

    @property
    def gb_per_s(self) -> float:
        return self.bytes_read / 1e9 / self.seconds if self.seconds else 0.0


@dataclasses.dataclass(frozen=True)
class _Placement:
    """One HF tensor: where it goes (parameter key, layer or None), its layouts and the sharding it is read onto."""
    name: str
    key: tuple[str, ...]
    layer: int | None
    kind: str
    hf_shape: tuple[int, ...]
    ours_shape: tuple[int, ...]          # per-layer
    sharding: NamedSharding              # HF layout
    slices: tuple[tuple[jax.Device, tuple[tuple[int, int], ...]], ...]      # this process's devices and their slices
    host_bytes: int                      # distinct slices this process reads


def load_hf_params(directory: str | os.PathLike, options: qwen2.ModelOptions = qwen2.ModelOptions(), *,
                   mesh: jax.sharding.Mesh | None = None, rules=parallel.DEFAULT_RULES,
                   config: Qwen2Config | None = None, max_host_bytes: int = DEFAULT_MAX_HOST_BYTES,
                   read_threads: int = DEFAULT_READ_THREADS) -> tuple[Any, Any, LoadStats]:
    """(graphdef, parameter state sharded over `mesh`, LoadStats) of an HF Qwen2 checkpoint directory.

    The import streams the files tensor by tensor, in file order: `read_threads` threads read each tensor's slices
    for this process's devices (HF layout, the file's dtype) and put them on those devices; the main thread then
    changes layout and dtype on the devices and writes the tensor into its parameter (a stacked [num_layers, ...]
    parameter one layer at a time, in place). At most `max_host_bytes` of read-but-unplaced slices are held at once
    (one tensor when a single tensor is bigger), and no device ever holds more than its shard of each parameter plus
    one tensor's slice.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    if max_host_bytes <= 0 or read_threads <= 0:
        raise ValueError(f"max_host_bytes ({max_host_bytes}) and read_threads ({read_threads}) must be positive")
    start = time.perf_counter()
    file_config = from_hf_config(directory)
    if config is not None and config != file_config:
        raise CheckpointError(f"{directory}/config.json describes {file_config}, expected {config}")
    config = file_config
    mesh = mesh if mesh is not None else parallel.make_mesh(parallel.ParallelConfig())
    reader = _Reader(directory, _weight_map(directory))
    try:
        check_checkpoint(config, reader)
        graphdef, abstract_state = nnx.split(qwen2.abstract_model(config, options))
        shardings = qwen2.param_shardings(abstract_state, mesh, rules)
        leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
        targets = {qwen2.param_path(path): (leaf, sharding)
                   for (path, leaf), sharding in zip(leaves, jax.tree_util.tree_leaves(shardings))}
        plan = _plan(config, reader, targets, mesh)
        values, stats = _stream(reader, plan, targets, max_host_bytes, read_threads)
        state = jax.tree_util.tree_unflatten(treedef, [values[qwen2.param_path(path)] for path, _ in leaves])
    finally:
        reader.close()
    for leaf in jax.tree_util.tree_leaves(state):
        leaf.block_until_ready()
    stats.seconds = time.perf_counter() - start
    log.info("loaded %s: %d tensors, %.2f GB read in %.1f s (%.2f GB/s), at most %.2f GB of host memory held, onto "
             "mesh %s", directory, stats.tensors, stats.bytes_read / 1e9, stats.seconds, stats.gb_per_s,
             stats.peak_host_bytes / 1e9, parallel.describe(mesh))
    return graphdef, state, stats


def load_hf_checkpoint(directory: str | os.PathLike, options: qwen2.ModelOptions = qwen2.ModelOptions(), *,
                       mesh: jax.sharding.Mesh | None = None, rules=parallel.DEFAULT_RULES,
                       config: Qwen2Config | None = None, max_host_bytes: int = DEFAULT_MAX_HOST_BYTES,
                       read_threads: int = DEFAULT_READ_THREADS) -> qwen2.Qwen2ForCausalLM:
    """Loads an HF Qwen2 checkpoint directory into a model whose parameters are sharded over `mesh` (load_hf_params).

    Args:
      directory: holds config.json and model.safetensors or model.safetensors.index.json + shards.
      options: run options; parameters are converted to options.param_dtype.
      mesh: device mesh (default: every device on the fsdp axis).
      rules: logical-axis partition rules.
      config: architecture to expect (default: read config.json).
      max_host_bytes, read_threads: see load_hf_params.
    """
    graphdef, state, _ = load_hf_params(directory, options, mesh=mesh, rules=rules, config=config,
                                        max_host_bytes=max_host_bytes, read_threads=read_threads)
    return nnx.merge(graphdef, state)


def _plan(config: Qwen2Config, reader: _Reader, targets: dict, mesh) -> list[_Placement]:
    by_name: dict[str, tuple[TensorMap, int | None]] = {}
    for m in tensor_maps(config):
        if m.per_layer:
            by_name.update({m.hf_name.format(i=i): (m, i) for i in range(config.num_hidden_layers)})
        else:
            by_name[m.hf_name] = (m, None)
    plan = []
    for name in reader.order():
        if name not in by_name:
            continue                          # derived buffers, or a tied model's lm_head (check_checkpoint)
        m, layer = by_name[name]
        key = ("layers",) + m.path if m.per_layer else m.path
        if key not in targets:
            raise CheckpointError(f"model parameter {'/'.join(key)} has no HF tensor mapping")
        leaf, target_sharding = targets[key]
        spec = tuple(target_sharding.spec) + (None,) * (len(leaf.shape) - len(target_sharding.spec))
        ours_shape, ours_spec = (tuple(leaf.shape[1:]), spec[1:]) if m.per_layer else (tuple(leaf.shape), spec)
        shape = hf_shape(m.kind, ours_shape)
        sharding = NamedSharding(mesh, hf_layout_spec(m.kind, PartitionSpec(*ours_spec), len(ours_shape)))
        slices = tuple((device, _bounds(index, shape))
                       for device, index in sharding.addressable_devices_indices_map(shape).items())
        itemsize = np.dtype(_SAFETENSORS_DTYPES[reader.dtype(name)]).itemsize
        distinct = {bounds for _, bounds in slices}
        host_bytes = sum(int(np.prod([b - a for a, b in bounds])) * itemsize for bounds in distinct)
        plan.append(_Placement(name, key, layer, m.kind, shape, ours_shape, sharding, slices, host_bytes))
    return plan


@functools.lru_cache(maxsize=256)
def _placer(kind: str, ours_shape: tuple[int, ...], dtype, sharding: NamedSharding, stacked: bool):
    """A jitted function that turns one HF-layout tensor into our layout and dtype on the devices: the parameter
    itself, or (stacked) written in place into layer `layer` of the donated [num_layers, ...] parameter. Cached, so
    that a second import (the KL reference, a resume) compiles nothing."""
    if stacked:
        def place(target, x, layer):
            y = from_hf_layout(kind, x, ours_shape).astype(dtype)
            return jax.lax.dynamic_update_index_in_dim(target, y, layer, 0)
        return jax.jit(place, donate_argnums=(0,), out_shardings=sharding)
    return jax.jit(lambda x: from_hf_layout(kind, x, ours_shape).astype(dtype), out_shardings=sharding)


@functools.lru_cache(maxsize=64)
def _zeros(shape: tuple[int, ...], dtype, sharding: NamedSharding):
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


def _stream(reader: _Reader, plan: list[_Placement], targets: dict, max_host_bytes: int,
            read_threads: int) -> tuple[dict, LoadStats]:
    stats = LoadStats(largest_tensor_bytes=max((p.host_bytes for p in plan), default=0))
    values: dict[tuple[str, ...], jax.Array] = {}
    layers_written: dict[tuple[str, ...], int] = collections.Counter()
    remaining_in_file = collections.Counter(reader.weight_map[p.name] for p in plan)

    def read(p: _Placement) -> jax.Array:
        host: dict[tuple, np.ndarray] = {}
        arrays = []
        for device, bounds in p.slices:
            if bounds not in host:
                host[bounds] = reader.get(p.name, tuple(slice(a, b) for a, b in bounds))
            arrays.append(jax.device_put(host[bounds], device))
        for array in arrays:
            array.block_until_ready()        # the host copies may go once the transfers are done
        return jax.make_array_from_single_device_arrays(p.hf_shape, p.sharding, arrays)

    def place(p: _Placement, x: jax.Array) -> None:
        leaf, sharding = targets[p.key]
        dtype = np.dtype(leaf.dtype)
        if p.layer is None:
            values[p.key] = _placer(p.kind, p.ours_shape, dtype, sharding, False)(x)
            return
        if p.key not in values:
            values[p.key] = _zeros(tuple(leaf.shape), dtype, sharding)()
        values[p.key] = _placer(p.kind, p.ours_shape, dtype, sharding, True)(values[p.key], x, np.int32(p.layer))
        layers_written[p.key] += 1

    # Bytes in flight: a tensor counts from its read until the step that places it has run, not only until it is
    # handed to that step: dispatch is asynchronous, and the step holds its input (on the CPU backend the input's
    # buffers are the host slices themselves) until it runs, which on a busy machine is several tensors later.
    pending: collections.deque = collections.deque()       # (placement, future of its read)
    placing: collections.deque = collections.deque()       # (bytes, parameter key) handed to their placing step
    in_flight = 0

    def retire_oldest() -> None:
        nonlocal in_flight
        nbytes, key = placing.popleft()
        values[key].block_until_ready()    # the parameter's latest write: it runs after every earlier one of it
        in_flight -= nbytes

    def consume_oldest() -> None:
        p, future = pending.popleft()
        place(p, future.result())
        placing.append((p.host_bytes, p.key))
        stats.tensors += 1
        stats.bytes_read += p.host_bytes
        filename = reader.weight_map[p.name]
        remaining_in_file[filename] -= 1
        if not remaining_in_file[filename]:
            reader.close_file(filename)      # unmap a finished shard file

    with concurrent.futures.ThreadPoolExecutor(read_threads, thread_name_prefix="hf-read") as pool:
        try:
            for p in plan:
                while placing and values[placing[0][1]].is_ready():      # retire what has run, not waiting
                    retire_oldest()
                while pending and len(pending) >= 2 * read_threads:
                    consume_oldest()
                while (pending or placing) and in_flight + p.host_bytes > max_host_bytes:
                    retire_oldest() if placing else consume_oldest()
                pending.append((p, pool.submit(read, p)))
                in_flight += p.host_bytes
                stats.peak_host_bytes = max(stats.peak_host_bytes, in_flight)
            while pending:
                consume_oldest()
            while placing:
                retire_oldest()
        finally:
            for _, future in pending:
                future.cancel()
    for key, (leaf, _) in targets.items():
        if key[0] == "layers" and layers_written[key] != leaf.shape[0]:
            raise CheckpointError(f"parameter {'/'.join(key)}: {layers_written[key]} of {leaf.shape[0]} layers "
                                  f"found in {reader.directory}")
    return values, stats


# ----------------------------------------------------------------------------------------------- writing
def iter_hf_tensors(model: qwen2.Qwen2ForCausalLM) -> Iterator[tuple[str, Callable[[], np.ndarray], tuple, str]]:
    """(HF name, thunk producing the host tensor, HF shape, source dtype) in canonical order, one tensor at a time."""
    config = model.config
    state = nnx.state(model, nnx.Param)
    by_path = {qwen2.param_path(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]}
    for m in tensor_maps(config):
        if m.per_layer:
            param = by_path[("layers",) + m.path]
            for layer in range(config.num_hidden_layers):
                thunk = lambda p=param, i=layer, k=m.kind: to_hf_layout(k, to_host(p[i]))
                yield m.hf_name.format(i=layer), thunk, hf_shape(m.kind, param.shape[1:]), str(param.dtype)
        else:
            param = by_path[m.path]
            yield m.hf_name, (lambda p=param, k=m.kind: to_hf_layout(k, to_host(p))), hf_shape(m.kind, param.shape), \
                str(param.dtype)


def save_hf_checkpoint(model: qwen2.Qwen2ForCausalLM, directory: str | os.PathLike, *,
                       dtype: str | None = "bfloat16", max_shard_bytes: int = 5 * 2**30,
                       tokenizer_dir: str | os.PathLike | None = None) -> list[str]:
    """Writes config.json, safetensors shard(s) (+ index when more than one) and tokenizer files.

    Args:
      dtype: tensor dtype in the files ("bfloat16" as HF ships Qwen; None = the parameters' own dtype).
      max_shard_bytes: upper bound of one safetensors file (a single larger tensor gets a file of its own).
      tokenizer_dir: copy tokenizer/generation files from here (e.g. the source checkpoint dir).
    Returns:
      the safetensors file names written.
    """
    from safetensors.numpy import save_file

    directory = os.fspath(directory)
    writer = jax.process_index() == 0
    plan = list(iter_hf_tensors(model))
    itemsize = lambda src: np.dtype(_NUMPY_DTYPES[dtype or src]).itemsize
    sizes = [int(np.prod(shape)) * itemsize(src) for _, _, shape, src in plan]
    groups: list[list[int]] = [[]]
    current = 0
    for i, size in enumerate(sizes):
        if groups[-1] and current + size > max_shard_bytes:
            groups.append([])
            current = 0
        groups[-1].append(i)
        current += size
    n = len(groups)
    names = [SINGLE_FILE] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    if writer:
        os.makedirs(directory, exist_ok=True)
    weight_map = {}
    for filename, group in zip(names, groups):
        tensors = {}
        for i in group:
            name, thunk, _, src = plan[i]
            array = thunk()                       # every process joins the gather; only process 0 keeps it
            tensors[name] = array.astype(_NUMPY_DTYPES[dtype or src], copy=False)
            weight_map[name] = filename
        if writer:
            save_file(tensors, os.path.join(directory, filename), metadata={"format": "pt"})
        del tensors
    if writer:
        if n > 1:
            index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
            with open(os.path.join(directory, INDEX_FILE), "w") as f:
                json.dump(index, f, indent=2, sort_keys=True)
        first_dtype = plan[0][3]
        hf_config = to_hf_config(model.config, torch_dtype=dtype or first_dtype)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2)
        if tokenizer_dir is not None:
            copied = 0
            for fn in TOKENIZER_FILES:
                src = os.path.join(os.fspath(tokenizer_dir), fn)
                if os.path.exists(src):
                    shutil.copyfile(src, os.path.join(directory, fn))
                    copied += 1
            if not copied:
                logging.warning("no tokenizer files found in %s", tokenizer_dir)
    return names
