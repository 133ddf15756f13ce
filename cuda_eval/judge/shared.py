"""What several roles of a judge's job share (judge/job.py assembles the Job from them): the verdict
exceptions, the judge's clock alias and the constants more than one role reads."""
from __future__ import annotations

import time

import torch


_monotonic = time.monotonic
GATE_START_MS, GATE_MAX_MS = 1.0, 250.0
CONTROL_MESSAGE_BYTES = 1 << 20
REFERENCE_PROFILES_KEPT = 256  # reference profiles kept per judge (a task's reference is profiled once per judge)


class WorkerLost(Exception):
    """The worker stopped answering (crashed, exited, hung) or broke the protocol."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class TaskTooLarge(Exception):
    """The machine cannot hold what judging this task takes (`resource`: "host memory" or "device memory"): a
    task-level verdict, like a reference that runs out of memory, never the candidate's fault or ours."""

    def __init__(self, resource: str, message: str, needed: int | None = None, available: int | None = None):
        super().__init__(message)
        self.resource, self.message, self.needed, self.available = resource, message, needed, available


class _EmptyTensor:
    """A tensor's shape, strides and dtype: what the judge's replay allocates in its place (as cheaply as
    empty_like: the replay's empty call is the protocol's cost that is deducted from the candidate's)."""
    __slots__ = ("shape", "stride", "dtype")

    def __init__(self, t: torch.Tensor):
        self.shape, self.stride, self.dtype = tuple(t.shape), t.stride(), t.dtype
