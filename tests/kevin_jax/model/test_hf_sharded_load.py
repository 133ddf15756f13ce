"""The HF import as a user's checkpoint reaches it (--config.model.hf_checkpoint): a directory written by
scripts/write_hf_checkpoint.py, streamed onto a 4-device FSDP mesh (the trainer's layout), every parameter in its
shards, every value bit-exact against transformers' own load of the same files, and the host memory the import holds
bounded by its budget, far below the model (a loader that materialised the model, or one parameter of every layer at
once, fails here)."""
import contextlib
import os
import subprocess
import sys
import tracemalloc

import jax
import numpy as np
import pytest
from flax import nnx

from configs import kevin32b

from kevin_jax import parallel, policy_init
from kevin_jax.model import hf, qwen2
from kevin_jax.model.random_checkpoint import hf_tensor_shapes, write_random_checkpoint
from kevin_jax.model.shapes import Qwen2Config
from kevin_jax.run_config import parse_config

# Many layers of small tensors: the model (24 MB of bf16) is 47 times its largest tensor (512 KB).
CONFIG = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=1024, num_hidden_layers=12,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
                     max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
MODEL_BYTES = 2 * sum(int(np.prod(s)) for _, s in hf_tensor_shapes(CONFIG))
LARGEST_BYTES = 2 * max(int(np.prod(s)) for _, s in hf_tensor_shapes(CONFIG))
BOOKKEEPING_BYTES = 2**20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("random_ckpt") / "ckpt"
    stats = write_random_checkpoint(directory, CONFIG, seed=3, workers=1, max_shard_bytes=5_000_000,
                                    tokenizer="none", fsync=False)
    assert stats.files == 5 and stats.tensor_bytes == MODEL_BYTES
    return str(directory)


@pytest.fixture(scope="module")
def mesh4():
    return parallel.make_mesh(parallel.ParallelConfig(), devices=jax.devices()[:4])    # fsdp = 4, as on 4 GPUs


@pytest.fixture(scope="module")
def transformers_tensors(checkpoint):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    return {name: t.float().numpy() for name, t in model.state_dict().items()}


@pytest.mark.parametrize("param_dtype", ["bfloat16", "float32"])
def test_sharded_placement_and_exact_values(checkpoint, mesh4, transformers_tensors, param_dtype):
    graphdef, state, stats = hf.load_hf_params(checkpoint, qwen2.ModelOptions(param_dtype=param_dtype), mesh=mesh4)
    assert stats.tensors == len(transformers_tensors) and stats.bytes_read == MODEL_BYTES
    expected = qwen2.param_shardings(state, mesh4)
    for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(state)[0],
                                      jax.tree_util.tree_leaves(expected)):
        name = "/".join(qwen2.param_path(path))
        assert leaf.dtype == np.dtype(param_dtype), name
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), name
        assert {d.id for d in leaf.sharding.device_set} == {d.id for d in mesh4.devices.flat}, name
        spec = tuple(sharding.spec)
        if "fsdp" in spec:                     # every matrix: each device holds a quarter of the hidden dim
            dim = spec.index("fsdp")
            assert all(s.data.shape[dim] * 4 == leaf.shape[dim] for s in leaf.addressable_shards), name
            assert len({str(s.index) for s in leaf.addressable_shards}) == 4, name
    model = nnx.merge(graphdef, state)
    seen = set()
    for name, thunk, _, _ in hf.iter_hf_tensors(model):
        np.testing.assert_array_equal(thunk().astype(np.float32), transformers_tensors[name], err_msg=name)
        seen.add(name)
    assert seen == set(transformers_tensors)


@contextlib.contextmanager
def cpu_hogs(count: int):
    """`count` processes spinning on the CPU while the block runs: a busy machine, where the loader's asynchronous
    placing steps lag behind its reads (a bound that counted a tensor only until its step was dispatched failed on a
    2-core machine running other work: 3.24 MB traced against 2.5)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_host_memory_stays_bounded(checkpoint, mesh4):
    options = qwen2.ModelOptions(param_dtype="bfloat16")
    budget = 3 * LARGEST_BYTES
    hf.load_hf_params(checkpoint, options, mesh=mesh4, max_host_bytes=budget)     # compiles outside the measurement
    with cpu_hogs(2 * (os.cpu_count() or 1)):
        tracemalloc.start()
        try:
            _, state, stats = hf.load_hf_params(checkpoint, options, mesh=mesh4, max_host_bytes=budget,
                                                read_threads=4)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert stats.largest_tensor_bytes == LARGEST_BYTES
    assert LARGEST_BYTES <= stats.peak_host_bytes <= budget
    # tracemalloc sees every numpy allocation (the slices read; device buffers are XLA's) and the Python objects of
    # the import itself (~0.6 MB here). One MLP parameter gathered over its 12 layers would be 6 MB, the model 24 MB.
    assert peak < budget + BOOKKEEPING_BYTES < MODEL_BYTES / 8, (peak, budget, MODEL_BYTES)
    assert sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state)) == MODEL_BYTES


@pytest.fixture(scope="module")
def checkpoint_f32(tmp_path_factory):
    """The same shape in Kevin-32B's file layout: float32 tensors (twice the bytes of each), several shards."""
    directory = tmp_path_factory.mktemp("random_ckpt_f32") / "ckpt"
    stats = write_random_checkpoint(directory, CONFIG, seed=3, workers=1, max_shard_bytes=10_000_000,
                                    dtype="float32", tokenizer="none", fsync=False)
    assert stats.files == 5 and stats.tensor_bytes == 2 * MODEL_BYTES
    return str(directory)


def test_host_memory_stays_bounded_reading_float32_shards(checkpoint_f32, mesh4):
    """Float32 files cast to bf16 parameters: the host holds the files' float32 slices (the cast runs on the
    devices), counted against the budget at their file size, under load as above."""
    options = qwen2.ModelOptions(param_dtype="bfloat16")
    largest = 2 * LARGEST_BYTES
    budget = 3 * largest
    hf.load_hf_params(checkpoint_f32, options, mesh=mesh4, max_host_bytes=budget)     # compiles outside
    with cpu_hogs(2 * (os.cpu_count() or 1)):
        tracemalloc.start()
        try:
            _, state, stats = hf.load_hf_params(checkpoint_f32, options, mesh=mesh4, max_host_bytes=budget,
                                                read_threads=4)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert stats.largest_tensor_bytes == largest and stats.bytes_read == 2 * MODEL_BYTES
    assert largest <= stats.peak_host_bytes <= budget
    # the float32 model is 48 MB; one MLP parameter of every layer 12 MB
    assert peak < budget + BOOKKEEPING_BYTES < 2 * MODEL_BYTES / 8, (peak, budget, MODEL_BYTES)
    assert all(leaf.dtype == np.dtype("bfloat16") for leaf in jax.tree_util.tree_leaves(state))
    assert sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(state)) == MODEL_BYTES


def test_the_memory_measurement_sees_a_whole_model(checkpoint):
    """The bound above can fail: reading every tensor before placing any (what a naive loader does) shows up."""
    from safetensors.numpy import load_file
    import glob

    tracemalloc.start()
    try:
        tensors = {}
        for path in sorted(glob.glob(f"{checkpoint}/*.safetensors")):
            tensors.update(load_file(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak >= MODEL_BYTES > 3 * LARGEST_BYTES + BOOKKEEPING_BYTES


def test_budget_below_one_tensor_still_loads_one_at_a_time(checkpoint, mesh4):
    _, _, stats = hf.load_hf_params(checkpoint, qwen2.ModelOptions(param_dtype="bfloat16"), mesh=mesh4,
                                    max_host_bytes=1, read_threads=2)
    assert stats.peak_host_bytes == LARGEST_BYTES
    with pytest.raises(ValueError, match="must be positive"):
        hf.load_hf_params(checkpoint, mesh=mesh4, max_host_bytes=0)


def test_trainer_path_loads_the_directory(checkpoint, mesh4):
    """--config.model.hf_checkpoint=<dir> --config.model.shape= : policy_init builds the step-0 policy from it."""
    config = kevin32b.get_config()
    config.model.hf_checkpoint = checkpoint
    spec = parse_config(config)
    assert policy_init.architecture(spec) == CONFIG
    graphdef, params = policy_init.initial_params(spec, mesh4)
    _, direct, _ = hf.load_hf_params(checkpoint, spec.model_options, mesh=mesh4)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(direct)):
        assert a.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.gpu
def test_import_onto_every_gpu_is_exact(checkpoint, transformers_tensors):
    """The same import onto the real GPUs (FSDP over all of them, as the trainer's mesh): transfers from the reader
    threads, the on-device layout change and the in-place layer writes, bit-exact."""
    gpus = jax.devices("gpu")
    mesh = parallel.make_mesh(parallel.ParallelConfig(), devices=gpus)
    graphdef, state, stats = hf.load_hf_params(checkpoint, qwen2.ModelOptions(param_dtype="bfloat16"), mesh=mesh)
    assert stats.bytes_read == MODEL_BYTES
    for leaf in jax.tree_util.tree_leaves(state):
        assert {d.platform for d in leaf.sharding.device_set} == {"gpu"} and len(leaf.sharding.device_set) == len(gpus)
    for name, thunk, _, _ in hf.iter_hf_tensors(nnx.merge(graphdef, state)):
        np.testing.assert_array_equal(thunk().astype(np.float32), transformers_tensors[name], err_msg=name)
