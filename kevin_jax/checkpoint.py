"""Checkpoints of the RL run with orbax: the train state (params, optimiser state, update count) and a JSON record of
everything else a bit-exact resume needs (RL step, seed, task-sampler position, the split, the config).

    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig())
    step = ckpt.latest_step()                               # None: fresh run
    state, meta = ckpt.restore(step, abstract_state)        # abstract_state: ShapeDtypeStructs with shardings
    ckpt.save(step, state, meta)                            # on schedule (every_steps), always at the last step

orbax writes each checkpoint into a temporary directory and renames it when complete, so a process killed mid-save
leaves no half checkpoint that `latest_step` would pick. Every process of a multi-host run calls save/restore.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CheckpointConfig:
    """Checkpoints (config section `ckpt`).

    every_steps: save after every this many RL steps (and always after the last one).
    max_to_keep: newest checkpoints kept on disk (0 = all).
    async_save: write in a background thread while the next step runs (orbax AsyncCheckpointer).
    """
    every_steps: int = 1
    max_to_keep: int = 3
    async_save: bool = True

    def __post_init__(self):
        if self.every_steps <= 0:
            raise ValueError(f"ckpt.every_steps must be positive, got {self.every_steps}")
        if self.max_to_keep < 0:
            raise ValueError(f"ckpt.max_to_keep must be >= 0 (0 = keep all), got {self.max_to_keep}")


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, config: CheckpointConfig = CheckpointConfig()):
        self.directory = os.path.abspath(os.fspath(directory))
        self.config = config
        options = ocp.CheckpointManagerOptions(max_to_keep=config.max_to_keep or None,
                                               enable_async_checkpointing=config.async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def due(self, step: int, last_step: int) -> bool:
        return step % self.config.every_steps == 0 or step == last_step

    def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None:
        """Starts saving (asynchronously when configured); the previous save is completed first."""
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(dict(meta))), force=True)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def restore_meta(self, step: int) -> dict:
        restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
