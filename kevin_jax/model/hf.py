"""Hugging Face checkpoints <-> sharded kevin_jax parameters, one slice at a time.

Import: every parameter is built with jax.make_array_from_callback; the callback of each device reads only that
device's slice of the tensor from the safetensors file (safe_open(...).get_slice), converting layout on the way
(HF's [out, in] matrices become [in, heads, head_dim] einsum kernels; per-layer tensors are stacked into the scanned
[num_layers, ...] layout slice by slice). No host or device ever holds the full model.

Export: parameters are gathered one tensor (one layer's slice of a stacked parameter) at a time and written to
safetensors files of at most `max_shard_bytes`, with model.safetensors.index.json, config.json and tokenizer files,
so that transformers or vLLM can serve the result. Only process 0 writes; every process takes part in the gathers.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
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


def read_slice(kind: str, get: Callable[[tuple[slice, ...]], np.ndarray], ours: Sequence[int],
               bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    """Our-layout slice `bounds` ((start, stop) per our dim) of one per-layer tensor, reading only what it needs
    from HF's layout through `get(hf_slices)`."""
    if kind == "same":
        return get(tuple(slice(a, b) for a, b in bounds))
    if kind == "transpose":
        (a0, a1), (b0, b1) = bounds
        return get((slice(b0, b1), slice(a0, a1))).T
    if kind == "heads_in":
        (h0, h1), (n0, n1), (d0, d1) = bounds
        d = ours[2]
        block = get((slice(n0 * d, n1 * d), slice(h0, h1))).reshape(n1 - n0, d, h1 - h0)
        return block[:, d0:d1, :].transpose(2, 0, 1)
    if kind == "heads_bias":
        (n0, n1), (d0, d1) = bounds
        d = ours[1]
        return get((slice(n0 * d, n1 * d),)).reshape(n1 - n0, d)[:, d0:d1]
    if kind == "heads_out":
        (n0, n1), (d0, d1), (h0, h1) = bounds
        d = ours[1]
        block = get((slice(h0, h1), slice(n0 * d, n1 * d))).reshape(h1 - h0, n1 - n0, d)
        return block[:, :, d0:d1].transpose(1, 2, 0)
    raise ValueError(kind)


# ----------------------------------------------------------------------------------------------- reading
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
        with safe_open(single_path, framework="numpy") as f:
            return {name: SINGLE_FILE for name in f.keys()}
    raise CheckpointError(f"checkpoint {directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


class _Reader:
    """Open safetensors files (lazily), slice reads with dtype conversion."""

    def __init__(self, directory: str, weight_map: dict[str, str]):
        self.directory = directory
        self.weight_map = weight_map
        self._files: dict[str, Any] = {}

    def _file(self, name: str):
        filename = self.weight_map[name]
        if filename not in self._files:
            self._files[filename] = safe_open(os.path.join(self.directory, filename), framework="numpy")
        return self._files[filename]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._file(name).get_slice(name).get_dtype()

    def get(self, name: str, slices: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(self._file(name).get_slice(name)[slices])

    def close(self):
        self._files.clear()


def _bounds(index: tuple[slice, ...], shape: Sequence[int]) -> list[tuple[int, int]]:
    out = []
    for s, dim in zip(index, shape):
        start, stop, step = s.indices(dim)
        if step != 1:
            raise ValueError(f"strided shard index {s} is not supported")
        out.append((start, stop))
    return out


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


def _state_shapes(state) -> dict[tuple[str, ...], tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {qwen2.param_path(path): tuple(leaf.shape) for path, leaf in leaves}


def load_hf_checkpoint(directory: str | os.PathLike, options: qwen2.ModelOptions = qwen2.ModelOptions(), *,
                       mesh: jax.sharding.Mesh | None = None, rules=parallel.DEFAULT_RULES,
                       config: Qwen2Config | None = None) -> qwen2.Qwen2ForCausalLM:
    """Loads an HF Qwen2 checkpoint directory into a model whose parameters are sharded over `mesh`.

    Args:
      directory: holds config.json and model.safetensors or model.safetensors.index.json + shards.
      options: run options; parameters are converted to options.param_dtype.
      mesh: device mesh (default: every device on the fsdp axis).
      rules: logical-axis partition rules.
      config: architecture to expect (default: read config.json).
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
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
        maps = {(("layers",) + m.path if m.per_layer else m.path): m for m in tensor_maps(config)}
        target = _NUMPY_DTYPES[options.param_dtype]

        def build(path, leaf, sharding):
            key = qwen2.param_path(path)
            if key not in maps:
                raise CheckpointError(f"model parameter {'/'.join(key)} has no HF tensor mapping")
            m = maps[key]
            shape = tuple(leaf.shape)

            def callback(index):
                bounds = _bounds(index, shape)
                if not m.per_layer:
                    get = lambda s: reader.get(m.hf_name, s)
                    return np.ascontiguousarray(read_slice(m.kind, get, shape, bounds).astype(target))
                (l0, l1), rest = bounds[0], bounds[1:]
                parts = []
                for layer in range(l0, l1):
                    name = m.hf_name.format(i=layer)
                    parts.append(read_slice(m.kind, lambda s, n=name: reader.get(n, s), shape[1:], rest).astype(target))
                return np.ascontiguousarray(np.stack(parts))

            return jax.make_array_from_callback(shape, sharding, callback)

        state = jax.tree_util.tree_map_with_path(build, abstract_state, shardings)
        return nnx.merge(graphdef, state)
    finally:
        reader.close()


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
