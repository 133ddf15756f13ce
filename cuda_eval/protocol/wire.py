"""Model outputs as plain data on the wire (channel.py): a JSON tree plus one blob of raw bytes per tensor.

The candidate's worker packs what its forward returned; the judge unpacks it under limits it sets from the reference
output (dtype names from a fixed table, exact byte counts, bounded nesting): nothing the candidate sends is ever
unpickled or executed. Unpacked tensors live on the host; the judge compares them chunk by chunk on its device.
"""
from __future__ import annotations

import builtins
import math
import os
from typing import Any

import torch

_type = builtins.type
_Tensor = torch.Tensor
DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.uint8,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)}
MAX_DEPTH = 8
MAX_LEAVES = 4096


class WireError(ValueError):
    """The packed output is malformed or over its limits."""


ALIGN = 64
PIN_MIN_BYTES = 4 << 20        # smaller buffers copy fast enough unpinned; pinning costs a syscall per page
DEVICE_SNAPSHOT_MAX = 1 << 30  # outputs up to this size are snapshotted straight into the judge's device memory
                               # (it holds two trials' outputs and references at once: bounded); a larger output
                               # too when the judge finds the room for it (unpack's device_budget)


def layout_bytes(sizes: list[int]) -> int:
    """Bytes `pack` needs in a shared buffer for tensors of these byte sizes (each starts ALIGN-aligned)."""
    return sum(-(-int(n) // ALIGN) * ALIGN for n in sizes)


class SharedBuffer:
    """A memfd of a fixed size mapped here (channel.output_memfd: sealed, so neither side can shrink or grow it and
    no access of a mapping can fault). The pool makes it at the judge's request, sized from the reference's output,
    and the judge hands it to the worker, which writes its outputs into it instead of sending them through the
    socket (one copy from the device, no socket copies). The judge copies what it reads out at once: the worker can
    rewrite the buffer at any time. On a GPU both sides page-lock their mapping (`pin`), so the worker's
    device-to-host copy and the judge's host-to-device snapshot are DMA transfers, with no staging through pageable
    memory and no host memcpy in between. `SharedBuffer(size)` makes its own memfd (tests)."""

    def __init__(self, size: int | None = None, fd: int | None = None):
        import mmap
        from cuda_eval.protocol.channel import output_memfd
        if fd is None:
            fd = output_memfd(size)
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.map = mmap.mmap(fd, self.size)
        self.pinned = False
        self._pinned_view: torch.Tensor | None = None

    def pin(self) -> bool:
        """Page-locks the mapping for CUDA (cudaHostRegister). False when it is too small to matter or the driver
        refuses: the copies then go through pageable memory, slower but the same."""
        if self.pinned:
            return True
        if self.size < PIN_MIN_BYTES or not torch.cuda.is_available():
            return False
        try:
            cudart = torch.cuda.cudart()
            view = torch.frombuffer(self.map, dtype=torch.uint8)
            if cudart.cudaHostRegister(view.data_ptr(), self.size, 0) != cudart.cudaError.success:
                return False
        except Exception:  # noqa: BLE001 - an unpinned buffer still works
            return False
        self._pinned_view, self.pinned = view, True
        return True

    def close(self) -> None:
        if self.pinned:
            try:
                torch.cuda.cudart().cudaHostUnregister(self._pinned_view.data_ptr())
            except Exception:  # noqa: BLE001 - the process's exit unpins it anyway
                pass
            self._pinned_view, self.pinned = None, False
        try:
            self.map.close()
        except BufferError:  # a view is still alive: the mapping goes with the process
            pass
        os.close(self.fd)


def pack(obj: Any, shared: SharedBuffer | None = None) -> tuple[dict, list[memoryview]]:
    """(tree, blobs) of an output. Tensors are copied to the host: into `shared` when given and they fit (the tree
    then names their offsets), else as blobs; anything that is not a plain tensor, a tuple/list or a JSON scalar is
    described by its type name only."""
    blobs: list[memoryview] = []
    offset = [0]

    def walk(x: Any, depth: int) -> dict:
        t = _type(x)
        if t in (tuple, list) and depth < MAX_DEPTH:
            return {"t": "seq", "kind": t.__name__, "items": [walk(i, depth + 1) for i in x]}
        if t is _Tensor:
            flat = x.detach().contiguous().reshape(-1)
            node = {"t": "tensor", "dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape),
                    "device": x.device.type}
            n = flat.numel() * flat.element_size()
            start = -(-offset[0] // ALIGN) * ALIGN
            if shared is not None and start + n <= shared.size:
                if n:
                    torch.frombuffer(shared.map, dtype=torch.uint8, count=n, offset=start).copy_(
                        flat.view(torch.uint8))
                offset[0] = start + n
                return dict(node, offset=start)
            host = flat if flat.device.type == "cpu" else flat.cpu()
            blobs.append(memoryview(host.view(torch.uint8).numpy()))
            return dict(node, blob=len(blobs) - 1)
        if x is None or t in (bool, int, float, str):
            return {"t": "value", "value": x if t is not str else x[:200]}
        return {"t": "other", "type": f"{t.__module__}.{t.__qualname__}"[:200]}

    return walk(obj, 0), blobs


def unpack(tree: Any, blobs: list, *, max_bytes: int, shared: SharedBuffer | None = None,
           device: torch.device | None = None, device_budget: int | None = None) -> Any:
    """The output described by `tree` with host tensors over `blobs` and copies of regions of `shared`. Leaves that
    were neither tensors nor JSON scalars come back as `Opaque(type_name)` (they compare unequal to anything).
    With `device` and a pinned `shared`, a region's copy (the snapshot the judge keeps) is made straight into device
    memory, up to `device_budget` bytes in all (default DEVICE_SNAPSHOT_MAX); the rest is copied to the host."""
    budget = DEVICE_SNAPSHOT_MAX if device_budget is None else device_budget
    total = [sum(len(b) for b in blobs)]
    on_device = [0]
    if total[0] > max_bytes:
        raise WireError(f"{total[0]} bytes of output data (at most {max_bytes} expected)")
    used: set[int] = set()
    leaves = [0]

    def from_shared(node: dict, dtype, shape: list, itemsize: int) -> torch.Tensor:
        start, n = node.get("offset"), math.prod(shape) * itemsize
        if shared is None or _type(start) is not int or start < 0 or start + n > shared.size:
            raise WireError("malformed tensor description")
        total[0] += n
        if total[0] > max_bytes:
            raise WireError(f"{total[0]} bytes of output data (at most {max_bytes} expected)")
        if not n:
            return torch.empty(shape, dtype=dtype)
        region = torch.frombuffer(shared.map, dtype=torch.uint8, count=n, offset=start)
        if device is not None and shared.pinned and on_device[0] + n <= budget:
            on_device[0] += n
            copy = region.to(device)      # one DMA transfer from the page-locked buffer
        else:
            copy = region.clone()
        del region
        return copy.view(dtype).reshape(shape)

    def walk(node: Any, depth: int) -> Any:
        leaves[0] += 1
        if depth > MAX_DEPTH or leaves[0] > MAX_LEAVES or not isinstance(node, dict):
            raise WireError("output tree too deep, too large or malformed")
        kind = node.get("t")
        if kind == "seq":
            items = node.get("items")
            if node.get("kind") not in ("tuple", "list") or not isinstance(items, list):
                raise WireError("malformed sequence")
            out = [walk(i, depth + 1) for i in items]
            return tuple(out) if node["kind"] == "tuple" else out
        if kind == "tensor":
            name = node.get("dtype")
            dtype = DTYPES.get(name) if _type(name) is str else None
            shape, index = node.get("shape"), node.get("blob")
            if dtype is None or _type(shape) is not list or len(shape) > 16 or \
                    not all(_type(s) is int and 0 <= s <= max_bytes for s in shape) or \
                    math.prod(s for s in shape if s) > max(1, max_bytes):  # a 0-size shape must be allocatable
                raise WireError("malformed tensor description")
            itemsize = torch.empty((), dtype=dtype).element_size()
            if "offset" in node:
                return Received(from_shared(node, dtype, shape, itemsize), str(node.get("device", ""))[:16])
            if not isinstance(index, int) or not 0 <= index < len(blobs) or index in used:
                raise WireError("malformed tensor description")
            used.add(index)
            if math.prod(shape) * itemsize != len(blobs[index]):
                raise WireError(f"tensor of shape {shape} {node['dtype']} with {len(blobs[index])} bytes")
            raw = torch.frombuffer(blobs[index], dtype=torch.uint8) if len(blobs[index]) else \
                torch.empty(0, dtype=torch.uint8)
            return Received(raw.view(dtype).reshape(shape), str(node.get("device", ""))[:16])
        if kind == "value":
            value = node.get("value")
            if value is not None and _type(value) not in (bool, int, float, str):
                raise WireError("malformed value")
            return value
        if kind == "other":
            return Opaque(str(node.get("type", "?"))[:200])
        raise WireError(f"unknown node {kind!r}")

    return walk(tree, 0)


class Received:
    """A tensor as the candidate's worker sent it (a copy on the host, or on the judge's device) plus the device type
    it lived on in the worker."""
    __slots__ = ("tensor", "device")

    def __init__(self, tensor: torch.Tensor, device: str):
        self.tensor, self.device = tensor, device


class Opaque:
    """A leaf that was not a tensor or a JSON scalar (only its type name crossed the wire)."""
    __slots__ = ("type_name",)

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __eq__(self, other: Any) -> bool:
        return False

    __hash__ = None
