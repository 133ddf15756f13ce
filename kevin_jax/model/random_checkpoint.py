"""A Hugging Face Qwen2 checkpoint directory with random weights, laid out as a user's download of the model is.

    python scripts/write_hf_checkpoint.py --shape qwq_32b --out /ckpt/qwq32b-random     # 65.5 GB, 14 shards
    python scripts/write_hf_checkpoint.py --like kevin32b --out /ckpt/kevin32b-random   # 131 GB float32, 29 shards

What a user brings with `--config.model.hf_checkpoint=<dir>`, minus the trained values: config.json,
generation_config.json, model-0000k-of-0000n.safetensors shards with model.safetensors.index.json, and the tokenizer
files. For qwq_32b the JSON files carry Qwen/QwQ-32B's published values and the shards follow transformers'
save_pretrained rule at its "5GB" limit (5 * 10^9 bytes; tensors in the model's state_dict order, a new file when the
next tensor would cross the limit), which gives QwQ-32B's 14 files and its index total_size of 65,527,752,704 bytes
(the real index was not available to compare file by file). Kevin-32B's public weights are the same architecture
saved in float32 (dtype="float32": QwQ-32B's config.json with torch_dtype float32, 131,055,505,408 bytes of tensors,
29 shards by the same rule; its own index was not available to compare either). Tokenizer: the real Qwen
vocabulary with QwQ-32B's chat template (kevin_jax.model.tokenizer.write_qwq_tokenizer), the built-in one, or none.

Fast and lean: the files are created at their final size with their safetensors headers, then worker processes fill
them with os.pwrite, in pieces of at most PIECE_VALUES values, each drawn from its own seed (seed, tensor, piece), so
that the bytes depend on the seed alone, not on the number of workers or the shard size; the model is never in
memory, each worker holds one piece (32 MB of bf16 and its 64 MB float32 draw). Values: uniform with
the standard deviation of transformers' init (0.02) for matrices and biases, 1 + that noise for norm scales, so that
a forward pass stays finite and sampling from it is diverse. Needs only numpy and ml_dtypes (no JAX, no torch).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import re
import shutil
import time
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from kevin_jax.model.shapes import Qwen2Config, named_config, to_hf_config

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# transformers' save_pretrained default, the limit QwQ-32B was saved with: "5GB" = 5 * 10^9 bytes.
HF_MAX_SHARD_BYTES = 5 * 10**9
PIECE_VALUES = 16 * 2**20
INIT_STD = 0.02                                   # transformers' initializer_range for Qwen2

_DTYPES = {"bfloat16": ("BF16", ml_dtypes.bfloat16), "float32": ("F32", np.float32)}

# Qwen/QwQ-32B's config.json and generation_config.json as published on the Hugging Face hub.
QWQ_32B_CONFIG_JSON = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 27648,
    "max_position_embeddings": 40960,
    "max_window_layers": 64,
    "model_type": "qwen2",
    "num_attention_heads": 40,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
QWQ_32B_GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "repetition_penalty": 1.0,
    "temperature": 0.6,
    "top_k": 40,
    "top_p": 0.95,
    "transformers_version": "4.43.1",
}
# Tokenizer choices: QwQ's real vocabulary and template, the built-in tokenizer, none.
TOKENIZERS = ("qwq", "builtin", "none")


def hf_tensor_shapes(config: Qwen2Config) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor of an HF Qwen2ForCausalLM checkpoint, in its state_dict order."""
    h, d, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    out = [("model.embed_tokens.weight", (config.vocab_size, h))]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.q_proj.bias", (q,)),
                (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, q)),
                (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                (p + "mlp.down_proj.weight", (h, inter)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out.append(("model.norm.weight", (h,)))
    if not config.tie_word_embeddings:
        out.append(("lm_head.weight", (config.vocab_size, h)))
    return out


def shard_plan(tensors: Sequence[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """transformers' split (huggingface_hub.split_torch_state_dict_into_shards) of (name, bytes) in state_dict order:
    a new shard when the next tensor would push the current one over the limit; a tensor bigger than the limit gets
    a shard of its own, placed before the shard being filled."""
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, nbytes in tensors:
        if nbytes > max_shard_bytes:
            shards.append([name])
            continue
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def shard_file_names(count: int) -> list[str]:
    return [SINGLE_FILE] if count == 1 else [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]


def parse_size(text: str) -> int:
    """'5GB' -> 5 * 10^9 (transformers' convention), '4GiB' -> 4 * 2^30, '300MB', '20KB', or plain bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"cannot read the size {text!r} (examples: 5GB, 4GiB, 300MB, 123456)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    scale = {"": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(number * scale)


def hf_config_json(shape: str | None, config: Qwen2Config, dtype: str) -> dict:
    if shape == "qwq_32b":             # QwQ-32B's own; in float32 what a fine-tune of it saved in float32 carries
        return dict(QWQ_32B_CONFIG_JSON, torch_dtype=dtype)
    return to_hf_config(config, torch_dtype=dtype)


def generation_config_json(shape: str | None, config: Qwen2Config) -> dict:
    if shape == "qwq_32b":
        return dict(QWQ_32B_GENERATION_CONFIG)
    out = {"do_sample": True}
    if config.bos_token_id is not None:
        out["bos_token_id"] = config.bos_token_id
    if config.eos_token_id is not None:
        out["eos_token_id"] = config.eos_token_id
    return out


@dataclasses.dataclass
class _Piece:
    """A contiguous run of one tensor's values: where it goes in which file, and the seed it is drawn from."""
    path: str
    offset: int                  # byte offset in the file
    count: int                   # values
    seed: tuple[int, ...]
    mean: float


def _fill(piece: _Piece, dtype: str) -> int:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(piece.seed)))
    half_width = INIT_STD * np.sqrt(3.0)             # uniform on [-w, w] has standard deviation w / sqrt(3)
    values = rng.random(piece.count, dtype=np.float32)
    values *= np.float32(2 * half_width)
    values += np.float32(piece.mean - half_width)
    data = values if dtype == "float32" else values.astype(_DTYPES[dtype][1])
    view = memoryview(data.view(np.uint8))
    fd = os.open(piece.path, os.O_WRONLY)
    try:
        done = 0
        while done < len(view):                      # pwrite may write less than asked (Linux: < 2 GB per call)
            done += os.pwrite(fd, view[done:], piece.offset + done)
    finally:
        os.close(fd)
    return len(view)


@dataclasses.dataclass
class WriteStats:
    """What write_random_checkpoint did: bytes of tensor data, files, workers, seconds until every byte was handed to
    the OS (`write_seconds`) and until it was on disk (`total_seconds`, after fsync)."""
    tensor_bytes: int
    files: int
    workers: int
    write_seconds: float
    total_seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.tensor_bytes / 1e6 / self.total_seconds if self.total_seconds else 0.0


def write_random_checkpoint(out: str | os.PathLike, config: Qwen2Config | str, *, seed: int = 0,
                            workers: int | None = None, max_shard_bytes: int = HF_MAX_SHARD_BYTES,
                            dtype: str = "bfloat16", tokenizer: str | None = None,
                            fsync: bool = True) -> WriteStats:
    """Writes the checkpoint directory `out` (which must not exist or be empty).

    Args:
      config: a named shape (shapes.NAMED_CONFIGS, e.g. "qwq_32b") or a Qwen2Config.
      seed: the same seed writes the same bytes, whatever `workers` and `max_shard_bytes`.
      workers: processes that generate and write (default: every CPU); 1 = in this process.
      max_shard_bytes: shard limit (transformers' rule; default its "5GB").
      dtype: "bfloat16" (as Qwen ships) or "float32".
      tokenizer: "qwq", "builtin" or "none"; default "qwq" when the vocabulary holds Qwen's 151,669 ids, else
        "builtin" when it holds the built-in tokenizer's, else "none".
      fsync: wait until the data is on disk (the timing then measures the disk, not the page cache).
    """
    shape = config if isinstance(config, str) else None
    config = named_config(config) if isinstance(config, str) else config
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    tokenizer = tokenizer or _default_tokenizer(config)
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be positive, got {workers}")
    out = os.fspath(out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise FileExistsError(f"{out} exists and is not an empty directory: choose a new --out")
    safetensors_dtype, numpy_dtype = _DTYPES[dtype]
    itemsize = np.dtype(numpy_dtype).itemsize
    tensors = hf_tensor_shapes(config)
    shapes = dict(tensors)
    position = {name: i for i, (name, _) in enumerate(tensors)}
    nbytes = {name: int(np.prod(s)) * itemsize for name, s in tensors}
    total = sum(nbytes.values())
    os.makedirs(out, exist_ok=True)
    free = shutil.disk_usage(out).free
    if free < total * 1.01:
        raise OSError(f"{out}: {free / 1e9:.1f} GB free on its disk, the checkpoint needs {total / 1e9:.1f} GB")

    start = time.perf_counter()
    groups = shard_plan([(name, nbytes[name]) for name, _ in tensors], max_shard_bytes)
    names = shard_file_names(len(groups))
    weight_map: dict[str, str] = {}
    pieces: list[_Piece] = []
    for filename, group in zip(names, groups):
        path = os.path.join(out, filename)
        # As safetensors lays a file out: tensors sorted by name, data back to back after the header.
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name in sorted(group):
            header[name] = {"dtype": safetensors_dtype, "shape": list(shapes[name]),
                            "data_offsets": [offset, offset + nbytes[name]]}
            offset += nbytes[name]
            weight_map[name] = filename
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)            # keeps the data 8-byte aligned, as safetensors does
        data_start = 8 + len(encoded)
        with open(path, "wb") as f:
            f.write(len(encoded).to_bytes(8, "little"))
            f.write(encoded)
            f.truncate(data_start + offset)
        for name in sorted(group):
            count = nbytes[name] // itemsize
            mean = 1.0 if name.endswith("norm.weight") else 0.0
            begin = data_start + header[name]["data_offsets"][0]
            for k, first in enumerate(range(0, count, PIECE_VALUES)):
                pieces.append(_Piece(path, begin + first * itemsize, min(PIECE_VALUES, count - first),
                                     (seed, position[name], k), mean))

    if workers == 1:
        written = sum(_fill(piece, dtype) for piece in pieces)
    else:
        context = multiprocessing.get_context("spawn")      # the caller may have threads (JAX); fork is unsafe
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            written = sum(pool.map(_fill, pieces, [dtype] * len(pieces), chunksize=4))
    if written != total:
        raise RuntimeError(f"wrote {written} bytes of tensor data, expected {total}")
    write_seconds = time.perf_counter() - start
    if fsync:
        with concurrent.futures.ThreadPoolExecutor(min(16, len(names))) as pool:
            list(pool.map(_fsync, [os.path.join(out, n) for n in names]))
    total_seconds = time.perf_counter() - start

    if len(names) > 1:
        with open(os.path.join(out, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config_json(shape, config, dtype), f, indent=2, sort_keys=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config_json(shape, config), f, indent=2, sort_keys=True)
    _write_tokenizer(out, tokenizer)
    return WriteStats(total, len(names), workers, write_seconds, total_seconds)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _default_tokenizer(config: Qwen2Config) -> str:
    from kevin_jax.model.tokenizer import QWQ_VOCAB_SIZE

    if config.vocab_size >= QWQ_VOCAB_SIZE:
        return "qwq"
    return "builtin" if config.vocab_size >= 8192 else "none"


def _write_tokenizer(out: str, tokenizer: str) -> None:
    from kevin_jax.model import tokenizer as tok

    if tokenizer == "qwq":
        tok.write_qwq_tokenizer(out)
    elif tokenizer == "builtin":
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            source = os.path.join(tok.BUILTIN_DIR, name)
            if os.path.exists(source):
                shutil.copyfile(source, os.path.join(out, name))
