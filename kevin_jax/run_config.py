"""The run config: one dataclass per section, built from an ml_collections ConfigDict (configs/*.py) by `parse_config`.

Every section is a plain dataclass owned by the component that reads it (SECTIONS), so `--config.<section>.<field>`
reaches that component unchanged; the few sections read by the programs themselves (where the policy comes from,
the tokenizer, held-out evaluation) are defined here. Unknown sections or fields are errors that name them.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

from cuda_eval.api import EvalConfig
from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import logs, parallel
from kevin_jax.env.episode import EnvConfig
from kevin_jax.env.reward import RewardConfig
from kevin_jax.model import qwen2
from kevin_jax.placement import GpuConfig
from kevin_jax.rl import state as rl_state
from kevin_jax.rl.loss import RLConfig
from kevin_jax.sampler.config import SamplerConfig
from kevin_jax.sft import WarmStartConfig
from kevin_jax.tasks import TasksConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ModelSource:
    """Where the policy comes from (config section `model`, together with qwen2.ModelOptions' fields).

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
    "model": (ModelSource, qwen2.ModelOptions), "tokenizer": (TokenizerConfig,), "tasks": (TasksConfig,),
    "env": (EnvConfig,), "reward": (RewardConfig,), "sampler": (SamplerConfig,), "eval": (EvalConfig,),
    "rl": (RLConfig,), "optim": (rl_state.OptimConfig,), "mesh": (parallel.ParallelConfig,), "gpu": (GpuConfig,),
    "log": (logs.LogConfig,), "ckpt": (ckpt_lib.CheckpointConfig,), "holdout": (HoldoutConfig,),
    "warm_start": (WarmStartConfig,),
}
TOP_LEVEL = {"seed": int, "total_steps": int, "response_schedule": str}


@dataclasses.dataclass
class RunSpec:
    """The typed form of a run config: one dataclass per section."""
    model: ModelSource
    model_options: qwen2.ModelOptions
    tokenizer: TokenizerConfig
    tasks: TasksConfig
    env: EnvConfig
    reward: RewardConfig
    sampler: SamplerConfig
    eval: EvalConfig
    rl: RLConfig
    optim: rl_state.OptimConfig
    mesh: parallel.ParallelConfig
    gpu: GpuConfig
    log: logs.LogConfig
    ckpt: ckpt_lib.CheckpointConfig
    holdout: HoldoutConfig
    warm_start: WarmStartConfig
    seed: int
    total_steps: int
    response_schedule: tuple[tuple[int, int], ...]

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


def as_dict(config: Any) -> dict:
    """A ConfigDict (or a mapping) as plain nested dicts, e.g. to write it next to a run's outputs."""
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _build(types: tuple[type, ...], values: Mapping[str, Any], name: str) -> list[Any]:
    fields = [{f.name for f in dataclasses.fields(t)} for t in types]
    unknown = sorted(set(values) - set().union(*fields))
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
        parts = _build(types, as_dict(values.get(name, {})), name)
        if name == "model":
            built["model"], built["model_options"] = parts
        else:
            built[name] = parts[0]
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
