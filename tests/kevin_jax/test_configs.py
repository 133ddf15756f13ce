"""Run configs (configs/*.py): every dataclass field is present, with the dataclass default, and overridable from the
command line; unknown fields are errors and renamed ones name their new name; each config file sets only its
departures; the recipes hold Kevin's numbers; building a config does not import jax; GPU placement."""
import ast
import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import jax
import pytest
from absl import flags
from ml_collections import config_flags

from cuda_eval.api import visible_gpu_count
from kevin_jax import run_config, train
from kevin_jax.placement import GpuConfig, apply_gpu_placement

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ("kevin32b", "single_turn", "one_gpu", "tiny_cpu", "warm_start_demo")
sys.path.insert(0, str(REPO))          # config files import configs.common, as under launch/train.py


# configs/kevin32b.py (and single_turn.py, built on it) picks its node layout from the visible GPUs; the tests name
# one (Kevin's 8 x H200) so that they read the same config on any machine.
CONFIG_ARG = {"kevin32b": ":h200x8", "single_turn": ":h200x8"}


def _load(name: str, *overrides: str, arg: str | None = None):
    arg = CONFIG_ARG.get(name, "") if arg is None else arg
    argv = ["prog", f"--config={REPO / 'configs' / name}.py{arg}", *overrides]
    fv = flags.FlagValues()
    # sys_argv: config_flags defines the override flags it finds there (sys.argv under launch/train.py)
    config_flags.DEFINE_config_file("config", str(REPO / "configs" / f"{name}.py"), flag_values=fv, sys_argv=argv)
    fv(argv)
    return fv.config


def _with_checkpoint(config):
    if not config.model.shape:
        config.model.hf_checkpoint = "/ckpt/QwQ-32B"
    return config


@pytest.mark.parametrize("name", CONFIGS)
def test_every_field_of_every_section_is_in_the_config(name):
    config = _load(name)
    for section, types in run_config.SECTIONS.items():
        fields = {f.name for t in types for f in dataclasses.fields(t)}
        assert set(config[section].keys()) == fields, section
    run_config.parse_config(_with_checkpoint(config))


def _default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def test_config_defaults_are_the_dataclass_defaults():
    """run_config.default_config() holds every field of every section with its dataclass default, value and type (a
    1 where the dataclass has 1.0 would refuse --config...=0.5; an optional field is a placeholder of its type)."""
    defaults = run_config.default_config()
    assert set(defaults.keys()) == set(run_config.SECTIONS) | set(run_config.TOP_LEVEL)
    drift = []
    for section, types in run_config.SECTIONS.items():
        assert set(defaults[section].keys()) == {f.name for t in types for f in dataclasses.fields(t)}, section
        for t in types:
            hints = typing.get_type_hints(t)
            for f in dataclasses.fields(t):
                want, got = _default(f), defaults[section][f.name]
                if got != want or type(got) is not type(want):
                    drift.append(f"{section}.{f.name}: {t.__name__} says {want!r}, the config {got!r}")
                if want is None and defaults[section].get_type(f.name) not in typing.get_args(hints[f.name]):
                    drift.append(f"{section}.{f.name}: a placeholder of {defaults[section].get_type(f.name)}, "
                                 f"annotated {hints[f.name]}")
    assert not drift, "run_config.default_config() differs from the dataclasses:\n" + "\n".join(drift)
    assert {k: defaults[k] for k in run_config.TOP_LEVEL} == run_config.TOP_LEVEL


def test_the_recipe_departs_from_the_defaults_only_where_it_says_so():
    """base() is the dataclass defaults plus Kevin-32B's deliberate departures, each commented in configs/common.py;
    a new one belongs there with its reason, and here."""
    from configs import common

    defaults, recipe = run_config.default_config(), common.base()
    departures = {(s, k) for s in run_config.SECTIONS for k in defaults[s].keys() if recipe[s][k] != defaults[s][k]}
    assert departures == {("model", "shape"), ("env", "max_prompt_tokens"), ("sampler", "max_slots"),
                          ("sampler", "max_seq_len"), ("sampler", "prefill_tokens"), ("sampler", "prefill_chunk"),
                          ("sampler", "kv_cache_fraction")}


# What each config file starts from: its departures are the fields it sets (configs/common.py's base() starts from the
# section dataclasses' defaults).
PARENT = {"common": "defaults", "kevin32b": "common", "one_gpu": "common", "tiny_cpu": "common",
          "single_turn": "kevin32b", "warm_start_demo": "one_gpu"}


def _flat(config, prefix=""):
    out = {}
    for key in config.keys():
        value = config[key]
        out.update(_flat(value, f"{prefix}{key}.") if hasattr(value, "keys") else {prefix + key: value})
    return out


def _built(name: str, layout: str):
    import importlib

    if name == "defaults":
        return run_config.default_config()
    module = importlib.import_module(f"configs.{name}")
    if name == "common":
        return module.base()
    return module.get_config(layout) if name in CONFIG_ARG else module.get_config()


@pytest.mark.parametrize("name", ("common",) + CONFIGS)
def test_config_files_set_only_their_departures(name):
    """Every `c.<section>.<field> = ...` of a config file changes what it starts from (configs/common.py's base() or
    the config it builds on) for at least one node layout: nothing repeats a default or the recipe."""
    tree = ast.parse((REPO / "configs" / f"{name}.py").read_text())
    assigned = {ast.unparse(target)[2:] for node in ast.walk(tree) if isinstance(node, ast.Assign)
                for target in node.targets if ast.unparse(target).startswith("c.")}
    assert assigned, name
    changed = set()
    for layout in ("h100x4", "h100x8", "h200x4", "h200x8"):
        mine, parent = _flat(_built(name, layout)), _flat(_built(PARENT[name], layout))
        changed |= {k for k in mine if mine[k] != parent[k]}
    assert assigned <= changed, f"configs/{name}.py sets what it already has: {sorted(assigned - changed)}"


@pytest.mark.parametrize("name", CONFIGS)
def test_docstring_gives_the_command(name):
    text = (REPO / "configs" / f"{name}.py").read_text()
    assert f"python launch/train.py --config=configs/{name}.py" in text
    assert "expect" in text.lower()


def _override_text(value) -> str:
    if isinstance(value, tuple):
        return "(" + "".join(f"{_override_text(v)}," for v in value) + ")"
    if isinstance(value, str):
        return value
    return repr(value)


def test_every_field_can_be_overridden_on_the_command_line():
    base = _load("tiny_cpu")
    overrides = []
    for section, types in run_config.SECTIONS.items():
        for t in types:
            for f in dataclasses.fields(t):
                value = base[section][f.name]
                if value is None or value == ():
                    continue            # typed placeholders / empty tuples: covered below
                overrides.append(f"--config.{section}.{f.name}={_override_text(value)}")
    overrides += ["--config.seed=0", "--config.total_steps=3", "--config.response_schedule=2:600"]
    config = _load("tiny_cpu", *overrides)
    spec = run_config.parse_config(config)
    assert spec.response_schedule == ((2, 600),)
    assert spec.max_response_tokens(1) == 512 and spec.max_response_tokens(2) == 600


def test_overrides_change_the_dataclasses():
    config = _load("tiny_cpu", "--config.reward.gamma=0.8", "--config.rl.loss_aggregation=token_mean",
                   "--config.env.num_turns=1", "--config.mesh.coordinator_address=localhost:1234",
                   "--config.mesh.num_processes=2", "--config.sampler.stop_ids=(5,7)",
                   "--config.tasks.levels=(1,)", "--config.rl.kl_coef=0.05", "--config.advantage.baseline=turn_mean",
                   "--config.reward.return_aggregation=max", "--config.warm_start.grad_clip_norm=0.5")
    spec = run_config.parse_config(config)
    assert spec.reward.gamma == 0.8 and spec.rl.loss_aggregation == "token_mean" and spec.env.num_turns == 1
    assert spec.advantage.baseline == "turn_mean" and spec.reward.return_aggregation == "max"
    assert spec.warm_start.grad_clip_norm == 0.5
    assert spec.mesh.coordinator_address == "localhost:1234" and spec.mesh.num_processes == 2
    assert spec.sampler.stop_ids == (5, 7) and spec.tasks.levels == (1,) and spec.rl.kl_coef == 0.05


def test_unknown_fields_are_errors():
    with pytest.raises(Exception, match="nonexistent"):
        _load("tiny_cpu", "--config.rl.nonexistent=1")
    config = _load("tiny_cpu").to_dict()
    config["rl"]["nonexistent"] = 1
    with pytest.raises(ValueError, match=r"config.rl has unknown field\(s\) \['nonexistent'\]"):
        run_config.parse_config(config)
    config = _load("tiny_cpu").to_dict()
    config["optimiser"] = {}
    with pytest.raises(ValueError, match="unknown top-level entries"):
        run_config.parse_config(config)
    config = _load("tiny_cpu").to_dict()
    config["rl"]["loss_aggregation"] = "median"
    with pytest.raises(ValueError, match="config.rl: rl.loss_aggregation must be one of"):
        run_config.parse_config(config)


@pytest.mark.parametrize("old, new", sorted(run_config.RENAMED.items()))
def test_a_renamed_field_names_its_new_name(old, new):
    """A config (file or dict) that still sets an old name is refused with the new name, as is the command line."""
    section, field = old.split(".")
    config = _load("tiny_cpu").to_dict()
    config[section][field] = "x"
    with pytest.raises(ValueError, match=f"{old} is now {new}"):
        run_config.parse_config(config)
    new_section, new_field = new.split(".")
    assert new_field in config[new_section]
    assert run_config.renamed_overrides(["prog", f"--config.{old}=x", "--config.rl.kl_coef=0.1"]) == [
        f"--config.{old}: {old} is now {new}"]


def test_the_launchers_refuse_a_renamed_field_before_anything_else():
    for script in ("train", "sft", "eval"):
        out = subprocess.run([sys.executable, str(REPO / "launch" / f"{script}.py"), "--config=configs/tiny_cpu.py",
                              "--workdir=/nonexistent", "--config.reward.aggregation=max",
                              "--noconfig.reward.normalize_std"], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert out.returncode != 0, script
        assert ("reward.aggregation is now reward.return_aggregation; --config.reward.normalize_std: "
                "reward.normalize_std is now advantage.normalize_std") in out.stderr, (script, out.stderr[-2000:])


def test_kevin32b_is_kevins_recipe():
    with pytest.raises(ValueError, match="model.hf_checkpoint"):
        run_config.parse_config(_load("kevin32b"))
    spec = run_config.parse_config(_load("kevin32b", "--config.model.hf_checkpoint=/ckpt/QwQ-32B"))
    assert (spec.rl.tasks_per_step, spec.env.num_trajectories, spec.env.num_turns) == (8, 16, 4)
    assert (spec.reward.gamma, spec.reward.return_aggregation, spec.reward.correct_weight) == (0.4, "sum", 0.3)
    assert (spec.advantage.baseline, spec.advantage.normalize_std) == ("mean", True)
    assert (spec.optim.learning_rate, spec.optim.warmup_fraction, spec.optim.grad_clip_norm) == (2e-6, 0.03, 0.05)
    assert (spec.rl.clip_eps_low, spec.rl.clip_eps_high, spec.rl.updates_per_batch) == (0.2, 0.28, 2)
    assert spec.rl.loss_aggregation == "constant_length" and spec.rl.kl_coef == 0.0
    assert spec.max_response_tokens(29) == 16384 and spec.max_response_tokens(30) == 22528
    assert spec.sampler.temperature == 0.9
    assert spec.tasks.levels == (1, 2) and spec.tasks.holdout_fraction == 0.1
    assert spec.tokenizer.path == "model"
    single = run_config.parse_config(_with_checkpoint(_load("single_turn")))
    assert single.env.num_turns == 1 and single.reward.return_aggregation == "single_turn"
    assert single.env.num_trajectories * single.env.num_turns == 64


def test_kevin32b_layouts_fit_the_node():
    from configs import kevin32b

    # the memory plan (configs/kevin32b.py's docstring): the state in host memory everywhere, the gradient sum in
    # bf16 on 80 GB cards, rows capped on 4 x H100
    grads = {"h200x8": "float32", "h100x8": "bfloat16", "h200x4": "float32"}
    for name, grad_dtype in grads.items():
        spec = run_config.parse_config(_load("kevin32b", "--config.model.hf_checkpoint=/ckpt/QwQ-32B", arg=":" + name))
        assert (spec.optim.offload, spec.optim.grad_dtype) == ("pinned_host", grad_dtype), name
        assert spec.optim.mu_dtype == "bfloat16", name
        assert spec.max_response_tokens(30) == 22528 and spec.sampler.max_seq_len == 40960, name
        assert spec.rl.micro_batch_tokens == int(name[-1]) * 16384, name        # one >= 16k row per GPU
    h100x4 = run_config.parse_config(_load("kevin32b", "--config.model.hf_checkpoint=/ckpt/QwQ-32B", arg=":h100x4"))
    assert (h100x4.optim.offload, h100x4.optim.grad_dtype) == ("pinned_host", "bfloat16")
    assert h100x4.rl.micro_batch_tokens == 4 * 12288 and h100x4.gpu.jax_memory_fraction == 0.9
    # rows capped: prompt + response fit the 12k row the update can hold
    assert h100x4.env.max_prompt_tokens + h100x4.longest_response <= 12288 == h100x4.sampler.max_seq_len
    with pytest.raises(ValueError, match="unknown layout"):
        kevin32b.get_config("a100x2")


@pytest.mark.parametrize("gpus, layout", [((0, 0), "h200x8"), ((4, 85), "h100x4"), ((8, 85), "h100x8"),
                                          ((4, 150), "h200x4"), ((8, 150), "h200x8")])
def test_kevin32b_detects_the_node(monkeypatch, gpus, layout):
    from configs import kevin32b
    from kevin_jax import hardware

    monkeypatch.setattr(hardware, "visible_gpus", lambda: gpus)
    assert kevin32b.get_config("auto").optim.grad_dtype == kevin32b.LAYOUTS[layout].grad_dtype
    assert hardware.detect_layout(kevin32b.LAYOUTS, config="configs/kevin32b.py", without_gpu="h200x8") == layout


@pytest.mark.parametrize("gpus", [(1, 85), (2, 150), (8, 40)])
def test_kevin32b_refuses_a_node_it_cannot_fit(monkeypatch, gpus):
    from configs import kevin32b
    from kevin_jax import hardware

    monkeypatch.setattr(hardware, "visible_gpus", lambda: gpus)
    with pytest.raises(ValueError, match="configs/kevin32b.py: no layout for"):
        kevin32b.get_config()


def test_config_files_do_not_import_jax():
    """launch/train.py reads the config, then sets the GPU placement, then starts JAX: building, overriding and
    checking a config (every section's dataclass) must not import jax (nor its libraries, nor torch)."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import importlib\n"
            "from kevin_jax import run_config\n"
            "from kevin_jax.sampler import SamplerConfig\n"
            "for name in %r:\n"
            "    module = importlib.import_module('configs.' + name)\n"
            "    config = module.get_config('h200x8') if name in ('kevin32b', 'single_turn') else module.get_config()\n"
            "    config.model.hf_checkpoint = '/ckpt/QwQ-32B' if not config.model.shape else ''\n"
            "    run_config.parse_config(config)\n"
            "heavy = ('jax', 'jaxlib', 'flax', 'optax', 'orbax', 'torch')\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
            "assert not loaded, f'building the configs imported {loaded[:8]}'\n") % (str(REPO), CONFIGS)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_jax_free_sections_name_what_the_jax_side_implements():
    """model.config and rl.config validate names without jax; the jax modules hold what each name means."""
    from kevin_jax.model import config as model_config
    from kevin_jax.model import qwen2
    from kevin_jax.rl import config as rl_config
    from kevin_jax.rl import state as rl_state

    assert tuple(qwen2.REMAT_POLICIES) == model_config.REMAT_POLICY_NAMES
    assert tuple(rl_state.GRAD_DTYPES) == rl_config.GRAD_DTYPE_NAMES
    options = qwen2.ModelOptions(dtype="float32", param_dtype="bfloat16", matmul_precision="highest")
    assert options.compute_dtype is jax.numpy.float32 and options.storage_dtype is jax.numpy.bfloat16
    assert options.precision == jax.lax.Precision.HIGHEST


def test_too_short_context_is_an_error():
    with pytest.raises(ValueError, match="sampler.max_seq_len"):
        run_config.parse_config(_load("tiny_cpu", "--config.sampler.max_seq_len=2048"))


@pytest.mark.skipif(visible_gpu_count() > 0, reason="checks the message shown where there is no GPU")
def test_no_gpu_says_so_and_points_to_the_tiny_config():
    spec = run_config.parse_config(_load("one_gpu"))
    with pytest.raises(RuntimeError) as e:
        train.make_evaluator(spec)
    assert "needs an NVIDIA GPU" in str(e.value) and "configs/tiny_cpu.py" in str(e.value)


def test_gpu_placement():
    env = {}
    changes = apply_gpu_placement(GpuConfig(jax_memory_fraction=0.5), "all", 1, env)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.500" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "JAX_CUDA_VISIBLE_DEVICES" not in changes
    env = {}
    apply_gpu_placement(GpuConfig(jax_devices="0,1,2,3,4,5"), "6,7", 8, env)
    assert env == {"JAX_CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}
    env = {}
    apply_gpu_placement(GpuConfig(jax_devices="0,1"), "1,2", 4, env)
    assert env["JAX_CUDA_VISIBLE_DEVICES"] == "0,1" and "XLA_PYTHON_CLIENT_MEM_FRACTION" in env
    assert apply_gpu_placement(GpuConfig(), "all", 0, {}) == {}
    with pytest.raises(ValueError, match="names GPU"):
        apply_gpu_placement(GpuConfig(jax_devices="9"), "all", 2, {})
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3"}           # the user's own setting wins
    apply_gpu_placement(GpuConfig(), "all", 1, env)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3"
    env = {}
    apply_gpu_placement(GpuConfig(), "all", 4, env)
    assert "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB" not in env


def test_the_pinned_host_pools_hold_each_gpus_share_of_an_offloaded_state(monkeypatch):
    """QwQ-32B's offloaded state on 4 GPUs: each GPU's pinned-host pool is capped at what the model of XLA's allocator
    needs to place its share (tests/kevin_jax/test_host_pool.py): 107 GiB with a float32 first moment, 84 with a
    bf16 one (optim.mu_dtype); uncapped, the four pools took 472 GiB of a 503 GiB host. The shards come from the
    mesh as the run builds it (data-parallel copies hold the whole share each; a multi-host run puts one replica on
    each host: tests/kevin_jax/test_multihost_placement.py); a host without room for the pools is refused before JAX
    starts."""
    from kevin_jax import placement
    from kevin_jax.model import shapes
    qwq = shapes.named_config("qwq_32b")
    monkeypatch.setattr(placement, "host_memory_gib", lambda: 503)

    def pool(gpus, mu_dtype="bfloat16", **mesh):
        env = {}
        apply_gpu_placement(GpuConfig(), "0", gpus, env, offload="pinned_host", arch=qwq, mu_dtype=mu_dtype,
                            mesh=placement.ParallelConfig(**mesh))            # kernels on one GPU
        assert "XLA_PJRT_GPU_HOST_MEMORY_PREALLOCATE" not in env   # would size XLA's staging pool alike
        return int(env["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"])
    assert pool(4) == 84 and pool(4, "float32") == 107
    monkeypatch.setattr(placement, "host_memory_gib", lambda: 2015)       # a 2 TB host (8-GPU nodes have them)
    assert pool(8) == 43                                                  # 8 GPUs: half the share each
    assert pool(8, data=2) == pool(8, data=-1, fsdp=4) == pool(4)          # sharded 4 ways: a 4-GPU share each
    # two hosts of 4 GPUs: one replica per host (kevin_jax.multihost), so a 4-GPU share each, unless the mesh
    # section shards over both hosts
    assert pool(4, num_processes=2) == pool(4)
    assert pool(4, num_processes=2, data=1, fsdp=8) == pool(8)
    monkeypatch.setattr(placement, "host_memory_gib", lambda: 256)
    with pytest.raises(ValueError, match="optim.offload=none") as refused:
        pool(4, "float32")
    assert "first moment in float32" in str(refused.value) and "optim.mu_dtype" in str(refused.value)
    assert apply_gpu_placement(GpuConfig(), "all", 4, {}, offload="none", arch=qwq) == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.600", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    with pytest.raises(ValueError, match="num_processes"):
        placement.process_count(placement.ParallelConfig(), {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert placement.process_count(placement.ParallelConfig(), {"SLURM_NTASKS": "2"}) == 2
    # the run's own config: configs/kevin32b.py on a 4-GPU node (its first moment in bf16)
    monkeypatch.setattr(placement, "host_memory_gib", lambda: 503)
    changes = placement.place_run(_load("kevin32b", "--config.model.shape=qwq_32b", arg=":h100x4").lock(), 4,
                                  environ={})
    assert changes["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] == "84"


def test_an_offloaded_run_counts_the_evaluator_in_the_hosts_memory(monkeypatch):
    """Measured at full size on 4 GPUs of a 503 GiB host: the pools, the trainer and the kernel; a build holds up to
    4.3 GiB with its phases side by side. With the first moment in bf16 and pools sized by the allocator model,
    configs/kevin32b.py's 4-GPU layouts (every GPU evaluating with a spare, 6 builds side by side, 8 GB of
    checkpoint in flight) fit 503 GiB with ~64 GiB left, and the 8-GPU layouts (every GPU, 2 spares, 8 builds) fit
    a 560 GiB host (and 503). A float32 first moment does not fit the 8-GPU layouts on 560 GiB; cuda_eval's
    defaults (8 spares per GPU, a build per core) do not fit a 4-GPU node. The refusal names the parts."""
    from cuda_eval.orchestrator import devices
    from kevin_jax import placement
    monkeypatch.setattr(placement, "host_memory_gib", lambda: 503)
    monkeypatch.setattr(devices, "_usable_cpus", lambda: 64)          # the 4-GPU node's cores (spares, builds)

    def place(layout, gpus, *overrides):
        config = _load("kevin32b", "--config.model.shape=qwq_32b", *overrides, arg=f":{layout}").lock()
        return placement.place_run(config, gpus, environ={})
    assert place("h100x4", 4)["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] == "84"
    assert place("h200x4", 4)
    # the 4-GPU layouts' evaluator: every GPU, a spare each, 6 builds side by side
    config = _load("kevin32b", "--config.model.shape=qwq_32b", arg=":h200x4").lock()
    evaluator = placement.EvaluatorFootprint.of(config.eval, 4)
    assert (evaluator.gpus, evaluator.spares, evaluator.compile_workers) == (4, 1, 6)
    assert evaluator.build_gib == placement.COMPILE_JOB_GIB
    # cuda_eval's defaults (8 spares per GPU on 64 cores, a build per core): refused, with the parts named
    with pytest.raises(ValueError, match="eval.spare_workers") as refused:
        place("h100x4", 4, "--config.eval.spare_workers=0", "--config.eval.compile_workers=0")
    assert "8 spare worker(s) each, 64 build(s)" in str(refused.value) and "503 GiB" in str(refused.value)
    # the float32 first moment of before, with this layout: refused on 4 GPUs of 503 GiB
    with pytest.raises(ValueError, match=r"4 GPU\(s\) with 1 spare worker\(s\) each, 6 build\(s\)"):
        place("h100x4", 4, "--config.optim.mu_dtype=float32")
    # room for 20 builds on 4 GPUs, not 22
    assert place("h100x4", 4, "--config.eval.compile_workers=20")
    with pytest.raises(ValueError, match="22 build"):
        place("h100x4", 4, "--config.eval.compile_workers=22")
    assert place("h100x4", 4, "--config.eval.spare_workers=8", "--config.eval.compile_workers=1",
                 "--config.eval.mode=compile_only")                      # no judges, no spares
    assert place("h100x4", 4, "--config.eval.backend=ray", "--config.eval.spare_workers=8",
                 "--config.eval.compile_workers=0")                      # all of it on the Ray cluster's nodes
    # CPU mode: its slots have judges and spares too
    cpu = placement.EvaluatorFootprint.of(_load("one_gpu", "--config.eval.device_type=cpu",
                                                 "--config.eval.cpu_workers=3").eval, 4)
    assert (cpu.gpus, cpu.spares) == (3, devices.auto_spare_workers(3))
    # 8 GPUs, every GPU evaluating with 2 spares, 8 builds: fit 560 GiB and 503 GiB; with a float32 first moment
    # they need ~566 GiB
    monkeypatch.setattr(devices, "_usable_cpus", lambda: 128)
    for ram in (503, 560):
        monkeypatch.setattr(placement, "host_memory_gib", lambda ram=ram: ram)
        for layout in ("h100x8", "h200x8"):
            assert place(layout, 8)["XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB"] == "43"
    with pytest.raises(ValueError, match=r"8 GPU\(s\) with 2 spare worker\(s\) each, 8 build\(s\)"):
        place("h200x8", 8, "--config.optim.mu_dtype=float32")
    # the budget's parts add up to the host, the trainer's floor among them
    evaluator = placement.EvaluatorFootprint(gpus=4, spares=1, compile_workers=6)          # the 4-GPU layouts'
    eight_gb = 8e9 / 2**30                                                                  # their checkpoints'
    budget = placement.host_budget_gib(84, 4, evaluator, 503, floor=0.01, checkpoint_gib=eight_gb)
    assert budget["pools"] == 336 and budget["evaluator"] == pytest.approx(4 * (2 * 0.8 + 2) + 6 * 4.3)
    assert budget["floor"] == pytest.approx(5.03) and budget["checkpoint"] == pytest.approx(7.45, abs=0.01)
    assert sum(v for k, v in budget.items() if k != "left") + budget["left"] == pytest.approx(503)
    assert 60 < budget["left"] < 70
    # what the full-size run measured beside the pools: trainer and kernel ~50 GiB
    assert budget["trainer"] + budget["kernel"] >= 49.6

