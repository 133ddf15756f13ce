"""The GPUs of this node as a config's choice of layout sees them (read from nvidia-smi, before JAX starts: no jax).

A config that lays a model out per node (configs/kevin32b.py: its LAYOUTS, named "<card>x<count>") names
`detect_layout` for "auto": the visible GPUs' count and the smallest one's memory pick the layout, 80 GB cards count
as H100 and 141 GB ones as H200, and a node with no layout of its own is an error that names the layouts to choose
from by hand.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Collection

# Memory per GPU (GB, nvidia-smi's total) from which a card counts as this kind: 141 GB H200s, 80 GB H100s.
CARD_KINDS = (("h200", 130), ("h100", 75))


def visible_gpus() -> tuple[int, int]:
    """(number of GPUs this process may use, the smallest one's memory in GB) from nvidia-smi; (0, 0) without."""
    if shutil.which("nvidia-smi") is None:
        return 0, 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0, 0
    memory = {int(i): int(m) for i, m in (line.split(",") for line in out.strip().splitlines() if "," in line)}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        chosen = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        memory = {i: m for i, m in memory.items() if i in chosen}
    return len(memory), (min(memory.values()) * 1024 ** 2 // 10 ** 9 if memory else 0)


def detect_layout(layouts: Collection[str], *, config: str, without_gpu: str) -> str:
    """The layout named "<card>x<count>" for this node's GPUs; `without_gpu` where none is visible (a CPU box parsing
    the config). `config` names the config file in the error of a node that has no layout."""
    count, gb = visible_gpus()
    if count == 0:
        return without_gpu
    kind = next((name for name, least_gb in CARD_KINDS if gb >= least_gb), None)
    name = f"{kind}x{count}"
    if kind is None or name not in layouts:
        raise ValueError(f"{config}: no layout for {count} GPU(s) of {gb} GB; known: {', '.join(layouts)}; name one "
                         f"to override: --config={config}:{without_gpu}")
    return name
