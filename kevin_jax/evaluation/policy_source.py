"""The policy an evaluation samples from: a training run's orbax checkpoint, a Hugging Face checkpoint directory a user
brings (e.g. Kevin-32B's float32 shards), or the config's starting policy (its HF checkpoint, or a named shape's seeded
init followed by the configured warm start), exactly as the trainer builds it.

An HF checkpoint directory given as the checkpoint becomes the config's model.hf_checkpoint (hf_checkpoint_config):
its config.json is the architecture, checked against the one the config names (a mismatch is an error naming the
differing fields), and it is streamed onto the mesh tensor by tensor (kevin_jax.model.hf.load_hf_params), cast to the
compute dtype on the devices.

A kevin_jax checkpoint is restored parameters-only (the optimiser state stays on disk) after its stored shapes are
compared with the architecture the config describes: a mismatch is an error that names the differing parameters and,
when the run directory has one, the model section of the run's own config.json.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from kevin_jax import checkpoint as ckpt_lib
from kevin_jax.model import hf, qwen2, shapes
from kevin_jax.policy_init import abstract_state, architecture, starting_params
from kevin_jax.rl import state as rl_state
from kevin_jax.run_config import RunSpec
from kevin_jax.tasks import Split

log = logging.getLogger(__name__)


class CheckpointMismatchError(ValueError):
    """The checkpoint's parameters do not have the shapes the config's model describes."""


@dataclasses.dataclass
class LoadedPolicy:
    model: qwen2.Qwen2ForCausalLM
    description: str                 # where the parameters came from, for the report
    step: int                        # the RL step of the checkpoint (0 for a starting policy)
    split: Split | None              # the split the run trained with (from the checkpoint), if known
    run_dir: Path | None = None


def checkpoints_dir(path: str | Path) -> Path:
    """A training workdir (holding checkpoints/) or its checkpoints/ directory itself."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {path}")
    if (path / "checkpoints").is_dir():
        return path / "checkpoints"
    if any(p.name.isdigit() for p in path.iterdir()):
        return path
    raise FileNotFoundError(f"{path} holds no checkpoint (expected a training workdir with checkpoints/, the "
                            f"checkpoints/ directory itself, or a Hugging Face checkpoint directory: config.json and "
                            f"{hf.SINGLE_FILE}, or {hf.INDEX_FILE} and its shards)")


# The fields of config.json that decide the computation (not the token ids or the informational context length).
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings")


def architecture_differences(expected: shapes.Qwen2Config, found: shapes.Qwen2Config) -> list[str]:
    return [f"{name}: config {getattr(expected, name)!r}, checkpoint {getattr(found, name)!r}"
            for name in ARCHITECTURE_FIELDS if getattr(expected, name) != getattr(found, name)]


def hf_checkpoint_config(config: Any, directory: str | os.PathLike) -> Any:
    """A copy of the run config (ConfigDict) that evaluates the HF checkpoint `directory` as it is.

    The directory is checked first without reading its tensors (hf.inspect_checkpoint: config.json, index, shards,
    tensor names, shapes and dtypes). Its config.json is the architecture: when the config names one
    (model.shape, or a model.hf_checkpoint such as the base model it was trained from), every architecture field
    must match, else CheckpointMismatchError names the differences. model.hf_checkpoint becomes the directory
    (tokenizer.path="model" then reads its tokenizer files; without any, the config's former checkpoint's); the
    parameters are stored in the compute dtype (model.dtype: what the sampler reads; a float32 master copy serves
    only training), cast on the devices as each tensor arrives; no warm start is applied.
    """
    directory = os.path.abspath(os.fspath(directory))
    info = hf.inspect_checkpoint(directory)
    model = config.model
    if model.shape:
        expected, named = shapes.named_config(model.shape), f"model.shape={model.shape!r}"
    elif model.hf_checkpoint and os.path.abspath(model.hf_checkpoint) != directory:
        expected, named = shapes.from_hf_config(model.hf_checkpoint), f"model.hf_checkpoint={model.hf_checkpoint}"
    else:
        expected, named = None, ""
    if expected is not None:
        problems = architecture_differences(expected, info.config)
        if problems:
            raise CheckpointMismatchError(
                f"checkpoint {directory} is not the architecture the config names ({named}): " + "; ".join(problems) +
                "\nevaluate it with a config of its architecture, or take the architecture from its config.json: "
                "--config.model.shape= (empty)")
    out = copy.deepcopy(config)
    former = model.hf_checkpoint
    out.model.shape = ""
    out.model.hf_checkpoint = directory
    if config.tokenizer.path == "model" and not _has_tokenizer(directory):
        if not former or not _has_tokenizer(former):
            raise FileNotFoundError(f"checkpoint {directory} has no tokenizer files (tokenizer.json or vocab.json) "
                                    f"and tokenizer.path='model' reads them from it: give "
                                    f"--config.tokenizer.path=<a directory with the model's tokenizer files>")
        out.tokenizer.path = former
        log.info("checkpoint %s has no tokenizer files: using those of %s", directory, former)
    if model.param_dtype != model.dtype:
        out.model.param_dtype = model.dtype
    if config.warm_start.steps:
        out.warm_start.steps = 0
        log.info("evaluating %s as it is: the config's warm start (%d steps) is not applied", directory,
                 config.warm_start.steps)
    log.info("HF checkpoint %s: %d shard file(s), %.2f GB of %s tensors, %s; loaded as %s", directory, info.files,
             info.tensor_bytes / 1e9, "/".join(info.dtypes), _describe(info.config), out.model.param_dtype)
    return out


def _has_tokenizer(directory: str) -> bool:
    return any(os.path.exists(os.path.join(directory, f)) for f in ("tokenizer.json", "vocab.json"))


def _describe(config: shapes.Qwen2Config) -> str:
    return (f"{config.param_count() / 1e9:.2f}B parameters ({config.num_hidden_layers} layers, hidden "
            f"{config.hidden_size}, vocabulary {config.vocab_size}, "
            f"{'tied' if config.tie_word_embeddings else 'untied'} LM head)")


def _names(path) -> tuple[str, ...]:
    out = []
    for entry in path:
        name = getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", entry)))
        out.append(str(name))
    if out and out[-1] == "value":      # nnx.State leaves are stored as {"value": array}
        out = out[:-1]
    return tuple(out)


def shape_table(tree: Any) -> dict[str, tuple[int, ...]]:
    return {"/".join(_names(p)): tuple(leaf.shape) for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
            if hasattr(leaf, "shape")}


def compare_shapes(stored: Mapping[str, tuple], expected: Mapping[str, tuple]) -> list[str]:
    """Human-readable differences between the checkpoint's parameter shapes and the model's (empty: they match)."""
    problems = []
    for name in sorted(set(expected) - set(stored)):
        problems.append(f"{name}: missing from the checkpoint (model expects {expected[name]})")
    for name in sorted(set(stored) - set(expected)):
        problems.append(f"{name}: in the checkpoint {stored[name]} but not in the model")
    for name in sorted(set(stored) & set(expected)):
        if tuple(stored[name]) != tuple(expected[name]):
            problems.append(f"{name}: checkpoint {tuple(stored[name])} vs model {tuple(expected[name])}")
    return problems


def _stored_param_shapes(directory: Path, step: int) -> dict[str, tuple]:
    metadata = ocp.PyTreeCheckpointHandler().metadata(epath.Path(directory / str(step) / "state"))
    tree = getattr(metadata, "tree", metadata)
    if not isinstance(tree, Mapping) or "params" not in tree:
        raise CheckpointMismatchError(f"{directory / str(step)} is not a kevin_jax training checkpoint (its state "
                                      f"has no 'params')")
    return shape_table(tree["params"])


def _run_model_section(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "config.json").read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None


def restore_checkpoint(spec: RunSpec, mesh, checkpoint: str | Path, step: int | None = None) -> LoadedPolicy:
    """The policy of a training checkpoint (the newest, or `step`), its shapes checked against `spec.model`."""
    directory = checkpoints_dir(checkpoint)
    run_dir = directory.parent if directory.name == "checkpoints" else None
    # max_to_keep=0: this manager must never delete anything of the run (it only reads).
    checkpointer = ckpt_lib.Checkpointer(directory, ckpt_lib.CheckpointConfig(max_to_keep=0, async_save=False))
    try:
        steps = checkpointer.all_steps()
        if not steps:
            raise FileNotFoundError(f"no finished checkpoint in {directory}")
        if step is None:
            step = max(steps)
        elif step not in steps:
            raise ValueError(f"no checkpoint of step {step} in {directory}; it has steps {sorted(steps)}")
        graphdef, abstract = nnx.split(qwen2.abstract_model(architecture(spec), spec.model_options))
        problems = compare_shapes(_stored_param_shapes(directory, step), shape_table(abstract))
        if problems:
            theirs = _run_model_section(run_dir) if run_dir else None
            ours = dataclasses.asdict(spec.model) | dataclasses.asdict(spec.model_options)
            hint = (f"\nthe run's config.json has model={theirs}\nthis config has model={ours}" if theirs else
                    f"\nthis config has model={ours}")
            raise CheckpointMismatchError(
                f"checkpoint {directory / str(step)} does not match the config's model ({len(problems)} "
                f"parameter(s) differ): " + "; ".join(problems[:6]) + hint +
                "\nevaluate it with the config it was trained with (--config=... and the same --config.model.*)")
        shardings = qwen2.param_shardings(abstract, mesh)
        target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
        params = _restore_params(checkpointer, step, target, spec, mesh)
        meta = checkpointer.restore_meta(step)
    finally:
        checkpointer.close()
    split = Split.from_dict(meta["split"]) if isinstance(meta.get("split"), Mapping) else None
    if meta.get("seed") is not None and meta.get("seed") != spec.seed:
        log.warning("the checkpoint's run used seed %s, this config says %s (only the sampling seeds differ)",
                    meta.get("seed"), spec.seed)
    return LoadedPolicy(nnx.merge(graphdef, params), f"checkpoint {directory / str(step)}", int(step), split, run_dir)


def _restore_params(checkpointer: ckpt_lib.Checkpointer, step: int, target: Any, spec: RunSpec, mesh) -> Any:
    """Parameters only (orbax partial restore; of a run with its optimiser state offloaded, the float32 master
    copy, restored onto the devices); older orbax without partial restore: the whole train state, then its
    params."""
    key = "master" if "master" in checkpointer.state_keys(step) else "params"
    restore_args = jax.tree.map(lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, dtype=s.dtype),
                                {key: target})
    try:
        args = ocp.args.PyTreeRestore(item={key: target}, restore_args=restore_args, partial_restore=True)
    except TypeError:
        if key == "master":
            raise RuntimeError("restoring an offloaded run's weights needs orbax's partial restore "
                               "(orbax-checkpoint >= 0.12)") from None
        tx = rl_state.make_optimizer(spec.optim, spec.total_steps * spec.rl.updates_per_batch)
        _, full = abstract_state(spec, mesh, tx)
        state, _ = checkpointer.restore(step, full)
        return state["params"]
    restored = checkpointer.manager.restore(step, args=ocp.args.Composite(state=args))
    return restored["state"][key]


def starting_policy(spec: RunSpec, mesh, warm_start_tasks, tokenizer) -> LoadedPolicy:
    """What the trainer starts from at step 0: the HF checkpoint, or the named shape's seeded init, then the
    configured warm start (on `warm_start_tasks`)."""
    graphdef, params, stats = starting_params(spec, mesh, warm_start_tasks, tokenizer)
    if spec.model.hf_checkpoint:
        what = f"HF checkpoint {spec.model.hf_checkpoint}"
    else:
        what = f"random init of shape {spec.model.shape!r} (seed {spec.seed})"
        if not spec.warm_start.steps:
            log.warning("evaluating an untrained policy (%s, no warm start): expect format errors only", what)
    if spec.warm_start.steps:
        what += f" + {spec.warm_start.steps}-step warm start"
        if stats:
            log.info("warm start: %s", {k: round(float(v), 4) for k, v in stats.items()})
    return LoadedPolicy(nnx.merge(graphdef, params), what, 0, None)
