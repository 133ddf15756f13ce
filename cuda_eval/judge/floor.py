"""The least time the hardware allows for one call of a task, and the share of the roofline a time reaches (judge
process; imports torch). docs/EVALUATOR.md, "Timing", says how the judge uses them.

What a call must do, whatever the kernel: write its outputs, and read the inputs and weights its outputs depend on.
`needs()` finds both from the reference, once per task and judge:
- the bytes read: one forward under `ReadTracer` (a dispatch mode that notes, per storage, the largest tensor any op
  reads from it: a slice that an op reads counts as the slice, a tensor only viewed or allocated counts nothing), then
  for each input leaf a forward with that leaf alone drawn again: a leaf whose change leaves the output bit for bit
  the same is not needed (softmax over a dimension of size one, an operand multiplied by zero);
- the FLOPs: torch.utils.flop_counter.FlopCounterMode in the same forward (matmuls, convolutions, attention: it
  counts no elementwise work, so it is a lower bound of what the reference does, and a kernel may need fewer).
Bytes give a hard floor (`floor_ms`): the card cannot move them faster than its copy bandwidth, measured by the judge
at start-up, allowing MARGIN over it and two L2's worth that may be served or left in the cache. FLOPs give no floor
(a diagonal matmul needs a fraction of the reference's), only the roofline (`roofline_ms`): bytes at the copy
bandwidth or FLOPs at the measured tensor-core peak, whichever takes longer; `peak_fraction` = roofline / time.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# A report below bytes / (MARGIN x copy bandwidth) is physically impossible. A device-to-device copy (what the
# bandwidth is measured with) reaches ~89% of an H100's or H200's DRAM peak (3.0 of 3.35 TB/s; 4.25 of 4.8), so no
# kernel moves bytes more than ~1.13x faster than it; the honest corpus reached at most 0.82x (softmax_rowwise,
# docs/EVALUATOR.md "Profile feedback"). 1.5 leaves a third on top of the physical limit for clocks, DRAM refresh and
# measurement noise of the bandwidth itself.
MARGIN = 1.5
L2_COPIES = 2      # bytes that may stay in (or come from) L2 at the end of a call: two L2's worth
INPUT_PERTURB_MAX_BYTES = 4 << 30   # above this, input leaves are not drawn again one by one (every read leaf counts)

# ATen ops that only allocate, view or describe: they read no data of their tensor arguments.
NO_READ_OPS = frozenset("""
    empty empty_like empty_strided empty_permuted new_empty new_empty_strided zeros zeros_like ones ones_like full
    full_like new_zeros new_ones new_full scalar_tensor arange fill zero resize set detach alias view _unsafe_view
    reshape _reshape_alias as_strided expand permute transpose t squeeze unsqueeze select slice narrow flatten
    unflatten split split_with_sizes chunk unbind view_as_real view_as_complex sym_size sym_stride sym_numel
    sym_storage_offset is_contiguous dim size stride numel is_same_size record_stream
    _has_compatible_shallow_copy_type expand_as view_as reshape_as unsafe_split unsafe_chunk lift_fresh set_data
    resolve_conj resolve_neg conj _conj _neg_view normal uniform random bernoulli rand randn randint rand_like
    randn_like randint_like
""".split())


def _op_name(func) -> str:
    name = getattr(getattr(func, "overloadpacket", None), "__name__", None) or str(func).split(".")[-2]
    name = name.split("::")[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _tensors(items) -> list[torch.Tensor]:
    out = []
    for x in items:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(_tensors(x))
    return out


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds at most: its elements, or its storage when a broadcast view repeats them."""
    try:
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


class ReadTracer(TorchDispatchMode):
    """Per storage (by address), the largest tensor any ATen op read from it."""

    def __init__(self):
        super().__init__()
        self.read: dict[int, int] = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _op_name(func) not in NO_READ_OPS:
            for t in _tensors(list(args) + list(kwargs.values())):
                key = _storage_key(t)
                if key:
                    self.read[key] = max(self.read.get(key, 0), tensor_bytes(t))
        return func(*args, **kwargs)

    def bytes_of(self, t: torch.Tensor) -> int:
        """What the traced forward read of `t`: at most its size, nothing if no op read its storage."""
        return min(tensor_bytes(t), self.read.get(_storage_key(t) or -1, 0))


@dataclasses.dataclass
class Needs:
    """What one call of the task must do at the least, per the reference (plain numbers: kept per task and judge)."""
    output_bytes: int            # written (a broadcast output counts its storage)
    input_bytes: int             # read: the input leaves the output depends on, as much of each as an op read
    param_bytes: int             # read: the weights and buffers an op read
    flops: float | None          # FlopCounterMode's count, None where it counts none
    inputs_perturbed: bool       # whether the dependence on each input leaf was tested (else every read leaf counts)
    independent_leaves: int = 0  # input leaves the output does not depend on
    params_needed: bool = True   # whether the output changed when every weight was perturbed at once

    @property
    def bytes(self) -> int:
        return self.output_bytes + self.input_bytes + self.param_bytes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"bytes": self.bytes}


def needs(run: Callable[[Any], Any], inputs: list, fresh_inputs: Callable[[], list], params: list[torch.Tensor],
          digest: Callable[[Any], str]) -> Needs:
    """`run(inputs)`: the reference's output on `inputs` (seeded the same way every time, on copies where the
    reference changes its inputs); `fresh_inputs()`: another draw of the task's inputs (the same shapes);
    `digest(out)`: an output's digest."""
    from torch.utils.flop_counter import FlopCounterMode
    tracer, counter = ReadTracer(), FlopCounterMode(display=False)
    with counter, tracer:
        out = run(inputs)
    base = digest(out)
    out_bytes = sum(tensor_bytes(t) for t in _tensors([out]))
    del out
    flops = float(counter.get_total_flops()) or None
    leaves = [(i, t) for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    read = {i: tracer.bytes_of(t) for i, t in leaves}
    param_bytes, seen = 0, set()
    for p in params:
        key = _storage_key(p)
        if key not in seen:
            seen.add(key)
            param_bytes += tracer.bytes_of(p)
    params_needed = True
    if param_bytes:
        params_needed = _depends_on_params(run, inputs, params, digest, base)
        if not params_needed:
            param_bytes = 0
    perturb = sum(tensor_bytes(t) for _, t in leaves) <= INPUT_PERTURB_MAX_BYTES
    independent = 0
    if perturb and any(read.values()):
        other = fresh_inputs()
        for i, t in leaves:
            alt = other[i] if i < len(other) else None
            if not read[i] or not isinstance(alt, torch.Tensor) or alt.shape != t.shape or alt.dtype != t.dtype \
                    or torch.equal(alt, t):
                continue   # (a leaf that draws the same every time cannot be tested: it counts)
            swapped = list(inputs)
            swapped[i] = alt
            if digest(run(swapped)) == base:
                read[i] = 0
                independent += 1
        del other
    return Needs(output_bytes=int(out_bytes), input_bytes=int(sum(read.values())), param_bytes=int(param_bytes),
                 flops=flops, inputs_perturbed=perturb, independent_leaves=independent,
                 params_needed=params_needed)


def _depends_on_params(run, inputs, params: list[torch.Tensor], digest, base: str) -> bool:
    """Whether the output changes when every floating-point weight and buffer gets random noise of its own size
    (all at once; restored bit for bit afterwards): a task whose output does not depend on its weights (a GEMM whose
    result a later reduction cancels) needs none of them read."""
    floats = [p for p in params if p.is_floating_point() and p.numel()]
    if not floats:
        return True
    saved = [p.detach().clone() for p in floats]
    gen = torch.Generator(device=floats[0].device).manual_seed(1234)
    try:
        with torch.no_grad():
            for p in floats:
                noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
                p.add_((noise * (p.detach().float().abs().mean() + 1e-3)).to(p.dtype))
        return digest(run(inputs)) != base
    finally:
        with torch.no_grad():
            for p, s in zip(floats, saved):
                p.copy_(s)


def floor_ms(needed_bytes: int, copy_bytes_per_s: float | None, l2_bytes: int | None,
             margin: float = MARGIN) -> float | None:
    """The least milliseconds a call that moves `needed_bytes` can take on the card: what is beyond L2_COPIES L2's
    worth, at `margin` x the copy bandwidth (bytes read + written per second). None without a bandwidth."""
    if not copy_bytes_per_s or copy_bytes_per_s <= 0:
        return None
    beyond = max(0, int(needed_bytes) - L2_COPIES * int(l2_bytes or 0))
    return beyond / (margin * float(copy_bytes_per_s)) * 1e3


def roofline_ms(needed_bytes: int, flops: float | None, copy_bytes_per_s: float | None,
                peak_flops_per_s: float | None) -> float | None:
    """The roofline's time for a call: its bytes at the copy bandwidth or its FLOPs at the tensor-core peak, whichever
    takes longer (no margin, no L2 discount). None where neither is known."""
    parts = []
    if copy_bytes_per_s and copy_bytes_per_s > 0:
        parts.append(needed_bytes / float(copy_bytes_per_s) * 1e3)
    if flops and peak_flops_per_s and peak_flops_per_s > 0:
        parts.append(flops / float(peak_flops_per_s) * 1e3)
    return max(parts) if parts else None


def peak_fraction(roofline: float | None, time_ms: float | None) -> float | None:
    """The share of the roofline a call of `time_ms` reached (1.0: at the roofline)."""
    if not roofline or not time_ms or time_ms <= 0:
        return None
    return roofline / float(time_ms)
