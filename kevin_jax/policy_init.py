"""How a run's policy comes to be, from its config: the architecture, the initial parameters (an HF checkpoint or a
seeded random init), the step-0 policy (initial parameters, then the optional supervised warm start,
kevin_jax.sft), the shapes of the train state (the target a checkpoint is restored into), and the tokenizer.

The trainer, the evaluation and launch/sft.py build the policy through these functions, so that each starts from
exactly the same parameters. `run_sft` is launch/sft.py's program: the step-0 policy written as an HF checkpoint
directory that train.py can start from.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from kevin_jax import multihost, parallel, sft
from kevin_jax.env.episode import resolve_gpu_name
from kevin_jax.env.prompts import PromptRenderer
from kevin_jax.model import hf, qwen2, shapes
from kevin_jax.model.tokenizer import BUILTIN_DIR, Tokenizer, load_tokenizer
from kevin_jax.rl import offload
from kevin_jax.run_config import RunSpec, as_dict, parse_config
from kevin_jax.tasks import load_tasks, resolve_split, select

log = logging.getLogger(__name__)


def architecture(spec: RunSpec) -> shapes.Qwen2Config:
    """The architecture the config describes (the HF checkpoint's config.json, or the named shape)."""
    return shapes.architecture_of(spec.model.hf_checkpoint, spec.model.shape)


def run_tokenizer(spec: RunSpec) -> Tokenizer:
    """The tokenizer the config names: the built-in one, a tokenizer directory, or the HF checkpoint's own."""
    return load_tokenizer(spec.tokenizer_dir)


def check_vocabulary(tokenizer: Tokenizer, arch: shapes.Qwen2Config) -> None:
    if tokenizer.vocab_size > arch.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary is "
                         f"{arch.vocab_size}")


def initial_params(spec: RunSpec, mesh) -> tuple[Any, Any]:
    """(graphdef, parameters) of the policy before any update: the HF checkpoint (streamed onto the mesh tensor by
    tensor, never whole on a device or in host memory; hf.load_hf_params logs its time), or a seeded random init."""
    if spec.model.hf_checkpoint:
        graphdef, params, _ = hf.load_hf_params(spec.model.hf_checkpoint, spec.model_options, mesh=mesh)
        return graphdef, params
    return nnx.split(qwen2.init_sharded(architecture(spec), spec.model_options, mesh, seed=spec.seed))


def starting_params(spec: RunSpec, mesh, train_tasks, tokenizer) -> tuple[Any, Any, dict]:
    """(graphdef, parameters, scalars) of the policy at step 0: initial parameters, then the optional warm start."""
    if not spec.warm_start.steps:
        return (*initial_params(spec, mesh), {})
    # the examples first: a bad data file fails before the model is built
    renderer = PromptRenderer(tokenizer, spec.env.max_prompt_tokens, resolve_gpu_name(spec.env.gpu_name, spec.eval),
                              spec.env.one_shot)
    samples = sft.warm_start_examples(spec.warm_start, train_tasks, renderer, tokenizer.eos_id,
                                      max_response_tokens=spec.longest_response)
    graphdef, params = initial_params(spec, mesh)
    params, stats = sft.warm_start(graphdef, params, spec.warm_start, samples, mesh, spec.rl, spec.seed)
    return graphdef, params, stats


def abstract_state(spec: RunSpec, mesh, tx: optax.GradientTransformation) -> tuple[Any, Any]:
    """(graphdef, ShapeDtypeStructs with shardings of the train state): the restore target, nothing allocated (with
    optim.offload, the master copy and moments in host memory: kevin_jax.rl.offload)."""
    graphdef, params = nnx.split(qwen2.abstract_model(architecture(spec), spec.model_options))
    shardings = qwen2.param_shardings(params, mesh)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, shardings)
    if spec.optim.offload != "none":
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return graphdef, offload.abstract_state(params, tx, spec.model_options.compute_dtype, replicated)
    compiled = jax.jit(tx.init).lower(params).compile()
    opt_shapes = jax.eval_shape(tx.init, params)
    opt_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), opt_shapes,
                             compiled.output_shardings)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    updates = jax.ShapeDtypeStruct((), np.int32, sharding=replicated)
    return graphdef, {"params": params, "opt_state": opt_state, "updates": updates}


def run_sft(config: Any, workdir: str | os.PathLike) -> dict[str, float]:
    """Initial policy of the run config (model section), fine-tuned by its warm_start section (steps, corpus,
    optimiser) on its training tasks, written as an HF checkpoint (float32) into `workdir` with sft_stats.json."""
    spec = parse_config(config)
    if spec.warm_start.steps <= 0:
        raise ValueError("SFT needs --config.warm_start.steps > 0 (and usually --config.warm_start.corpus=<path> "
                         "or builtin)")
    workdir = Path(workdir).absolute()
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise FileExistsError(f"{workdir} exists and is not an empty directory: choose a new --workdir")
    parallel.initialize_distributed(spec.mesh)
    tokenizer = run_tokenizer(spec)
    tasks = load_tasks(spec.tasks).tasks
    split = resolve_split(tasks, spec.tasks)
    mesh, _ = multihost.build_meshes(spec.mesh)
    graphdef, params, stats = starting_params(spec, mesh, select(tasks, split, "train"), tokenizer)
    if jax.process_index() == 0:
        tmp = workdir.with_name(workdir.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        # the tokenizer files go along, so that the checkpoint is self-contained
        tokenizer_dir = spec.tokenizer_dir if spec.tokenizer_dir is not None else BUILTIN_DIR
        hf.save_hf_checkpoint(nnx.merge(graphdef, params), tmp, dtype=None, tokenizer_dir=tokenizer_dir)
        (tmp / "sft_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
        (tmp / "sft_config.json").write_text(json.dumps(as_dict(config), indent=1, default=str) + "\n")
        workdir.parent.mkdir(parents=True, exist_ok=True)
        if workdir.exists():
            workdir.rmdir()          # empty (checked above)
        os.replace(tmp, workdir)
        log.info("SFT checkpoint in %s: start RL from it with --config.model.shape= --config.model.hf_checkpoint=%s "
                 "--config.warm_start.steps=0", workdir, workdir)
    return stats
