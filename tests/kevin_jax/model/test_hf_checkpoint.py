"""HF checkpoint import (sharded, slice by slice) and export: bit-identical round trip, clear errors."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from kevin_jax import parallel
from kevin_jax.model import hf, qwen2
from kevin_jax.model.shapes import from_hf_config
from kevin_jax.model.tokenizer import BUILTIN_DIR, load_tokenizer
from qwen2_hf_fixtures import hf_logits_and_hidden, save_random_hf_model

SHAPE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2)


def read_all(directory):
    """{name: (dtype, shape, bytes)} over every safetensors file of a checkpoint."""
    out = {}
    for fn in sorted(os.listdir(directory)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(directory, fn), framework="numpy") as f:
                for name in f.keys():
                    array = f.get_tensor(name)
                    out[name] = (str(array.dtype), array.shape, array.tobytes())
    return out


@pytest.fixture(scope="module")
def sharded_bf16_checkpoint(tmp_path_factory):
    """A random bf16 tiny model saved by transformers in several shard files (with an index)."""
    directory = str(tmp_path_factory.mktemp("hf_bf16"))
    save_random_hf_model(directory, seed=7, dtype="bfloat16", max_shard_size="20KB", **SHAPE)
    assert os.path.exists(os.path.join(directory, hf.INDEX_FILE))
    return directory


@pytest.mark.parametrize("param_dtype", ["bfloat16", "float32"])
def test_round_trip_is_bit_identical(sharded_bf16_checkpoint, tmp_path, param_dtype):
    model = hf.load_hf_checkpoint(sharded_bf16_checkpoint, qwen2.ModelOptions(param_dtype=param_dtype))
    leaves = jax.tree_util.tree_leaves(nnx.state(model))
    assert all(leaf.dtype == jnp.dtype(param_dtype) for leaf in leaves)
    out = str(tmp_path / "export")
    files = hf.save_hf_checkpoint(model, out, dtype="bfloat16", max_shard_bytes=30_000)
    assert len(files) > 1 and os.path.exists(os.path.join(out, hf.INDEX_FILE))
    original, exported = read_all(sharded_bf16_checkpoint), read_all(out)
    assert sorted(original) == sorted(exported)
    for name in original:
        assert original[name] == exported[name], f"{name} differs after the round trip"
    with open(os.path.join(out, hf.INDEX_FILE)) as f:
        index = json.load(f)
    assert set(index["weight_map"]) == set(original)
    assert index["metadata"]["total_size"] == sum(len(v[2]) for v in exported.values())
    assert from_hf_config(out) == from_hf_config(sharded_bf16_checkpoint)


def test_export_loads_in_transformers_with_same_logits(tmp_path):
    import transformers

    src = str(tmp_path / "src")
    hf_model = save_random_hf_model(src, seed=3, tie_word_embeddings=True, **SHAPE)
    model = hf.load_hf_checkpoint(src, qwen2.ModelOptions(dtype="float32", param_dtype="float32"))
    out = str(tmp_path / "out")
    hf.save_hf_checkpoint(model, out, dtype=None, tokenizer_dir=BUILTIN_DIR)
    assert load_tokenizer(out).vocab_size == load_tokenizer().vocab_size     # tokenizer files travel along
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], (2, 9)).astype(np.int32)
    a, _ = hf_logits_and_hidden(hf_model, tokens)
    b, _ = hf_logits_and_hidden(reloaded, tokens)
    np.testing.assert_array_equal(a, b)


def test_sharded_import_reads_only_each_devices_slice(sharded_bf16_checkpoint, monkeypatch):
    reads = []
    original_get = hf._Reader.get

    def recording_get(self, name, slices):
        array = original_get(self, name, slices)
        reads.append((name, array.size))
        return array

    monkeypatch.setattr(hf._Reader, "get", recording_get)
    mesh = parallel.make_mesh(parallel.ParallelConfig(data=1, fsdp=4, tensor=2))
    model = hf.load_hf_checkpoint(sharded_bf16_checkpoint, qwen2.ModelOptions(param_dtype="bfloat16"), mesh=mesh)
    embed = model.embed_tokens.embedding[...]
    assert embed.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    full = SHAPE["vocab_size"] * SHAPE["hidden_size"]
    embed_reads = [size for name, size in reads if name == "model.embed_tokens.weight"]
    assert len(embed_reads) == 8 and all(size == full // 8 for size in embed_reads)
    q_reads = [size for name, size in reads if name == "model.layers.0.self_attn.q_proj.weight"]
    assert q_reads and max(q_reads) == SHAPE["hidden_size"] ** 2 // 8
    # Same values as a single-device import.
    single = hf.load_hf_checkpoint(sharded_bf16_checkpoint, qwen2.ModelOptions(param_dtype="bfloat16"),
                                   mesh=parallel.make_mesh(parallel.ParallelConfig(), devices=jax.devices()[:1]))
    for a, b in zip(jax.tree_util.tree_leaves(nnx.state(model)), jax.tree_util.tree_leaves(nnx.state(single))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------------------------------------- bad input
@pytest.fixture()
def checkpoint_copy(sharded_bf16_checkpoint, tmp_path):
    directory = str(tmp_path / "copy")
    shutil.copytree(sharded_bf16_checkpoint, directory)
    return directory


def test_missing_shard_file_is_named(checkpoint_copy):
    with open(os.path.join(checkpoint_copy, hf.INDEX_FILE)) as f:
        victim = sorted(set(json.load(f)["weight_map"].values()))[1]
    os.remove(os.path.join(checkpoint_copy, victim))
    with pytest.raises(hf.CheckpointError, match=victim):
        hf.load_hf_checkpoint(checkpoint_copy)


def test_config_weight_mismatch_names_tensor_and_dims(checkpoint_copy):
    path = os.path.join(checkpoint_copy, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["intermediate_size"] = 48
    with open(path, "w") as f:
        json.dump(config, f)
    with pytest.raises(hf.CheckpointError, match=r"mlp\.\w+_proj\.weight.*\[.*64.*\].*\[.*48.*\]"):
        hf.load_hf_checkpoint(checkpoint_copy)


def _rewrite_file_of(directory, tensor, edit):
    with open(os.path.join(directory, hf.INDEX_FILE)) as f:
        index = json.load(f)
    filename = index["weight_map"][tensor]
    path = os.path.join(directory, filename)
    with safe_open(path, framework="numpy") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k in tensors or v != filename}
    index["weight_map"].update({k: filename for k in tensors})
    with open(os.path.join(directory, hf.INDEX_FILE), "w") as f:
        json.dump(index, f)


def test_missing_tensor_is_named(checkpoint_copy):
    name = "model.layers.2.self_attn.k_proj.bias"
    _rewrite_file_of(checkpoint_copy, name, lambda t: t.pop(name))
    with pytest.raises(hf.CheckpointError, match=r"lacks tensors.*layers\.2\.self_attn\.k_proj\.bias"):
        hf.load_hf_checkpoint(checkpoint_copy)


def test_unknown_tensor_is_named(checkpoint_copy):
    name = "model.layers.0.self_attn.q_proj.weight"
    _rewrite_file_of(checkpoint_copy, name, lambda t: t.update({"model.layers.0.self_attn.q_norm.weight":
                                                                  np.ones(8, np.float32)}))
    with pytest.raises(hf.CheckpointError, match="q_norm"):
        hf.load_hf_checkpoint(checkpoint_copy)


def test_missing_weights_and_directory(tmp_path):
    with pytest.raises(hf.CheckpointError, match="does not exist"):
        hf.load_hf_checkpoint(str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8,
                                                       "intermediate_size": 8, "num_hidden_layers": 1,
                                                       "num_attention_heads": 2}))
    with pytest.raises(hf.CheckpointError, match="neither model.safetensors nor"):
        hf.load_hf_checkpoint(str(tmp_path))


def test_unsupported_config_is_refused(tmp_path):
    base = {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2}
    with pytest.raises(ValueError, match="yarn"):
        from_hf_config({**base, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="model_type"):
        from_hf_config({**base, "model_type": "llama"})
    with pytest.raises(ValueError, match="use_sliding_window"):
        from_hf_config({**base, "use_sliding_window": True})
    assert from_hf_config({**base, "rope_theta": 5.0}).rope_theta == 5.0
    assert from_hf_config({**base, "rope_parameters": {"rope_theta": 7.0, "rope_type": "default"}}).rope_theta == 7.0
