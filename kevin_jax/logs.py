"""What a run leaves behind and prints: TensorBoard scalars (without TensorFlow), metrics JSONL, FLOP/MFU accounting
and the console progress line.

    writer = MetricWriter(workdir, prefix="compile_only/" or "")   # process 0 writes, others no-op
    writer.restart(step)                  # on resume: TensorBoard drops points the killed run wrote at >= step
    writer.write(step, {"rollout/score_mean": 0.4, ...})

Files in the workdir: tensorboard/events.out.tfevents.* (TensorBoard), metrics.jsonl (one {"step", ...} object per
step; after a resume a step may appear twice, the later line wins); the trainer writes trajectories/step_000001.jsonl
with kevin_jax.env.trajectory.write_trajectories (Contract 4, one file per step, replaced atomically, so a re-run step
overwrites rather than duplicates).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Mapping, Sequence

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LogConfig:
    """Logging (config section `log`).

    tensorboard: write TensorBoard event files under <workdir>/tensorboard.
    trajectories: write every trajectory (prompt, response tokens and text, verdict, timings) as JSONL per step.
    progress: show a progress bar on the console (process 0).
    thought_prefix: how the base model's thoughts usually start (QwQ: "Okay"); the share of thoughts that do not is
      logged as rollout/not_okay_ratio (Kevin's early warning of collapse).
    """
    tensorboard: bool = True
    trajectories: bool = True
    progress: bool = True
    thought_prefix: str = "Okay"


# ------------------------------------------------------------------------------------------------ TensorBoard
class TensorBoardWriter:
    """Scalar summaries in TensorBoard's event-file format, using the `tensorboard` package only."""

    def __init__(self, logdir: str | os.PathLike):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        os.makedirs(logdir, exist_ok=True)
        self._writer = EventFileWriter(os.fspath(logdir))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()
                                 if v is not None and math.isfinite(float(v))])
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def restart(self, step: int) -> None:
        """SessionLog START at `step`: TensorBoard discards the earlier points of this run at steps >= step (written
        by a process that was killed before its checkpoint)."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self._writer.add_event(Event(wall_time=time.time(), step=int(step),
                                     session_log=SessionLog(status=SessionLog.START)))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """All scalars in a TensorBoard log dir as {tag: [(step, value), ...]} (honouring restarts), for tests/tools."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.fspath(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class MetricWriter:
    """TensorBoard + metrics.jsonl, with one prefix on every tag (e.g. "compile_only/" for CPU runs). Only the
    writing process (process 0 of a multi-host run) touches files."""

    def __init__(self, workdir: str | os.PathLike, config: LogConfig = LogConfig(), prefix: str = "",
                 is_writer: bool = True):
        self.workdir = Path(workdir)
        self.prefix = prefix
        self.is_writer = is_writer
        self.tb = TensorBoardWriter(self.workdir / "tensorboard") if (is_writer and config.tensorboard) else None
        self.jsonl = self.workdir / "metrics.jsonl"

    def tag(self, name: str) -> str:
        return self.prefix + name

    def restart(self, step: int) -> None:
        if self.tb is not None:
            self.tb.restart(step)

    def write(self, step: int, values: Mapping[str, float]) -> None:
        if not self.is_writer:
            return
        tagged = {self.tag(k): float(v) for k, v in values.items()}
        if self.tb is not None:
            self.tb.scalars(step, tagged)
            self.tb.flush()
        finite = {k: v for k, v in tagged.items() if math.isfinite(v)}
        with open(self.jsonl, "a") as f:
            f.write(json.dumps({"step": int(step), **finite}) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(workdir: str | os.PathLike) -> dict[int, dict[str, float]]:
    """metrics.jsonl as {step: values}; a step written twice (before a kill and after the resume) keeps the last."""
    out: dict[int, dict[str, float]] = {}
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            out[int(record.pop("step"))] = record
    return out


# ------------------------------------------------------------------------------------------------ FLOPs and MFU
# Dense bf16 peak FLOP/s per device (no sparsity), by a substring of jax's device_kind.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12), ("GH200", 989e12),
    ("B200", 2250e12), ("B100", 1750e12), ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12),
    ("A10G", 125e12), ("L4", 121e12),
)


def peak_flops(device_kind: str) -> float | None:
    """Peak bf16 FLOP/s of one device, or None when unknown (e.g. CPU: MFU is then not reported)."""
    for name, flops in PEAK_BF16_FLOPS:
        if name.lower() in device_kind.lower():
            return flops
    return None


@dataclasses.dataclass(frozen=True)
class FlopModel:
    """Model FLOPs of a Qwen2 shape (PaLM-style accounting: matmuls and causal attention, no remat recompute)."""
    matmul_params: int        # N of 2N FLOPs per token forward (layers + LM head; the embedding lookup is free)
    layers: int
    q_heads: int
    head_dim: int

    @classmethod
    def of(cls, config) -> "FlopModel":
        return cls(config.matmul_param_count(), config.num_hidden_layers, config.num_attention_heads,
                   config.head_dim)

    def forward(self, lengths: Sequence[int]) -> float:
        """Forward FLOPs of sequences of these lengths: 2 N T + 2 L H D T^2 (QK^T and PV, causal half)."""
        total = 0.0
        for t in lengths:
            total += 2.0 * self.matmul_params * t + 2.0 * self.layers * self.q_heads * self.head_dim * t * t
        return total

    def train(self, lengths: Sequence[int]) -> float:
        """Forward + backward = 3x forward."""
        return 3.0 * self.forward(lengths)


def mfu(flops: float, seconds: float, num_devices: int, peak: float | None) -> float:
    if not peak or seconds <= 0 or num_devices <= 0:
        return float("nan")
    return flops / (seconds * num_devices * peak)


# ------------------------------------------------------------------------------------------------ memory
def memory_scalars(devices: Sequence) -> dict[str, float]:
    """This process's memory, GB: the peak and current use of each local accelerator (XLA's allocator statistics:
    the peak since the process started; absent on the CPU backend), the process's resident host memory now and its
    high-water mark (pinned host buffers of an offloaded optimiser state are resident, so they count), and the
    whole node's used memory (cuda_eval's worker processes included)."""
    import resource

    import psutil

    out: dict[str, float] = {}
    peaks, in_use = [], []
    for i, device in enumerate(devices):
        try:
            stats = device.memory_stats() or {}
        except Exception:       # backends without allocator statistics
            stats = {}
        if "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"])
            in_use.append(stats.get("bytes_in_use", 0))
            out[f"mem/hbm_peak_gb/gpu{i}"] = stats["peak_bytes_in_use"] / 1e9
    if peaks:
        out["mem/hbm_peak_gb"] = max(peaks) / 1e9
        out["mem/hbm_in_use_gb"] = max(in_use) / 1e9
    out["mem/host_rss_gb"] = psutil.Process().memory_info().rss / 1e9
    out["mem/host_rss_peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9   # Linux: kB
    vm = psutil.virtual_memory()
    out["mem/node_used_gb"] = (vm.total - vm.available) / 1e9
    return out


# ------------------------------------------------------------------------------------------------ console
class Progress:
    """A tqdm bar over RL steps with the headline numbers of the last step (process 0 only)."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool, label: str = ""):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step - 1, desc=f"RL{label}", unit="step",
                            dynamic_ncols=True)

    def update(self, postfix: Mapping[str, str]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
