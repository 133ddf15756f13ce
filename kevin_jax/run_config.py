"""The run config: one dataclass per section, the ml_collections ConfigDict built from them (`default_config`), and
`parse_config`, which turns a ConfigDict back into the dataclasses (RunSpec).

Every section is a plain dataclass owned by the component that reads it (SECTIONS), so `--config.<section>.<field>`
reaches that component unchanged, and the dataclass defaults are the only defaults: configs/common.py starts from
`default_config()` and adds only the recipe's departures. The sections of the run as a whole (where the policy comes
from and its warm start, the tokenizer, checkpoints, held-out evaluation) are defined here. Nothing here imports jax,
so that the config files can be read before JAX starts (launch/train.py sets the GPU placement from the config
first): the sections of the components that run on JAX live in jax-free modules beside them (model/config.py,
rl/config.py, sampler/config.py, placement.py). Unknown sections or fields are errors that name them; a renamed
field's error names its new name (RENAMED).
"""
from __future__ import annotations

import dataclasses
import logging
import re
import typing
from typing import Any, Mapping, Sequence

from ml_collections import ConfigDict, config_dict

from cuda_eval.api import EvalConfig
from kevin_jax import logs
from kevin_jax.env.episode import EnvConfig
from kevin_jax.reward import RewardConfig
from kevin_jax.model.config import ModelOptions
from kevin_jax.placement import GpuConfig, ParallelConfig
from kevin_jax.rl.advantages import AdvantageConfig
from kevin_jax.rl.config import OptimConfig, RLConfig
from kevin_jax.sampler.config import SamplerConfig
from kevin_jax.tasks import TasksConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ModelSource:
    """Where the policy comes from (config section `model`, together with model.config.ModelOptions' fields).

    shape: a named architecture (kevin_jax.model.shapes.NAMED_CONFIGS), randomly initialised from `seed`.
    hf_checkpoint: a Hugging Face Qwen2 checkpoint directory (QwQ-32B's); when set, `shape` must be "".
    """
    shape: str = "tiny"
    hf_checkpoint: str = ""

    def __post_init__(self):
        if bool(self.shape) == bool(self.hf_checkpoint):
            raise ValueError("set exactly one of model.hf_checkpoint (an HF checkpoint directory, e.g. QwQ-32B's) "
                             f"and model.shape (a random init of a named shape); got shape={self.shape!r}, "
                             f"hf_checkpoint={self.hf_checkpoint!r}")


@dataclasses.dataclass
class TokenizerConfig:
    """The tokenizer (config section `tokenizer`). path: a tokenizer directory, "" = the built-in one, "model" =
    the HF checkpoint's own files."""
    path: str = ""


@dataclasses.dataclass
class WarmStartConfig:
    """Supervised warm start (config section `warm_start`; kevin_jax.sft, run by kevin_jax.policy_init before step 1
    or by launch/sft.py). The optimiser is kevin_jax.rl.state.optimizer (the RL update's), without weight decay.

    steps: Adam steps on the examples (0 = no warm start).
    learning_rate: peak Adam learning rate: linear warm-up from 0 over warmup_fraction of the steps (at least 1, at
      most max_warmup_steps), then a cosine decay to final_learning_rate_fraction of it at the last step. A randomly
      initialised policy at a memorising learning rate diverges without the warm-up; the decay lets the last steps
      settle on the answers rather than bounce around them.
    warmup_fraction, max_warmup_steps, final_learning_rate_fraction: that schedule.
    grad_clip_norm: gradients clipped to this global norm (0 = no clipping).
    batch_size: examples per step (seeded; chosen as length_buckets says).
    length_buckets: 0 = each batch a random choice; K > 0 = epochs in which each run of K x batch_size shuffled
      examples is sorted by length and cut into batches (less padding per batch; sft.batch_order).
    corpus: "" = the built-in correct solutions, first turn only; "builtin" = the shipped warm-start corpus
      (kevin_jax/data/warm_start_corpus.jsonl: correct, wrong and non-compiling answers, refinement turns); or the
      path of a JSONL file in any form kevin_jax.sft reads.
    solution_tasks: comma-separated task ids whose examples are used; "" = every training task that has one.
    answer_every_prompt: pair the chosen solutions with the first-turn prompt of EVERY training task (for tiny models
      that cannot tell prompts apart anyway: they learn one answer); False = each solution with its own task.
      Only with corpus="".
    """
    steps: int = 0
    learning_rate: float = 1e-3
    warmup_fraction: float = 0.1
    max_warmup_steps: int = 50
    final_learning_rate_fraction: float = 0.1
    grad_clip_norm: float = 1.0
    batch_size: int = 8
    length_buckets: int = 0
    corpus: str = ""
    solution_tasks: str = ""
    answer_every_prompt: bool = False

    def __post_init__(self):
        if self.steps < 0 or self.learning_rate <= 0 or self.batch_size <= 0 or self.length_buckets < 0:
            raise ValueError("warm_start.steps and length_buckets must be >= 0, warm_start.learning_rate and "
                             "batch_size positive")
        if not 0 <= self.warmup_fraction < 1 or self.max_warmup_steps < 1:
            raise ValueError(f"warm_start.warmup_fraction must be in [0, 1) and max_warmup_steps >= 1, got "
                             f"{self.warmup_fraction}, {self.max_warmup_steps}")
        if not 0 <= self.final_learning_rate_fraction <= 1 or self.grad_clip_norm < 0:
            raise ValueError(f"warm_start.final_learning_rate_fraction must be in [0, 1] and grad_clip_norm >= 0, got "
                             f"{self.final_learning_rate_fraction}, {self.grad_clip_norm}")
        if self.corpus and self.answer_every_prompt:
            raise ValueError("warm_start.answer_every_prompt applies to the built-in solutions only (corpus=\"\"); "
                             f"got corpus={self.corpus!r}")


@dataclasses.dataclass
class CheckpointConfig:
    """Checkpoints (config section `ckpt`; kevin_jax.checkpoint).

    every_steps: save after every this many RL steps (and always after the last one).
    max_to_keep: newest checkpoints kept on disk (0 = all).
    async_save: write in a background thread while the next step runs (orbax AsyncCheckpointer).
    enabled: False = no checkpoints at all (a run whose state cannot be stored anywhere; it cannot resume).
    dir: where the checkpoints go; "" = <workdir>/checkpoints. A volume with room for max_to_keep + 1 states
      (QwQ-32B with the optimiser state: 458 GB each, 393 GB offloaded; docs/ARCHITECTURE.md).
    concurrent_gb: checkpoint data in host RAM at once while writing or reading (orbax's byte limits): with an
      offloaded optimiser state the host RAM is mostly taken already.
    """
    every_steps: int = 1
    max_to_keep: int = 3
    async_save: bool = True
    enabled: bool = True
    dir: str = ""
    concurrent_gb: int = 32

    def __post_init__(self):
        if self.every_steps <= 0:
            raise ValueError(f"ckpt.every_steps must be positive, got {self.every_steps}")
        if self.max_to_keep < 0:
            raise ValueError(f"ckpt.max_to_keep must be >= 0 (0 = keep all), got {self.max_to_keep}")
        if self.concurrent_gb <= 0:
            raise ValueError(f"ckpt.concurrent_gb must be positive, got {self.concurrent_gb}")


@dataclasses.dataclass
class HoldoutConfig:
    """Held-out evaluation during training (config section `holdout`).

    every_steps: evaluate the split's held-out tasks after every this many steps (0 = never).
    at_end: also after the last step.
    num_trajectories: trajectories per held-out task (turns as in env).
    """
    every_steps: int = 0
    at_end: bool = True
    num_trajectories: int = 4


SECTIONS: dict[str, tuple[type, ...]] = {
    "model": (ModelSource, ModelOptions), "tokenizer": (TokenizerConfig,), "tasks": (TasksConfig,),
    "env": (EnvConfig,), "reward": (RewardConfig,), "advantage": (AdvantageConfig,), "sampler": (SamplerConfig,),
    "eval": (EvalConfig,), "rl": (RLConfig,), "optim": (OptimConfig,), "mesh": (ParallelConfig,),
    "gpu": (GpuConfig,), "log": (logs.LogConfig,), "ckpt": (CheckpointConfig,), "holdout": (HoldoutConfig,),
    "warm_start": (WarmStartConfig,),
}
# The values outside the sections, with their defaults. response_schedule: "step:tokens,..." sets
# env.max_response_tokens from that step on (Kevin: 16k, then 22k from step 30: configs/kevin32b.py).
TOP_LEVEL: dict[str, Any] = {"seed": 0, "total_steps": 100, "response_schedule": ""}
# Fields that moved or were renamed: old "section.field" -> new. Naming an old one is an error that names the new.
RENAMED = {
    "reward.aggregation": "reward.return_aggregation",
    "reward.baseline": "advantage.baseline",
    "reward.normalize_std": "advantage.normalize_std",
    "reward.std_eps": "advantage.std_eps",
    "rl.aggregation": "rl.loss_aggregation",
}


def default_config() -> ConfigDict:
    """Every section with exactly the fields and defaults of its dataclass(es), then the top-level values: what
    configs/common.py starts from. Each field's type is its annotation's: a float field given 1 holds 1.0 (so that
    --config...=0.5 is accepted), an optional one is a typed placeholder (None until set)."""
    config = ConfigDict()
    for name, types in SECTIONS.items():
        section = ConfigDict()
        for t in types:
            hints = typing.get_type_hints(t)
            for field in dataclasses.fields(t):
                section[field.name] = _config_value(t, field, hints[field.name])
        config[name] = section
    for name, value in TOP_LEVEL.items():
        config[name] = value
    return config


def _config_value(owner: type, field: dataclasses.Field, annotation: Any) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    elif field.default is not dataclasses.MISSING:
        value = field.default
    else:
        raise TypeError(f"{owner.__name__}.{field.name} has no default: every config field needs one")
    if value is None:
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{owner.__name__}.{field.name}: a None default needs an Optional[T] annotation, got "
                            f"{annotation}")
        return config_dict.placeholder(inner[0])
    if annotation is float and type(value) is int:
        return float(value)
    return value


def renamed_overrides(argv: Sequence[str]) -> list[str]:
    """One message per command-line override of a renamed field (--config.reward.aggregation=...): config_flags
    itself would only say that the old field does not exist."""
    out = []
    for arg in argv:
        match = re.match(r"--(?:no)?config\.([\w.]+)", arg)
        if match and match.group(1) in RENAMED:
            out.append(f"--config.{match.group(1)}: {match.group(1)} is now {RENAMED[match.group(1)]}")
    return out


def launch(main) -> None:
    """The `__main__` of launch/*.py: log lines with their time and module, a renamed config field on the command line
    refused by its new name (config_flags would only call the old name unknown), then absl's app.run(main)."""
    import sys

    from absl import app
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    renamed = renamed_overrides(sys.argv)
    if renamed:
        sys.exit("FATAL Flags parsing error: " + "; ".join(renamed))
    app.run(main)


class _RunSpecMethods:
    """What a RunSpec computes from its sections (its fields come from SECTIONS and TOP_LEVEL: see RunSpec)."""

    def max_response_tokens(self, step: int) -> int:
        """env.max_response_tokens, raised/lowered from the steps named in response_schedule ("30:22528")."""
        tokens = self.env.max_response_tokens
        for from_step, value in self.response_schedule:
            if step >= from_step:
                tokens = value
        return tokens

    @property
    def longest_response(self) -> int:
        return max([self.env.max_response_tokens] + [v for _, v in self.response_schedule])

    @property
    def tokenizer_dir(self) -> str | None:
        """The directory of the run's tokenizer files; None = the built-in tokenizer."""
        if self.tokenizer.path == "model":
            return self.model.hf_checkpoint
        return self.tokenizer.path or None


# A section read by several dataclasses is that many fields of RunSpec, named here; any other section is one field of
# its own name.
PART_NAMES = {"model": ("model", "model_options")}
# The typed form of the top-level values (TOP_LEVEL's "30:22528" schedule text becomes ((30, 22528),)).
TOP_LEVEL_TYPES = {"seed": int, "total_steps": int, "response_schedule": tuple[tuple[int, int], ...]}


def _part_names(name: str, types: tuple[type, ...]) -> tuple[str, ...]:
    names = PART_NAMES.get(name, (name,))
    if len(names) != len(types):
        raise TypeError(f"config section {name!r} has {len(types)} dataclass(es) but RunSpec names {names}")
    return names


# The typed form of a run config: one field per section dataclass (SECTIONS, in its order), then the top-level values.
RunSpec = dataclasses.make_dataclass(
    "RunSpec",
    [(part, t) for name, types in SECTIONS.items() for part, t in zip(_part_names(name, types), types)]
    + [(name, TOP_LEVEL_TYPES[name]) for name in TOP_LEVEL],
    bases=(_RunSpecMethods,))
RunSpec.__module__ = __name__
RunSpec.__doc__ = "The typed form of a run config: one dataclass per section (SECTIONS), then the top-level values."


def as_dict(config: Any) -> dict:
    """A ConfigDict (or a mapping) as plain nested dicts, e.g. to write it next to a run's outputs."""
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _build(types: tuple[type, ...], values: Mapping[str, Any], name: str) -> list[Any]:
    fields = [{f.name for f in dataclasses.fields(t)} for t in types]
    unknown = sorted(set(values) - set().union(*fields))
    renamed = [f"{name}.{k} is now {RENAMED[f'{name}.{k}']}" for k in unknown if f"{name}.{k}" in RENAMED]
    if renamed:
        raise ValueError(f"config.{name}: " + "; ".join(renamed))
    if unknown:
        known = sorted(set().union(*fields))
        raise ValueError(f"config.{name} has unknown field(s) {unknown}; known fields: {known}")
    out = []
    for t, names in zip(types, fields):
        kwargs = {k: v for k, v in values.items() if k in names}
        for k, v in kwargs.items():
            if isinstance(v, list):
                kwargs[k] = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        try:
            out.append(t(**kwargs))
        except (TypeError, ValueError) as e:
            raise ValueError(f"config.{name}: {e}") from e
    return out


def parse_schedule(text: str) -> tuple[tuple[int, int], ...]:
    """"30:22528,60:32768" -> ((30, 22528), (60, 32768)); "" -> ()."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        try:
            step, tokens = (int(x) for x in item.split(":"))
        except ValueError:
            raise ValueError(f"response_schedule entries are step:tokens, got {item!r}") from None
        if step < 1 or tokens < 1:
            raise ValueError(f"response_schedule entry {item!r}: step and tokens must be positive")
        out.append((step, tokens))
    return tuple(sorted(out))


def parse_config(config: Any) -> RunSpec:
    """Builds every section's dataclass from an ml_collections ConfigDict (or nested dicts); unknown sections or
    fields are errors that name them."""
    values = as_dict(config)
    unknown = sorted(set(values) - set(SECTIONS) - set(TOP_LEVEL))
    if unknown:
        raise ValueError(f"config has unknown top-level entries {unknown}; sections: {sorted(SECTIONS)}, "
                         f"values: {sorted(TOP_LEVEL)}")
    built: dict[str, Any] = {}
    for name, types in SECTIONS.items():
        built.update(zip(_part_names(name, types), _build(types, as_dict(values.get(name, {})), name)))
    for name in TOP_LEVEL:
        if name not in values:
            raise ValueError(f"config.{name} is missing")
    spec = RunSpec(**built, seed=int(values["seed"]), total_steps=int(values["total_steps"]),
                   response_schedule=parse_schedule(str(values["response_schedule"] or "")))
    _check(spec)
    return spec


def _check(spec: RunSpec) -> None:
    if spec.total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {spec.total_steps}")
    need = spec.env.max_prompt_tokens + spec.longest_response
    if spec.sampler.max_seq_len < need:
        raise ValueError(f"sampler.max_seq_len={spec.sampler.max_seq_len} < env.max_prompt_tokens + longest response "
                         f"({spec.env.max_prompt_tokens} + {spec.longest_response} = {need}): long turns would be "
                         f"cut; raise sampler.max_seq_len")
    if spec.sampler.top_k or spec.sampler.top_p < 1:
        log.warning("sampler.top_k/top_p truncate the sampling distribution: the trainer's recomputed log-probs "
                    "(temperature only) will not match the sampler's exactly")
