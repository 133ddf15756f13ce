"""scripts/write_hf_checkpoint.py and kevin_jax.model.random_checkpoint: QwQ-32B's files and shard layout (checked
against transformers' and huggingface_hub's own, on meta tensors), valid safetensors that transformers loads, the same
bytes whatever the number of workers and shard size, sane values, clear errors."""
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from kevin_jax.model import random_checkpoint as rc
from kevin_jax.model.shapes import from_hf_config, named_config
from kevin_jax.model.tokenizer import QWQ_VOCAB_SIZE, load_tokenizer

REPO = Path(__file__).resolve().parents[3]


def _meta_state_dict(config_json):
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config_json)).to(torch.bfloat16)
    return model.state_dict()


def test_qwq_32b_names_shapes_and_shards_match_transformers():
    """The layout transformers gives QwQ-32B's config.json when it saves at its "5GB" default: 771 tensors in 14
    files, index total_size 65,527,752,704 bytes (QwQ-32B's published figures)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    config = named_config("qwq_32b")
    assert from_hf_config(rc.QWQ_32B_CONFIG_JSON) == config
    state_dict = _meta_state_dict(rc.QWQ_32B_CONFIG_JSON)
    ours = rc.hf_tensor_shapes(config)
    assert [name for name, _ in ours] == list(state_dict) and len(ours) == 771
    assert all(tuple(state_dict[name].shape) == shape for name, shape in ours)
    split = split_torch_state_dict_into_shards(state_dict, max_shard_size="5GB")
    groups = rc.shard_plan([(name, 2 * int(np.prod(shape))) for name, shape in ours], rc.HF_MAX_SHARD_BYTES)
    names = rc.shard_file_names(len(groups))
    assert names[0] == "model-00001-of-00014.safetensors" and len(names) == 14
    assert {n: f for f, group in zip(names, groups) for n in group} == split.tensor_to_filename
    assert split.metadata["total_size"] == 65_527_752_704 == 2 * config.param_count()


def test_kevin_32b_float32_layout_matches_transformers():
    """Kevin-32B's public weights: QwQ-32B's architecture saved in float32 at the same "5GB" limit: 29 files,
    131,055,505,408 bytes, as transformers splits a float32 state_dict."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards

    config = named_config("qwq_32b")
    state_dict = _meta_state_dict(rc.QWQ_32B_CONFIG_JSON)
    state_dict = {name: t.to(torch.float32) for name, t in state_dict.items()}
    ours = rc.hf_tensor_shapes(config)
    split = split_torch_state_dict_into_shards(state_dict, max_shard_size="5GB")
    groups = rc.shard_plan([(name, 4 * int(np.prod(shape))) for name, shape in ours], rc.HF_MAX_SHARD_BYTES)
    names = rc.shard_file_names(len(groups))
    assert len(names) == 29 and names[-1] == "model-00029-of-00029.safetensors"
    assert {n: f for f, group in zip(names, groups) for n in group} == split.tensor_to_filename
    assert split.metadata["total_size"] == 131_055_505_408 == 4 * config.param_count()


def test_shard_plan_is_huggingface_hubs():
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards

    sizes = [("a", 3), ("b", 3), ("c", 10), ("d", 1), ("e", 6), ("f", 2)]
    split = split_torch_state_dict_into_shards({n: torch.zeros(k, dtype=torch.uint8) for n, k in sizes},
                                               max_shard_size=6, filename_pattern="model{suffix}.safetensors")
    groups = rc.shard_plan(sizes, 6)
    assert groups == [["c"], ["a", "b"], ["d"], ["e"], ["f"]]
    assert [sorted(t) for t in split.filename_to_tensors.values()] == groups
    assert rc.parse_size("5GB") == 5 * 10**9 and rc.parse_size("4GiB") == 4 * 2**30 and rc.parse_size("300") == 300
    with pytest.raises(ValueError, match="cannot read the size"):
        rc.parse_size("five gigs")
    with pytest.raises(ValueError, match="positive"):
        rc.shard_plan([("a", 1)], 0)


def _tensors(directory):
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        with safe_open(path, framework="numpy") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "ckpt"
    stats = rc.write_random_checkpoint(out, "tiny", seed=5, workers=1, max_shard_bytes=600_000, fsync=False)
    return out, stats


def test_tiny_checkpoint_is_what_transformers_and_kevin_jax_read(tiny):
    import torch
    import transformers

    out, stats = tiny
    config = named_config("tiny")
    assert from_hf_config(out) == config
    index = json.loads((out / rc.INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == stats.tensor_bytes == 2 * config.param_count()
    groups = rc.shard_plan([(n, 2 * int(np.prod(s))) for n, s in rc.hf_tensor_shapes(config)], 600_000)
    assert stats.files == len(groups) > 1
    assert sorted(set(index["weight_map"].values())) == rc.shard_file_names(stats.files)
    for filename in set(index["weight_map"].values()):           # as safetensors writes them: sorted, back to back
        with safe_open(out / filename, framework="numpy") as f:
            assert set(f.keys()) == {n for n, fn in index["weight_map"].items() if fn == filename}
            assert f.metadata() == {"format": "pt"}
    tensors = _tensors(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.float().numpy(), tensors[name].astype(np.float32), err_msg=name)
    values = {n: t.astype(np.float32).ravel() for n, t in tensors.items()}
    matrices = np.concatenate([v for n, v in values.items() if not n.endswith("norm.weight")])
    norms = np.concatenate([v for n, v in values.items() if n.endswith("norm.weight")])
    assert abs(matrices.std() - rc.INIT_STD) < 0.001 and abs(matrices.mean()) < 0.001
    assert abs(norms.mean() - 1.0) < 0.005 and norms.std() < 0.03
    assert json.loads((out / "generation_config.json").read_text()).get("eos_token_id") == config.eos_token_id
    assert load_tokenizer(out).vocab_size == 8192                  # the built-in tokenizer fits the tiny vocabulary


def test_same_bytes_whatever_workers_and_shards(tiny, tmp_path):
    out, _ = tiny
    other = tmp_path / "other"
    stats = rc.write_random_checkpoint(other, "tiny", seed=5, workers=2, max_shard_bytes=5 * 10**9, fsync=True,
                                       tokenizer="none")
    assert stats.files == 1 and stats.workers == 2 and os.path.exists(other / rc.SINGLE_FILE)
    assert not os.path.exists(other / rc.INDEX_FILE) and not os.path.exists(other / "tokenizer.json")
    a, b = _tensors(out), _tensors(other)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    reseeded = rc.write_random_checkpoint(tmp_path / "seed6", "tiny", seed=6, workers=1, tokenizer="none", fsync=False)
    assert reseeded.tensor_bytes == stats.tensor_bytes
    assert not np.array_equal(_tensors(tmp_path / "seed6")["lm_head.weight"], a["lm_head.weight"])


def test_qwq_files_for_the_qwq_shape(tmp_path, monkeypatch):
    """qwq_32b gets QwQ-32B's config.json, generation_config.json and tokenizer. The tensors written here are those of
    a narrow one-layer model with QwQ's vocabulary (named_config patched), 5 MB instead of 65 GB."""
    small = named_config("qwq_32b").replace(num_hidden_layers=1, hidden_size=8, intermediate_size=16,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    monkeypatch.setattr(rc, "named_config", lambda name: small)
    stats = rc.write_random_checkpoint(tmp_path / "q", "qwq_32b", workers=1, max_shard_bytes=3 * 10**6, fsync=False)
    config_json = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config_json == rc.QWQ_32B_CONFIG_JSON
    assert json.loads((tmp_path / "q" / "generation_config.json").read_text()) == rc.QWQ_32B_GENERATION_CONFIG
    assert stats.tensor_bytes == 2 * small.param_count() and stats.files == 2
    tok = load_tokenizer(tmp_path / "q")
    assert tok.vocab_size == QWQ_VOCAB_SIZE and tok.special.think == 151667
    assert tok.render_chat([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n<think>\n")


def test_kevin_32b_files_are_float32_with_qwq_config(tmp_path, monkeypatch):
    """--like kevin32b: the qwq_32b shape's files in float32, its config.json QwQ-32B's with torch_dtype float32."""
    small = named_config("qwq_32b").replace(num_hidden_layers=1, hidden_size=8, intermediate_size=16,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    monkeypatch.setattr(rc, "named_config", lambda name: small)
    stats = rc.write_random_checkpoint(tmp_path / "k", "qwq_32b", workers=1, max_shard_bytes=3 * 10**6,
                                       dtype="float32", fsync=False)
    assert json.loads((tmp_path / "k" / "config.json").read_text()) == {**rc.QWQ_32B_CONFIG_JSON,
                                                                       "torch_dtype": "float32"}
    assert stats.tensor_bytes == 4 * small.param_count() and stats.files == 3
    index = json.loads((tmp_path / "k" / "model.safetensors.index.json").read_text())
    for name in set(index["weight_map"].values()):
        with open(tmp_path / "k" / name, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F32"}


def test_bad_requests_are_refused(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        rc.write_random_checkpoint(tmp_path / "full", "tiny", workers=1)
    with pytest.raises(ValueError, match="unknown model shape"):
        rc.write_random_checkpoint(tmp_path / "a", "qwq_33b", workers=1)
    with pytest.raises(ValueError, match="dtype"):
        rc.write_random_checkpoint(tmp_path / "b", "tiny", dtype="int8", workers=1)
    with pytest.raises(ValueError, match="tokenizer"):
        rc.write_random_checkpoint(tmp_path / "c", "tiny", tokenizer="llama", workers=1)


def test_script_prints_its_table_and_fails_clearly(tmp_path):
    script = str(REPO / "scripts" / "write_hf_checkpoint.py")
    ok = subprocess.run([sys.executable, script, "--shape", "tiny", "--out", str(tmp_path / "t"), "--workers", "1",
                         "--max-shard-size", "300KB"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    row = json.loads(ok.stdout.strip().splitlines()[-1])
    sizes = [(n, 2 * int(np.prod(s))) for n, s in rc.hf_tensor_shapes(named_config("tiny"))]
    assert row["files"] == len(rc.shard_plan(sizes, 300_000)) > 1
    assert row["GB"] == round(2 * named_config("tiny").param_count() / 1e9, 3)
    assert "| shape | out | files | GB |" in ok.stdout
    again = subprocess.run([sys.executable, script, "--shape", "tiny", "--out", str(tmp_path / "t")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "not an empty directory" in again.stderr
    for args, message in ((["--like", "kevin32b", "--dtype", "bfloat16"], "--like kevin32b is float32"),
                          (["--like", "kevin32b", "--shape", "tiny"], "give one of --shape and --like"),
                          ([], "give one of --shape and --like")):
        bad = subprocess.run([sys.executable, script, *args, "--out", str(tmp_path / "u")], capture_output=True,
                             text=True, timeout=300)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)
