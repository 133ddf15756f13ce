"""launch/eval.py --checkpoint=<a Hugging Face directory>: a checkpoint as a user brings it, in Kevin-32B's float32 file
layout (config.json, model.safetensors.index.json, model-0000k-of-0000n.safetensors shards of float32 tensors under
HF's names, an untied LM head as Qwen2-32B has) at a tiny Qwen2 shape. Loaded through the path launch/eval.py takes
(policy_source.hf_checkpoint_config, then the starting policy's HF import), its logits against the same weights
saved as bf16; a bad path, a missing or truncated shard, another architecture, a config that names another shape
are clear errors; and launch/eval.py end to end on two held-out tasks with compile-only verdicts, whose report
carries Kevin's best@k / avg@k."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kevin_jax import parallel
from kevin_jax.evaluation import pipeline, policy_source
from kevin_jax.evaluation.pipeline import EvalOptions
from kevin_jax.model import hf
from kevin_jax.model.random_checkpoint import hf_tensor_shapes, write_random_checkpoint
from kevin_jax.model.shapes import named_config
from kevin_jax.run_config import parse_config
from kevin_jax.tasks import TasksConfig, default_split, load_builtin_tasks

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))          # config files import configs.common, as under launch/eval.py
from configs import kevin32b, tiny_cpu  # noqa: E402

SHAPE = "tiny"                         # untied LM head, as Qwen2-32B (QwQ-32B, Kevin-32B)
ARCH = named_config(SHAPE)
F32_BYTES = 4 * sum(int(np.prod(s)) for _, s in hf_tensor_shapes(ARCH))
SHARD_BYTES = 200_000                  # several shards, as Kevin-32B's 29 of <= 5 GB
FILES = 4                              # transformers' split at that limit: a layer spans two files
HOLDOUT = default_split(load_builtin_tasks().tasks, TasksConfig().holdout_fraction, 0).holdout


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The same random values (seed 11) written as float32 (Kevin-32B's layout) and as bf16 (QwQ-32B's)."""
    root = tmp_path_factory.mktemp("hf")
    for dtype in ("float32", "bfloat16"):
        write_random_checkpoint(root / dtype, ARCH, seed=11, workers=1, max_shard_bytes=SHARD_BYTES, dtype=dtype,
                                tokenizer="builtin", fsync=False)
    return root / "float32", root / "bfloat16"


def test_the_float32_checkpoint_has_kevin32b_file_layout(checkpoints):
    f32, _ = checkpoints
    index = json.loads((f32 / hf.INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) == FILES and files == [f"model-{k:05d}-of-{len(files):05d}.safetensors"
                                         for k in range(1, len(files) + 1)]
    assert index["metadata"]["total_size"] == F32_BYTES
    assert set(index["weight_map"]) == {name for name, _ in hf_tensor_shapes(ARCH)}
    assert "lm_head.weight" in index["weight_map"] and "model.layers.1.self_attn.q_proj.bias" in index["weight_map"]
    for name in files:
        header, _ = hf.safetensors_header(str(f32 / name))
        assert {entry["dtype"] for entry in header.values()} == {"F32"}, name
    config = json.loads((f32 / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["torch_dtype"] == "float32"
    assert config["tie_word_embeddings"] is False
    info = hf.inspect_checkpoint(f32)
    assert (info.config, info.dtypes, info.files, info.tensor_bytes) == (ARCH, ("F32",), len(files), F32_BYTES)


def _load(directory, config):
    """The policy launch/eval.py samples from, built as it builds it."""
    config = policy_source.hf_checkpoint_config(config, directory)
    spec = parse_config(config)
    mesh = parallel.make_mesh(spec.mesh)
    return policy_source.starting_policy(spec, mesh, [], None), mesh


def _logits(model, mesh):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, ARCH.vocab_size, (2, 16)), jnp.int32)
    with parallel.activation_sharding(mesh):
        return np.asarray(nnx.jit(lambda m, t: m(t))(model, tokens), np.float32)


def test_float32_shards_load_cast_to_the_compute_dtype_as_the_bf16_shards_do(checkpoints):
    """configs/kevin32b.py (bf16 compute): float32 files are cast on the devices, tensor by tensor, to exactly the
    parameters the bf16 files of the same values give, so the logits are identical."""
    f32, bf16 = checkpoints
    (a, mesh), (b, _) = _load(f32, kevin32b.get_config()), _load(bf16, kevin32b.get_config())
    assert a.description == f"HF checkpoint {f32}" and a.step == 0 and a.split is None
    assert a.model.config == ARCH
    pa, pb = nnx.state(a.model, nnx.Param), nnx.state(b.model, nnx.Param)
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        assert x.dtype == y.dtype == jnp.bfloat16 and x.sharding == y.sharding
        np.testing.assert_array_equal(np.asarray(x.astype(jnp.float32)), np.asarray(y.astype(jnp.float32)))
    np.testing.assert_array_equal(_logits(a.model, mesh), _logits(b.model, mesh))


# Float32 weights against their bf16 rounding (relative error <= 2^-9 per value), float32 compute: the logits
# differ by 4.2e-3 of their largest magnitude here (0.0029 of 0.69); a tensor read with the wrong layout or dtype
# moves them by about their own magnitude.
LOGITS_TOLERANCE = 0.02


def test_float32_parameters_keep_the_files_values_and_match_the_bf16_logits(checkpoints):
    """configs/tiny_cpu.py (float32 compute): the float32 files' exact values, and logits within LOGITS_TOLERANCE
    (of their largest magnitude) of the bf16 checkpoint's."""
    from safetensors.numpy import load_file

    f32, bf16 = checkpoints
    (a, mesh), (b, _) = _load(f32, tiny_cpu.get_config()), _load(bf16, tiny_cpu.get_config())
    index = json.loads((f32 / hf.INDEX_FILE).read_text())["weight_map"]
    exported = {name: thunk() for name, thunk, _, _ in hf.iter_hf_tensors(a.model)}
    for filename in sorted(set(index.values())):
        for name, value in load_file(str(f32 / filename)).items():
            assert exported[name].dtype == np.float32, name
            np.testing.assert_array_equal(exported[name], value, err_msg=name)
    la, lb = _logits(a.model, mesh), _logits(b.model, mesh)
    scale = np.abs(la).max()
    assert np.isfinite(la).all() and scale > 0.1
    assert np.abs(la - lb).max() <= LOGITS_TOLERANCE * scale, (np.abs(la - lb).max(), scale)
    assert np.abs(la - lb).max() > 0            # the bf16 rounding is there: the two loads differ


# ------------------------------------------------------------------------------------------------ bad input
def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _error(config, directory, tmp_path):
    """What launch/eval.py reports (it exits 2 with the message for ValueError and FileNotFoundError)."""
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        pipeline.run(config, EvalOptions(out_dir=str(tmp_path / "out"), checkpoint=str(directory)))
    return str(e.value)


def test_bad_checkpoints_are_clear_errors_before_any_device_work(checkpoints, tmp_path):
    f32, _ = checkpoints
    config = tiny_cpu.get_config()
    assert "checkpoint directory not found" in _error(config, tmp_path / "nope", tmp_path)

    missing = _copy(f32, tmp_path / "missing")
    (missing / "model-00002-of-00004.safetensors").unlink()
    assert ("shard file(s) listed in model.safetensors.index.json are missing: model-00002-of-00004.safetensors"
            in _error(config, missing, tmp_path))

    truncated = _copy(f32, tmp_path / "truncated")
    shard = truncated / "model-00003-of-00004.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])        # an interrupted download
    assert "model-00003-of-00004.safetensors: not a valid safetensors file" in _error(config, truncated, tmp_path)

    llama = _copy(f32, tmp_path / "llama")
    hf_config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**hf_config, "model_type": "llama"}))
    assert "model_type='llama'; only 'qwen2'" in _error(config, llama, tmp_path)
    (llama / "config.json").write_text(json.dumps({**hf_config, "architectures": ["Qwen2ForSequenceClassification"]}))
    assert "only Qwen2ForCausalLM" in _error(config, llama, tmp_path)

    no_config = _copy(f32, tmp_path / "no_config")
    (no_config / "config.json").unlink()
    assert "has no config.json" in _error(config, no_config, tmp_path)

    no_weights = tmp_path / "no_weights"                     # config.json alone (e.g. pytorch_model.bin only)
    no_weights.mkdir()
    shutil.copy(f32 / "config.json", no_weights / "config.json")
    assert "neither model.safetensors nor model.safetensors.index.json found" in _error(config, no_weights, tmp_path)

    other_shape = _copy(f32, tmp_path / "other_shape")       # config.json says 3 layers, the shards hold 2
    (other_shape / "config.json").write_text(json.dumps({**hf_config, "num_hidden_layers": 3}))
    assert "lacks tensors the config needs: model.layers.2." in _error(config, other_shape, tmp_path)


def test_what_counts_as_an_hf_checkpoint_directory(checkpoints, tmp_path):
    f32, _ = checkpoints
    assert hf.is_checkpoint_dir(f32) and not hf.is_checkpoint_dir(tmp_path / "nope")
    workdir = tmp_path / "run"                               # a training workdir: its config.json is the run config
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(tiny_cpu.get_config().to_dict()))
    assert not hf.is_checkpoint_dir(workdir)


def test_a_config_that_names_another_architecture_is_refused_with_the_differences(checkpoints, tmp_path):
    f32, _ = checkpoints
    config = tiny_cpu.get_config()
    config.model.shape = "tiny_tied"
    text = _error(config, f32, tmp_path)
    assert "is not the architecture the config names (model.shape='tiny_tied')" in text
    assert "num_key_value_heads: config 1, checkpoint 2" in text
    assert "tie_word_embeddings: config True, checkpoint False" in text and "--config.model.shape=" in text
    # configs/kevin32b.py names no architecture: the checkpoint's config.json is taken, the tokenizer its own
    taken = policy_source.hf_checkpoint_config(kevin32b.get_config(), f32)
    spec = parse_config(taken)
    assert (spec.model.hf_checkpoint, spec.model.shape, spec.tokenizer_dir) == (str(f32), "", str(f32))
    assert spec.model_options.param_dtype == "bfloat16" and spec.warm_start.steps == 0


# ------------------------------------------------------------------------------------------------ the real thing
@pytest.mark.slow
def test_launch_eval_on_a_float32_hf_checkpoint_reports_kevins_metrics(checkpoints, tmp_path):
    """launch/eval.py as a user runs it on the held-out tasks: the float32 directory streamed onto the 8-device mesh,
    the JAX sampler, cuda_eval compile-only (tiny_cpu's warm start is not applied to a checkpoint evaluated as is)."""
    f32, _ = checkpoints
    out = tmp_path / "eval"
    cmd = [sys.executable, str(REPO / "launch" / "eval.py"), f"--config={REPO / 'configs' / 'tiny_cpu.py'}",
           f"--checkpoint={f32}", f"--out={out}", "--trajectories=2", "--turns=2",
           "--config.env.max_response_tokens=16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warm start (160 steps) is not applied" in done.stderr and f"{FILES} shard file(s)" in done.stderr
    saved = json.loads((out / "metrics.json").read_text())
    m, meta = saved["metrics"], saved["meta"]
    assert meta["source"] == f"HF checkpoint {f32}" and meta["tasks"] == list(HOLDOUT)
    assert "holdout of the config's default split" in meta["split"]
    assert (m["num_tasks"], m["trajectories_per_task"], m["turns"], m["ks"]) == (2, 2, 2, [1, 2])
    assert m["mode"] == "compile_only" and m["metric_correct"] == "compiled"
    summary = m["summary"]["compiled"]
    assert set(summary) >= {"best@1", "best@2", "avg"} and all(0.0 <= v <= 1.0 for v in summary.values())
    assert [row["turns"] for row in m["by_turn"]] == [1, 2]
    table = (out / "table.txt").read_text()
    assert table.startswith(f"HF checkpoint {f32}") and "best@2" in table
    # a bad checkpoint stops launch/eval.py with exit status 2 and the reason
    bad = subprocess.run(cmd[:3] + [f"--checkpoint={tmp_path / 'nope'}", f"--out={out}"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and "checkpoint directory not found" in bad.stderr
