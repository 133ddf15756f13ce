"""Qwen2-family architecture configs: the numbers a Hugging Face config.json holds, plus named presets.

`Qwen2Config` describes only the architecture (what a checkpoint must match). How the model runs (dtypes, remat,
attention kernel) lives in `kevin_jax.model.config.ModelOptions`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Architecture of a Qwen2 decoder (QwQ-32B and Qwen2.5 share it).

    Attributes:
        vocab_size: rows of the embedding table and of the LM head.
        hidden_size: width of the residual stream.
        intermediate_size: width of the SwiGLU MLP.
        num_hidden_layers: number of decoder layers.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (GQA: divides num_attention_heads).
        head_dim: per-head width (Qwen2: hidden_size // num_attention_heads).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base frequency.
        tie_word_embeddings: LM head shares the embedding matrix (0.5B/1.5B) or has its own (7B and up, QwQ).
        max_position_embeddings: longest context the checkpoint was trained for (informational; not enforced).
        bos_token_id, eos_token_id, pad_token_id: copied through to an exported config.json.
    """
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Qwen2Config.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    def replace(self, **changes) -> "Qwen2Config":
        return dataclasses.replace(self, **changes)

    # Parameter accounting (exact, matches the safetensors checkpoint tensor by tensor).
    def layer_param_count(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        attention = h * q + q + 2 * (h * kv + kv) + q * h      # q/k/v with bias, o without
        mlp = 3 * h * self.intermediate_size                   # gate, up, down
        norms = 2 * h
        return attention + mlp + norms

    def embedding_param_count(self) -> int:
        tables = 1 if self.tie_word_embeddings else 2
        return tables * self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        return self.num_hidden_layers * self.layer_param_count() + self.embedding_param_count() + self.hidden_size

    def matmul_param_count(self) -> int:
        """Parameters that take part in a matmul per token: every layer weight plus the LM head (the input embedding is
        a gather). This is the N of the 6N FLOPs-per-token rule."""
        return self.num_hidden_layers * self.layer_param_count() + self.vocab_size * self.hidden_size


def _qwen2(**kw) -> Qwen2Config:
    kw.setdefault("head_dim", kw["hidden_size"] // kw["num_attention_heads"])
    return Qwen2Config(**kw)


# Numbers from each model's config.json on the Hugging Face hub (base models; Instruct variants share the shapes).
NAMED_CONFIGS: dict[str, Qwen2Config] = {
    # QwQ-32B = Qwen2.5-32B shapes; its chat eos is <|im_end|>. 32,763,876,352 parameters, which is the checkpoint's
    # model.safetensors.index.json total_size (65,527,752,704 bytes) / 2 bytes per bf16 value.
    "qwq_32b": _qwen2(
        vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False,
        max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645),
    "qwen2.5_0.5b": _qwen2(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
        max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151643),
    "qwen2.5_1.5b": _qwen2(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
        max_position_embeddings=131072, bos_token_id=151643, eos_token_id=151643),
    "qwen2.5_7b": _qwen2(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
        max_position_embeddings=131072, bos_token_id=151643, eos_token_id=151643),
    "qwen2.5_14b": _qwen2(
        vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False,
        max_position_embeddings=131072, bos_token_id=151643, eos_token_id=151643),
    "qwen2.5_32b": _qwen2(
        vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False,
        max_position_embeddings=131072, bos_token_id=151643, eos_token_id=151643),
    # Tiny shapes for tests and CPU smoke runs (vocab 8192 = the built-in tokenizer's size).
    "tiny": _qwen2(
        vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
        max_position_embeddings=4096),
    "tiny_tied": _qwen2(
        vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
        max_position_embeddings=4096),
    # ~80M parameters: the CPU end-to-end and one-GPU smoke size.
    "small_80m": _qwen2(
        vocab_size=8192, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
        max_position_embeddings=32768),
}
# QwQ-32B's layers at an eighth of its depth (8 of 64 layers, 5.47B parameters): the full-size code paths (layer and
# vocabulary shapes, sharding, the offloaded optimiser state, checkpoints) where a node's disk or RAM cannot hold a
# full-depth checkpoint (runs/kevin32b.sh, the resume stage: the kill-and-resume check on 4 x H100).
NAMED_CONFIGS["qwq_32b_depth8"] = NAMED_CONFIGS["qwq_32b"].replace(num_hidden_layers=8)


def architecture_of(hf_checkpoint: str | None, shape: str) -> Qwen2Config:
    """The architecture a run's model section names: its HF checkpoint's config.json, else the named shape."""
    return from_hf_config(hf_checkpoint) if hf_checkpoint else named_config(shape)


def named_config(name: str) -> Qwen2Config:
    try:
        return NAMED_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known: {sorted(NAMED_CONFIGS)}") from None


# config.json keys that change the computation but that this implementation does not support.
_UNSUPPORTED_WHEN_TRUE = ("use_sliding_window",)


def from_hf_config(source: Mapping[str, Any] | str | os.PathLike) -> Qwen2Config:
    """Builds a Qwen2Config from a Hugging Face config (a dict, a config.json path, or a checkpoint directory)."""
    if isinstance(source, Mapping):
        hf, where = dict(source), "config dict"
    else:
        path = os.fspath(source)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"no HF config at {path}")
        with open(path) as f:
            hf, where = json.load(f), path
    model_type = hf.get("model_type", "qwen2")
    if model_type != "qwen2":
        raise ValueError(f"{where}: model_type={model_type!r}; only 'qwen2' (Qwen2/Qwen2.5/QwQ) is supported")
    architectures = hf.get("architectures") or ["Qwen2ForCausalLM"]
    if "Qwen2ForCausalLM" not in architectures:
        raise ValueError(f"{where}: architectures={architectures}; only Qwen2ForCausalLM (a causal LM's weights with "
                         f"its LM head) is supported")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act={act!r}; Qwen2 uses 'silu'")
    for key in _UNSUPPORTED_WHEN_TRUE:
        if hf.get(key):
            raise ValueError(f"{where}: {key}=true is not supported (full attention only)")
    rope_theta, rope_type = _rope_from_hf(hf, where)
    if rope_type != "default":
        raise ValueError(f"{where}: rope type {rope_type!r} is not supported (plain RoPE only; YaRN is for >32k)")
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if k not in hf]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")
    heads = hf["num_attention_heads"]
    return Qwen2Config(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"))


def _rope_from_hf(hf: Mapping[str, Any], where: str) -> tuple[float, str]:
    # transformers 5 writes rope_parameters={rope_theta, rope_type}; 4.x wrote rope_theta (+ rope_scaling).
    params = hf.get("rope_parameters")
    if isinstance(params, Mapping):
        if "rope_theta" not in params:
            raise ValueError(f"{where}: rope_parameters has no rope_theta")
        return params["rope_theta"], params.get("rope_type", params.get("type", "default"))
    scaling = hf.get("rope_scaling")
    rope_type = "default"
    if isinstance(scaling, Mapping):
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return hf.get("rope_theta", 10000.0), rope_type


def to_hf_config(config: Qwen2Config, torch_dtype: str = "bfloat16") -> dict[str, Any]:
    """A config.json dict that transformers (4.x and 5.x) and vLLM load as Qwen2ForCausalLM."""
    return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": config.rms_norm_eps,
            "rope_theta": config.rope_theta,
            "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
            "tie_word_embeddings": config.tie_word_embeddings,
            "max_position_embeddings": config.max_position_embeddings,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": config.num_hidden_layers,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "bos_token_id": config.bos_token_id,
            "eos_token_id": config.eos_token_id,
            "pad_token_id": config.pad_token_id,
            "torch_dtype": torch_dtype,      # transformers 4.x name
        "dtype": torch_dtype,            # transformers 5.x name
    }
