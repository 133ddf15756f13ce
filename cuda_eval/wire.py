"""Model outputs as plain data on the wire (channel.py): a JSON tree plus one blob of raw bytes per tensor.

The candidate's worker packs what its forward returned; the judge unpacks it under limits it sets from the reference
output (dtype names from a fixed table, exact byte counts, bounded nesting): nothing the candidate sends is ever
unpickled or executed. Unpacked tensors live on the host; the judge compares them chunk by chunk on its device.
"""
from __future__ import annotations

import builtins
import math
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


def pack(obj: Any) -> tuple[dict, list[memoryview]]:
    """(tree, blobs) of an output. Tensors are copied to the host; anything that is not a plain tensor, a tuple/list
    or a JSON scalar is described by its type name only."""
    blobs: list[memoryview] = []

    def walk(x: Any, depth: int) -> dict:
        t = _type(x)
        if t in (tuple, list) and depth < MAX_DEPTH:
            return {"t": "seq", "kind": t.__name__, "items": [walk(i, depth + 1) for i in x]}
        if t is _Tensor:
            host = x.detach().contiguous().reshape(-1)
            if host.device.type != "cpu":
                host = host.cpu()
            blobs.append(memoryview(host.view(torch.uint8).numpy()))
            return {"t": "tensor", "dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape),
                    "device": x.device.type, "blob": len(blobs) - 1}
        if x is None or t in (bool, int, float, str):
            return {"t": "value", "value": x if t is not str else x[:200]}
        return {"t": "other", "type": f"{t.__module__}.{t.__qualname__}"[:200]}

    return walk(obj, 0), blobs


def unpack(tree: Any, blobs: list, *, max_bytes: int) -> Any:
    """The output described by `tree` with host tensors over `blobs`. Leaves that were neither tensors nor JSON
    scalars come back as `Opaque(type_name)` (they compare unequal to anything)."""
    total = sum(len(b) for b in blobs)
    if total > max_bytes:
        raise WireError(f"{total} bytes of output data (at most {max_bytes} expected)")
    used: set[int] = set()
    leaves = [0]

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
            dtype = DTYPES.get(node.get("dtype"))
            shape, index = node.get("shape"), node.get("blob")
            if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and 0 <= s for s in shape) \
                    or not isinstance(index, int) or not 0 <= index < len(blobs) or index in used:
                raise WireError("malformed tensor description")
            used.add(index)
            itemsize = torch.empty((), dtype=dtype).element_size()
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
    """A tensor as the candidate's worker sent it: host data plus the device type it lived on."""
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
