"""Checkpoints of the RL run with orbax: the train state (params, optimiser state, update count) and a JSON record of
everything else a bit-exact resume needs (RL step, seed, task-sampler position, the split, the config).

    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig())
    step = ckpt.latest_step()                               # None: fresh run
    state, meta = ckpt.restore(step, abstract_state)        # abstract_state: ShapeDtypeStructs with shardings
    ckpt.save(step, state, meta)                            # on schedule (every_steps), always at the last step

orbax writes each checkpoint into a temporary directory and renames it when complete, so a process killed mid-save
leaves no half checkpoint that `latest_step` would pick. Every process of a multi-host run calls save/restore.

An asynchronous save returns once the arrays that live on the GPUs are copied to host memory; arrays already in
host memory (an offloaded optimiser state, kevin_jax.rl.offload) are written from where they are, so the caller must
`wait()` before it donates or overwrites them (the trainer waits before each update). At most `concurrent_gb` of
checkpoint data is in flight in host RAM while writing or reading. Arrays restore straight into the memory their
target sharding names (pinned_host for an offloaded state), shard by shard: never whole on one device.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

from kevin_jax.run_config import CheckpointConfig

log = logging.getLogger(__name__)


class CheckpointSpaceError(RuntimeError):
    """The checkpoint directory's volume has less free space than one checkpoint of the train state."""


def checkpoint_bytes(state: Any) -> int:
    """Bytes this process writes for `state` (its addressable shards, one replica of each)."""
    total = 0
    for leaf in jax.tree.leaves(state):
        if isinstance(leaf, jax.Array):
            total += sum(s.data.nbytes for s in leaf.addressable_shards if s.replica_id == 0)
        else:
            total += getattr(leaf, "nbytes", 0)
    return total


def check_space(directory: str | os.PathLike, needed: int) -> None:
    """CheckpointSpaceError, naming the numbers and the way out, when `directory` cannot hold `needed` bytes."""
    path = os.fspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    free = shutil.disk_usage(path).free
    if free < needed:
        raise CheckpointSpaceError(
            f"a checkpoint of this train state takes {needed / 1e9:.1f} GB but {os.fspath(directory)} has "
            f"{free / 1e9:.1f} GB free: point --config.ckpt.dir at a volume with room for max_to_keep + 1 "
            f"checkpoints, or run without checkpoints (--config.ckpt.enabled=False; the run cannot resume)")


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, config: CheckpointConfig = CheckpointConfig()):
        self.directory = os.path.abspath(os.fspath(directory))
        self.config = config
        self.last_save_s: float | None = None    # wall time of the last completed save (start to committed)
        self._save_started: float | None = None
        kwargs = dict(max_to_keep=config.max_to_keep or None, enable_async_checkpointing=config.async_save,
                      create=True)
        options = ocp.CheckpointManagerOptions(**kwargs)
        if config.async_save:
            try:    # orbax >= 0.11: a callback when an asynchronous save is committed
                options = ocp.CheckpointManagerOptions(
                    **kwargs, async_options=ocp.AsyncOptions(post_finalization_callback=self._saved))
            except TypeError:
                pass
        gb = config.concurrent_gb
        handlers = {"state": ocp.PyTreeCheckpointHandler(save_concurrent_gb=gb, restore_concurrent_gb=gb),
                    "meta": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def _saved(self) -> None:
        if self._save_started is not None:
            self.last_save_s = time.perf_counter() - self._save_started

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def due(self, step: int, last_step: int) -> bool:
        return self.config.enabled and (step % self.config.every_steps == 0 or step == last_step)

    def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None:
        """Starts saving (asynchronously when configured); the previous save is completed first. Raises
        CheckpointSpaceError, before writing anything, when the volume cannot hold it."""
        self.manager.wait_until_finished()
        check_space(self.directory, checkpoint_bytes(state))
        self._save_started = time.perf_counter()
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state),
                                                        meta=ocp.args.JsonSave(dict(meta))), force=True)
        if not self.config.async_save:
            self._saved()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """(state, meta) of checkpoint `step`, each array restored into its target's sharding and memory kind."""
        restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_state)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(item=abstract_state, restore_args=restore_args),
            meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def restore_numpy(self, step: int) -> tuple[Any, dict]:
        """(state as numpy arrays, meta) of checkpoint `step`, without a target (inspection, tests)."""
        metadata = self.manager.item_metadata(step)["state"]
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(restore_args=restore_args), meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def state_keys(self, step: int) -> set[str]:
        """Top-level keys of checkpoint `step`'s train state ("master" marks an offloaded optimiser state)."""
        return set(self.manager.item_metadata(step)["state"].keys())

    def restore_meta(self, step: int) -> dict:
        restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def wait(self) -> float:
        """Blocks until the last save is committed; returns the seconds waited."""
        t0 = time.perf_counter()
        self.manager.wait_until_finished()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
