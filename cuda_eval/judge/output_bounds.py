"""How large the candidate's outputs may be and where they land: the output buffer, the worker's memory, a card too
small for the task. A part of the judge's Job (judge/job.py), by role: its methods run on the Job.
"""
from __future__ import annotations

import os

import torch

from cuda_eval.judge.shared import TaskTooLarge
from cuda_eval.protocol import channel, wire
from cuda_eval.protocol.channel import ChannelError


OUTPUT_SLACK_BYTES = 1 << 16  # the output buffer's room beyond the reference's outputs (a few small extra leaves)
DEVICE_CONTEXTS_BYTES = 2 << 30  # device memory of the CUDA contexts beside the judge's (worker, spares): an estimate


class OutputBounds:
    """The Job's methods of this role (judge/job.py assembles the Job from these classes)."""

    def _card_too_small(self, message: str) -> TaskTooLarge | None:
        """A candidate that ran out of device memory where even the least a candidate's worker holds
        (`worker_least_bytes`) does not fit beside what the judge holds for the reference: the card's limit, not the
        candidate's doing."""
        if self.device.type != "cuda" or "out of memory" not in message.lower() or \
                not hasattr(self, "output_bytes"):
            return None
        total = torch.cuda.get_device_properties(self.device.torch_device).total_memory
        held = torch.cuda.memory_reserved()
        least = self.worker_least_bytes()
        if held + least + DEVICE_CONTEXTS_BYTES <= total:
            return None
        return TaskTooLarge("device memory", f"the candidate ran out of device memory, and a candidate's process "
                            f"holds at least {least / 2**30:.2f} GiB (a call's inputs and output, the previous "
                            f"call's output, the weights) beside the {held / 2**30:.2f} GiB the reference's side "
                            f"holds, on a card of {total / 2**30:.2f} GiB", held + least + DEVICE_CONTEXTS_BYTES, total)

    def worker_least_bytes(self) -> int:
        """Device memory the candidate's worker holds at the least while a call runs, whatever the candidate does:
        the call's inputs and output, the previous call's output (kept alive so that its memory is never handed to
        the next call) and the weights. (A group of several calls holds more, but only where a call's inputs and
        output are small: _group_size.)"""
        return self.input_bytes + 2 * self.output_bytes + self.param_bytes

    def max_output_bytes(self) -> int:
        """What the judge accepts from the worker per output message: up to twice the reference's output (a
        wrong-sized output is still compared). A large output: what the output buffer holds, no more (the host
        memory granted to the job covers one copy of that; an output that does not fit the reference's layout has
        other shapes or dtypes than the reference's and is wrong anyway)."""
        if self.large_output:
            return self.output_buffer_bytes()
        return 2 * self.output_bytes + (1 << 16)

    def output_buffer_bytes(self) -> int:
        return wire.layout_bytes(self.output_sizes) + OUTPUT_SLACK_BYTES

    def output_buffer(self) -> wire.SharedBuffer:
        """The job's output buffer: room for the reference's outputs, laid out as wire.pack lays them out (a larger
        output goes through the socket, up to max_output_bytes). The pool makes it (channel.output_memfd), where no
        limit meant for the candidate applies, and refuses it when the host cannot hold it together with our host
        copies of the outputs (one at a time when large, two trials' when small): TaskTooLarge."""
        size = self.output_buffer_bytes()
        # our host copies of the candidate's outputs at once (on a GPU they go to the card when it has room)
        copies = size if self.large_output else (0 if self.device.type == "cuda" else 2 * size)
        self.meta["output_buffer_bytes"] = size
        if self.ctl is None:
            return wire.SharedBuffer(size)
        try:
            channel.send(self.ctl, {"op": "output_buffer", "bytes": size, "host_bytes": copies})
            header, fd = channel.recv_fd(self.ctl)
        except (ChannelError, OSError) as e:   # the pool is gone: this job's verdict cannot be delivered anyway
            raise RuntimeError(f"no output buffer from the pool ({e})")
        if header.get("ok") and fd is not None:
            return wire.SharedBuffer(fd=fd)
        if fd is not None:
            os.close(fd)
        raise TaskTooLarge("host memory", str(header.get("error", "refused"))[:500],
                           header.get("needed_bytes"), header.get("available_bytes"))
