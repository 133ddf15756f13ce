"""Which training tasks each RL step uses: a deterministic function of (seed, step), so a resumed run draws exactly
what an uninterrupted one would have.

Epoch e is a permutation of the (sorted) training task ids seeded by (seed, e); it is cut into
floor(num_tasks / tasks_per_step) steps of distinct tasks, and the remainder of the permutation is left out of that
epoch (a different remainder every epoch). Step s (counted from 1) is slot (s - 1) % steps_per_epoch of epoch
(s - 1) // steps_per_epoch. The sampler's position is therefore just the step, and it is checkpointed with it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

_STREAM = 0x7A5C  # separates this random stream from the others derived from the run's seed


class TaskSampler:
    def __init__(self, task_ids: Sequence[str], tasks_per_step: int, seed: int):
        ids = sorted(set(task_ids))
        if len(ids) != len(task_ids):
            raise ValueError("training task ids must be unique")
        if tasks_per_step <= 0:
            raise ValueError(f"tasks_per_step must be positive, got {tasks_per_step}")
        if tasks_per_step > len(ids):
            raise ValueError(f"rl.tasks_per_step={tasks_per_step} but the training split has only {len(ids)} tasks")
        self.task_ids = ids
        self.tasks_per_step = tasks_per_step
        self.seed = int(seed)
        self.steps_per_epoch = len(ids) // tasks_per_step

    def epoch_order(self, epoch: int) -> list[str]:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, _STREAM]))
        return [self.task_ids[i] for i in rng.permutation(len(self.task_ids))]

    def tasks_for_step(self, step: int) -> list[str]:
        if step < 1:
            raise ValueError(f"steps count from 1, got {step}")
        epoch, slot = divmod(step - 1, self.steps_per_epoch)
        order = self.epoch_order(epoch)
        return order[slot * self.tasks_per_step:(slot + 1) * self.tasks_per_step]

    def state(self, step: int) -> dict:
        """What a checkpoint records: the next step to draw for and the stream's definition."""
        epoch, slot = divmod(step, self.steps_per_epoch)
        return {"next_step": step + 1, "epoch": epoch, "slot": slot, "seed": self.seed,
                "tasks_per_step": self.tasks_per_step, "num_tasks": len(self.task_ids)}
