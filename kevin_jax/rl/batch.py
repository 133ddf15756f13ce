"""From trajectories to update batches: one sample per turn (prompt + response), packed into rows, cut into
micro-batches of bucketed shapes.

A sample's row holds prompt + response tokens as one segment (segment ids 1, 2, ... per row; 0 = padding), with
positions restarting at 0 per segment. The target of position i is the token at i + 1 of the same segment; only
targets that are response tokens (the model's own) carry a loss: position p - 1 + j predicts response token j.

Shapes: the row length is rl.row_len, or a power of two >= the longest sample (at least `min_row_len`); rows per micro-batch is a
power of two (a multiple of the data-parallel device count) fitting `micro_batch_tokens`, so a run compiles the update
for a handful of shapes only. Padding rows have zero weight.

Bucketed rows (rl.pack=False with rl.row_len_step > 0): every micro-batch has its own row length. Samples are sorted
by length, longest first, and cut into micro-batches in that order; a micro-batch's rows are as long as its longest
sample rounded up to a multiple of row_len_step, and it holds as many rows as fit micro_batch_tokens (a multiple of the
data-parallel device count; the last one only a power of two >= the samples left). A few long samples then pad only
their own micro-batch, not the whole batch, and every row still holds one right-padded sample (cuDNN flash
attention, causal blocks skipped). The shapes are a function of the row length (and for a batch's last micro-batch
of the samples left): a run compiles about one per multiple of row_len_step up to its longest sample.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

import numpy as np

from kevin_jax.env.trajectory import Trajectory
from kevin_jax.rl.loss import RLConfig, aggregation_weights

FIELDS_INT = ("tokens", "segment_ids", "positions", "targets")
FIELDS_FLOAT = ("loss_weights", "advantages", "sampler_logprobs", "trainer_old_logprobs", "ref_logprobs")


@dataclasses.dataclass
class Sample:
    """One turn of one trajectory as the update sees it."""
    prompt_tokens: Sequence[int]
    response_tokens: Sequence[int]
    response_logprobs: Sequence[float]
    advantage: float
    weight: float = 0.0          # aggregation weight of each response token (set by `make_samples`)

    def __post_init__(self):
        if len(self.response_tokens) != len(self.response_logprobs):
            raise ValueError(f"sample has {len(self.response_tokens)} response tokens but "
                             f"{len(self.response_logprobs)} log-probs")
        if not len(self.prompt_tokens):
            raise ValueError("sample has an empty prompt: the first response token would have no context")

    def __len__(self) -> int:
        return len(self.prompt_tokens) + len(self.response_tokens)


@dataclasses.dataclass
class SampleSet:
    samples: list[Sample]        # the samples that go into the update
    total: int                   # samples of the batch (the denominators count all of them)
    skipped_zero_advantage: int


def make_samples(trajectories: Iterable[Trajectory], config: RLConfig, constant_length: int) -> SampleSet:
    """One sample per turn of every trajectory, with aggregation weights computed over the whole batch; samples
    with advantage 0 are dropped afterwards when config.skips_zero_advantage."""
    samples = []
    for traj in trajectories:
        for t in traj.turns:
            samples.append(Sample(list(t.prompt_tokens), list(t.response_tokens), list(t.response_logprobs),
                                  float(t.advantage)))
    weights = aggregation_weights(np.array([len(s.response_tokens) for s in samples]), config.loss_aggregation,
                                  constant_length)
    for s, w in zip(samples, weights):
        s.weight = float(w)
    kept = [s for s in samples if s.advantage != 0.0] if config.skips_zero_advantage else samples
    return SampleSet(kept, len(samples), len(samples) - len(kept))


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def pack_rows(lengths: Sequence[int], row_len: int, pack: bool) -> list[list[int]]:
    """Sample indices per row: first-fit decreasing into rows of `row_len` tokens (or one sample per row)."""
    if any(n > row_len for n in lengths):
        raise ValueError(f"a sample of {max(lengths)} tokens does not fit rows of {row_len}")
    if not pack:
        return [[i] for i in range(len(lengths))]
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(row_len - lengths[i])
    return rows


def _empty(rows: int, row_len: int) -> dict[str, np.ndarray]:
    out = {k: np.zeros((rows, row_len), np.int32) for k in FIELDS_INT}
    out.update({k: np.zeros((rows, row_len), np.float32) for k in FIELDS_FLOAT})
    out["loss_mask"] = np.zeros((rows, row_len), bool)
    return out


def _fill_row(mb: dict[str, np.ndarray], r: int, samples: Sequence[Sample]) -> None:
    offset = 0
    for seg, s in enumerate(samples, start=1):
        p, n = len(s.prompt_tokens), len(s)
        seq = np.concatenate([np.asarray(s.prompt_tokens, np.int32), np.asarray(s.response_tokens, np.int32)])
        sl = slice(offset, offset + n)
        mb["tokens"][r, sl] = seq
        mb["segment_ids"][r, sl] = seg
        mb["positions"][r, sl] = np.arange(n, dtype=np.int32)
        mb["targets"][r, offset:offset + n - 1] = seq[1:]
        loss = slice(offset + p - 1, offset + n - 1)          # positions predicting the response tokens
        mb["loss_mask"][r, loss] = True
        mb["loss_weights"][r, loss] = s.weight
        mb["advantages"][r, loss] = s.advantage
        mb["sampler_logprobs"][r, loss] = np.asarray(s.response_logprobs, np.float32)
        offset += n


@dataclasses.dataclass
class Layout:
    row_len: int                 # the longest row (bucketed: the first micro-batch's)
    rows_per_micro: int          # rows of the micro-batch with the longest rows
    num_rows: int                # real rows (the rest of the last micro-batch is padding)
    num_micro: int
    shapes: list[tuple[int, int]] | None = None    # bucketed: (rows, row length) of each micro-batch

    def micro_shapes(self) -> list[tuple[int, int]]:
        return self.shapes if self.shapes is not None else [(self.rows_per_micro, self.row_len)] * self.num_micro

    @property
    def padded_tokens(self) -> int:
        return sum(rows * length for rows, length in self.micro_shapes())


def bucket_len(n: int, step: int, min_row_len: int, max_row_len: int | None) -> int:
    """A bucketed row's length: n rounded up to a multiple of `step` (at least min_row_len), but never past
    max_row_len where n fits it (the context need not be a multiple of the step)."""
    length = max(min_row_len, -(-n // step) * step)
    if max_row_len is not None and n <= max_row_len < length:
        length = max_row_len
    return length


def rows_for(row_len: int, micro_batch_tokens: int, row_divisor: int) -> int:
    """Rows of a bucketed micro-batch: as many as fit micro_batch_tokens, a multiple of row_divisor (at least one per
    data-parallel device)."""
    return max(row_divisor, micro_batch_tokens // row_len // row_divisor * row_divisor)


def plan_buckets(lengths: Sequence[int], config: RLConfig, row_divisor: int = 1,
                 max_row_len: int | None = None) -> tuple[Layout, list[list[int]]]:
    """The bucketed layout (module docstring): one sample per row, micro-batches of samples of similar length.
    Returns the layout and the sample index of each row, micro-batch after micro-batch (the rows of micro-batch m
    are rows[sum of the earlier micro-batches' rows:][:shapes[m][0]], the real ones first)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    shapes: list[tuple[int, int]] = []
    rows: list[list[int]] = []
    k = 0
    while k < len(order):
        length = bucket_len(lengths[order[k]], config.row_len_step, config.min_row_len, max_row_len)
        count = rows_for(length, config.micro_batch_tokens, row_divisor)
        left = len(order) - k
        if left < count:        # the last micro-batch (or a small batch): a power of two of rows, not all padding
            count = min(count, -(-next_pow2(left) // row_divisor) * row_divisor)
        chosen = order[k:k + count]
        shapes.append((count, length))
        rows += [[i] for i in chosen] + [[] for _ in range(count - len(chosen))]
        k += count
    if not shapes:
        shapes = [(row_divisor, config.min_row_len)]
        rows = [[] for _ in range(row_divisor)]
    return Layout(shapes[0][1], shapes[0][0], len(lengths), len(shapes), shapes), rows


def plan_layout(lengths: Sequence[int], config: RLConfig, row_divisor: int = 1,
                max_row_len: int | None = None) -> tuple[Layout, list[list[int]]]:
    """max_row_len: cap of the automatic row length (the longest possible sample, e.g. the sampler's context), so
    that a 39k-token sample gets a 40k row rather than a 64k one. With rl.row_len_step (and rl.pack=False) the
    bucketed layout of `plan_buckets`."""
    if config.row_len_step and not config.pack:
        return plan_buckets(lengths, config, row_divisor, max_row_len)
    longest = max(lengths, default=1)
    if config.row_len:
        if longest > config.row_len:
            raise ValueError(f"a sample of {longest} tokens is longer than rl.row_len={config.row_len}")
        row_len = config.row_len
    else:
        row_len = max(config.min_row_len, next_pow2(longest))
        if max_row_len is not None and longest <= max_row_len < row_len:
            row_len = max_row_len
    rows = pack_rows(lengths, row_len, config.pack)
    cap = max(1, config.micro_batch_tokens // row_len)
    rows_per_micro = min(next_pow2(cap + 1) // 2, next_pow2(max(1, len(rows))))   # power of two <= cap
    rows_per_micro = max(row_divisor, rows_per_micro // row_divisor * row_divisor)
    num_micro = max(1, math.ceil(len(rows) / rows_per_micro))
    return Layout(row_len, rows_per_micro, len(rows), num_micro), rows


def micro_batches(samples: Sequence[Sample], config: RLConfig, row_divisor: int = 1,
                  max_row_len: int | None = None) -> tuple[list[dict[str, np.ndarray]], Layout]:
    """Packs samples into micro-batches of shape [rows_per_micro, row_len] (bucketed: each its own shape,
    layout.shapes).

    row_divisor: rows per micro-batch is made a multiple of it (the data-parallel device count)."""
    layout, rows = plan_layout([len(s) for s in samples], config, row_divisor, max_row_len)
    out = []
    first = 0
    for count, length in layout.micro_shapes():
        mb = _empty(count, length)
        for r, row in enumerate(rows[first:first + count]):
            _fill_row(mb, r, [samples[i] for i in row])
        out.append(mb)
        first += count
    return out, layout
