"""Profile feedback, the plain-data half: occupancy, cuobjdump's resource usage, the profiler's trace, the summary
stored in a verdict (EvalResult.meta["kernel_profile"]) and its texts. No torch here: api.py and feedback.py import
it in the trainer's process. The half that runs forwards under the profiler is kernel_profiler.py (judge and
worker only). Not to be confused with scoring.py, the *evaluation* profiles (kevin | kernelbench | strict).

Where each number comes from (docs/EVALUATOR.md, "Profile feedback"):
- per kernel: GPU time, launches, grid, block and shared memory (static + dynamic) and registers per thread from
  the CUDA profiler's trace (CUPTI through torch.profiler) of a few forwards, run after the verdict is complete;
- the candidate's own kernels: registers, stack frame (spills and local arrays) and static shared memory from
  `cuobjdump -res-usage` on the built extension, run in the candidate's worker (never in the judge: the file is the
  candidate's and cuobjdump parses it);
- theoretical occupancy: `occupancy()`, a port of CUDA's cuda_occupancy.h for the device in use;
- the whole forward: minimum bytes (inputs and weights read once, outputs written once) over the measured time
  against the device's copy bandwidth, and FLOPs of the reference's matmuls/convolutions (torch's FlopCounterMode)
  over the measured time.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import shutil
from typing import Any, Iterable, Mapping

VERSION = 1
MARKER_KERNEL = "spin_kernel"      # torch.cuda._sleep's kernel: brackets each profiled forward
PROFILE_MAX_KERNELS = 12           # distinct kernels kept per side (the rest summed as "other")
FEEDBACK_PROFILE_CHARS = 900       # the profile part of a correct kernel's feedback, at most


# ----------------------------------------------------------------------------------------------- occupancy
@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """What occupancy depends on (cudaOccDeviceProp plus cuda_occupancy.h's per-architecture constants)."""
    major: int
    minor: int
    sm_count: int = 0
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    smem_per_block: int = 48 << 10          # without opt-in
    smem_per_block_optin: int = 48 << 10
    smem_per_sm: int = 64 << 10
    reserved_smem_per_block: int = 0

    @classmethod
    def for_capability(cls, major: int, minor: int, **given: Any) -> "DeviceLimits":
        """Limits of compute capability major.minor (a table of the common GPUs' values); `given` (e.g. from the
        device's properties) overrides them where it is not None/0."""
        cc = major * 10 + minor
        table: dict[str, Any] = {"max_threads_per_sm": 2048, "smem_per_sm": 64 << 10, "smem_per_block_optin": 48 << 10,
                                 "reserved_smem_per_block": 1024 if major >= 8 else 0}
        if cc == 75:
            table.update(max_threads_per_sm=1024, smem_per_sm=64 << 10, smem_per_block_optin=64 << 10)
        elif major == 7:
            table.update(smem_per_sm=96 << 10, smem_per_block_optin=96 << 10)
        elif cc in (80, 87):
            table.update(smem_per_sm=164 << 10, smem_per_block_optin=163 << 10)
        elif major == 8:    # 8.6, 8.9
            table.update(max_threads_per_sm=1536, smem_per_sm=100 << 10, smem_per_block_optin=99 << 10)
        elif major in (9, 10, 11):
            table.update(smem_per_sm=228 << 10, smem_per_block_optin=227 << 10)
        elif major >= 12:
            table.update(max_threads_per_sm=1536, smem_per_sm=100 << 10, smem_per_block_optin=99 << 10)
        table.update({k: v for k, v in given.items() if v})
        return cls(major=major, minor=minor, **table)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DeviceLimits":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in d.items() if k in names and isinstance(v, (int, float))})

    # cuda_occupancy.h's architecture constants
    @property
    def max_blocks_per_sm(self) -> int:
        m, n = self.major, self.minor
        if m == 3:
            return 16
        if m in (5, 6):
            return 32
        if m == 7:
            return 16 if n == 5 else 32
        if m == 8:
            return 32 if n == 0 else 24 if n == 9 else 16
        if m == 9:
            return 32
        if m == 10:
            return 24 if n == 1 else 32
        if m == 11:
            return 24 if n == 0 else 32
        return 24

    @property
    def max_regs_per_thread(self) -> int:
        return 255 if self.major < 7 else 256

    @property
    def smem_alloc_unit(self) -> int:
        return 256 if self.major < 8 else 128

    @property
    def sub_partitions(self) -> int:
        return 2 if (self.major, self.minor) == (6, 0) else 4

    def smem_configs(self) -> list[int]:
        """Shared-memory carve-outs (bytes) the driver can pick on Volta and later."""
        m, n = self.major, self.minor
        if m == 7:
            kb = [32, 64] if n == 5 else [0, 8, 16, 32, 64, 96]
        elif m == 8:
            kb = [0, 8, 16, 32, 64, 100, 132, 164] if n in (0, 7) else [0, 8, 16, 32, 64, 100]
        elif m in (9, 10, 11):
            kb = [0, 8, 16, 32, 64, 100, 132, 164, 196, 228]
        elif m >= 12:
            kb = [0, 8, 16, 32, 64, 100]
        else:
            return [self.smem_per_sm]
        return [k << 10 for k in kb]


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(limits: DeviceLimits, block_threads: int, registers: int, smem_static: int = 0,
              smem_dynamic: int = 0) -> dict:
    """Theoretical occupancy of a kernel launch, as cudaOccMaxActiveBlocksPerMultiprocessor computes it (the
    default cache/carve-out preference, no partitioned global caching, no barrier or virtual-resource limits).
    Returns active blocks and warps per SM, the occupancy (active warps / the SM's maximum) and what limits it."""
    L = limits
    warps = -(-block_threads // L.warp_size)
    max_warps = L.max_threads_per_sm // L.warp_size
    out = {"blocks_per_sm": 0, "warps_per_sm": 0, "occupancy": 0.0, "limited_by": "block size"}
    if block_threads <= 0 or block_threads > L.max_threads_per_block:
        return out
    limits_by: dict[str, float] = {}
    limits_by["warps"] = max_warps // warps
    limits_by["blocks"] = L.max_blocks_per_sm
    # registers: allocated per warp, in units of 256, per sub-partition
    regs_warp = _round_up(registers * L.warp_size, 256)
    regs_cta = regs_warp * warps
    regs_assumed = regs_warp * _round_up(warps, L.sub_partitions)
    if registers > L.max_regs_per_thread or regs_cta > L.regs_per_block or regs_assumed > L.regs_per_block:
        limits_by["registers"] = 0
    elif regs_warp > 0:
        per_partition = (L.regs_per_sm // L.sub_partitions) // regs_warp
        limits_by["registers"] = per_partition * L.sub_partitions // warps
    else:
        limits_by["registers"] = math.inf
    # shared memory: the driver reserves some per block (Ampere+), allocation is granular, and the SM's carve-out
    # is the smallest configuration that fits at least one block when the default (largest) would not be chosen
    total = smem_static + L.reserved_smem_per_block + smem_dynamic
    alloc = _round_up(total, L.smem_alloc_unit)
    per_block_limit = (L.smem_per_block_optin if smem_static + smem_dynamic > L.smem_per_block
                       else L.smem_per_block) + L.reserved_smem_per_block
    if alloc > per_block_limit:
        limits_by["shared memory"] = 0
    elif alloc > 0:
        configs = [c for c in L.smem_configs() if c >= L.smem_per_sm] or [L.smem_per_sm]
        preferred = min(configs)
        if preferred < alloc:
            preferred = min((c for c in L.smem_configs() if c >= alloc), default=L.smem_per_sm)
        limits_by["shared memory"] = preferred // alloc
    else:
        limits_by["shared memory"] = math.inf
    blocks = int(min(limits_by.values()))
    order = ("registers", "shared memory", "warps", "blocks")
    limiter = next(k for k in order if limits_by[k] == blocks)
    out.update(blocks_per_sm=blocks, warps_per_sm=blocks * warps, occupancy=blocks * warps / max_warps,
               limited_by=limiter)
    return out


# ----------------------------------------------------------------------------------------------- resource usage
_ARCH = re.compile(r"^arch = sm_(\d+)[a-z]?\s*$", re.M)
_FUNCTION = re.compile(r"^\s*Function ([^\s:]+):\s*\n\s*(REG:.*)$", re.M)
_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


def parse_res_usage(text: str) -> dict[int, dict[str, dict]]:
    """`cuobjdump -res-usage` output -> {sm: {mangled name: {registers, stack, shared, local}}}, per ELF arch."""
    out: dict[int, dict[str, dict]] = {}
    arches = [(m.start(), int(m.group(1))) for m in _ARCH.finditer(text)]
    for m in _FUNCTION.finditer(text):
        sm = next((a for pos, a in reversed(arches) if pos < m.start()), 0)
        fields = {k: int(v) for k, v in _FIELD.findall(m.group(2))}
        out.setdefault(sm, {})[m.group(1)] = {"registers": fields.get("REG", 0), "stack": fields.get("STACK", 0),
                                              "shared": fields.get("SHARED", 0), "local": fields.get("LOCAL", 0)}
    return out


def resource_usage(text: str, capability: tuple[int, int]) -> dict[str, list[dict]]:
    """The resource usage of the ELF the device runs (its own sm, else the newest older one), by kernel base name
    (`base_name`): {base: [{mangled, registers, stack_bytes, static_smem}, ...]}. cuobjdump's SHARED on sm_90 and
    later includes the 1 KB the driver reserves per block whenever the kernel has a shared section (its
    `.nv.shared.<kernel>` holds the reserved window): it is subtracted, so static_smem is what ptxas reports."""
    per_arch = parse_res_usage(text)
    want = capability[0] * 10 + capability[1]
    usable = [a for a in per_arch if a <= want] or list(per_arch)
    if not usable:
        return {}
    sm = max(usable)
    out: dict[str, list[dict]] = {}
    for mangled, r in per_arch[sm].items():
        shared = r["shared"]
        if sm >= 90 and shared >= 1024:
            shared -= 1024
        out.setdefault(base_name(mangled), []).append(
            {"mangled": mangled[:200], "registers": r["registers"], "stack_bytes": r["stack"] + r["local"],
             "static_smem": shared, "sm": sm})
    return out


def base_name(name: str) -> str:
    """A kernel's unqualified function name, from a mangled (Itanium) or a demangled one:
    '_ZN2ns12inner_kernelEPd' and 'void ns::inner_kernel(double*)' -> 'inner_kernel';
    '_Z12tiled_kernelILi32EEvPKfPfi' and 'void tiled_kernel<32>(float const*, float*, int)' -> 'tiled_kernel'."""
    if name.startswith("_Z"):
        i = 2
        if name[i:i + 1] == "L":
            i += 1
        nested = name[i:i + 1] == "N"
        if nested:
            i += 1
            while i < len(name) and name[i] in "rVK":
                i += 1
        last = ""
        while i < len(name):
            if name.startswith("St", i):
                i += 2
                continue
            m = re.match(r"\d+", name[i:])
            if not m:
                break
            n = int(m.group(0))
            i += len(m.group(0))
            last = name[i:i + n]
            i += n
            if not nested:
                break
        return last or name
    text = name.replace("(anonymous namespace)", "anon")
    depth, cut = 0, len(text)
    for k, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            cut = k
            break
    head, plain, depth = text[:cut], [], 0
    for ch in head:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            plain.append(ch)
    head = "".join(plain).strip().split(" ")[-1]
    return head.split("::")[-1] or name


def short_name(name: str, limit: int = 48) -> str:
    """A kernel name for the text: no return type or argument list; template arguments kept when short."""
    text = name.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(text)
    for k, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and k > 0:
            cut = k
            break
    head = text[:cut].strip()
    if head.startswith("void "):
        head = head[5:]
    lt = head.find("<")
    if lt > 0 and len(head) - lt > 24:
        head = head[:lt] + "<...>"
    return head if len(head) <= limit else head[:limit - 3] + "..."


def find_cuobjdump(cuda_home: str | None = None) -> str | None:
    """cuobjdump's path: next to the toolchain's nvcc (or $CUDA_HOME's, or the real nvcc behind a wrapper on
    PATH), then on PATH, then NVIDIA's pip package (nvidia-cuda-cuobjdump); None when there is none."""
    dirs = [os.path.join(h, "bin") for h in (cuda_home, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                                             "/usr/local/cuda") if h]
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs += [os.path.dirname(nvcc), os.path.dirname(os.path.realpath(nvcc))]
    for d in dirs:
        path = os.path.join(d, "cuobjdump")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13", "cu12", "cuda_cuobjdump"):
            path = os.path.join(root, sub, "bin", "cuobjdump")
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


# ----------------------------------------------------------------------------------------------- the trace
def parse_trace(events: Iterable[Mapping], forwards: int, gated: bool) -> dict:
    """One side's raw profile from the profiler's chrome-trace events of `forwards` forwards, each bracketed by two
    marker kernels (spin_kernel) on the current stream, after a gate (one more, first) when `gated`. Kernels,
    copies and memsets that start inside a forward's brackets are its own; flushes between forwards are outside.
    Returns {forwards, launches, gpu_ms, span_ms, kernels: [...], memcpy, memset} per forward."""
    kernels, copies = [], []
    for ev in events:
        if not isinstance(ev, Mapping) or ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            ts, dur = float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0))
            (kernels if cat == "kernel" else copies).append((ts, dur, cat, ev))
    kernels.sort(key=lambda k: k[0])
    markers = [k for k in kernels if MARKER_KERNEL in str(k[3].get("name", ""))]
    if gated and markers:
        markers = markers[1:]
    if len(markers) != 2 * forwards:
        raise ValueError(f"the trace holds {len(markers)} marker kernels, expected {2 * forwards} "
                         f"({len(kernels)} kernels in all)")
    windows = [(markers[2 * i][0] + markers[2 * i][1], markers[2 * i + 1][0]) for i in range(forwards)]

    def inside(ts: float) -> bool:
        return any(lo - 0.5 <= ts <= hi + 0.5 for lo, hi in windows)

    marker_ids = {id(m[3]) for m in markers}
    by_name: dict[str, dict] = {}
    launches = 0
    for ts, dur, _, ev in kernels:
        if id(ev) in marker_ids or (gated and MARKER_KERNEL in str(ev.get("name", ""))) or not inside(ts):
            continue
        launches += 1
        args = ev.get("args") or {}
        name = str(ev.get("name", "?"))
        k = by_name.setdefault(name, {"name": name, "launches": 0, "us": 0.0, "configs": {}})
        k["launches"] += 1
        k["us"] += dur
        config = (tuple(args.get("grid") or ()), tuple(args.get("block") or ()),
                  _int(args.get("shared memory")), _int(args.get("registers per thread")))
        k["configs"][config] = k["configs"].get(config, 0.0) + dur
    out_kernels = []
    for k in by_name.values():
        (grid, block, smem, regs), _ = max(k["configs"].items(), key=lambda kv: kv[1])
        out_kernels.append({"name": k["name"][:300], "launches": k["launches"] / forwards,
                            "ms": k["us"] / 1e3 / forwards, "grid": list(grid)[:3], "block": list(block)[:3],
                            "smem_bytes": smem, "registers": regs, "configs": len(k["configs"])})
    out_kernels.sort(key=lambda k: -k["ms"])
    side: dict[str, Any] = {"forwards": forwards, "launches": launches / forwards,
                            "gpu_ms": sum(k["ms"] for k in out_kernels),
                            "span_ms": sum(hi - lo for lo, hi in windows) / 1e3 / forwards}
    for cat, label in (("gpu_memcpy", "memcpy"), ("gpu_memset", "memset")):
        mine = [(ts, dur) for ts, dur, c, _ in copies if c == cat and inside(ts)]
        side[label] = {"count": len(mine) / forwards, "ms": sum(d for _, d in mine) / 1e3 / forwards}
        side["gpu_ms"] += side[label]["ms"]
    side["kernels"] = out_kernels[:PROFILE_MAX_KERNELS]
    rest = out_kernels[PROFILE_MAX_KERNELS:]
    side["other"] = {"kernels": len(rest), "ms": sum(k["ms"] for k in rest)}
    return side


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------- the summary
def _num(x: Any, lo: float = 0.0, hi: float = 1e18) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(min(max(x, lo), hi))


def _dims(x: Any) -> list[int]:
    if not isinstance(x, (list, tuple)):
        return []
    return [int(v) for v in x[:3] if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 2 ** 32]


def _text(x: Any, limit: int = 300) -> str:
    s = str(x)[:limit]
    return "".join(ch if ch.isprintable() else "?" for ch in s)


def sanitize_side(raw: Any) -> dict:
    """A bounded, typed copy of one side's raw profile (the candidate's comes from its own process: untrusted, and
    though advisory, it must not smuggle anything but numbers and short printable names into a verdict)."""
    if not isinstance(raw, Mapping):
        raise ValueError("not a profile")
    if raw.get("error"):
        return {"error": _text(raw["error"], 500)}
    out: dict[str, Any] = {"forwards": int(_num(raw.get("forwards"), 0, 1000) or 0),
                           "launches": _num(raw.get("launches"), 0, 1e7) or 0.0,
                           "gpu_ms": _num(raw.get("gpu_ms"), 0, 1e7), "span_ms": _num(raw.get("span_ms"), 0, 1e7),
                           "host_ms": _num(raw.get("host_ms"), 0, 1e7)}
    for label in ("memcpy", "memset"):
        v = raw.get(label) if isinstance(raw.get(label), Mapping) else {}
        out[label] = {"count": _num(v.get("count"), 0, 1e7) or 0.0, "ms": _num(v.get("ms"), 0, 1e7) or 0.0}
    kernels = []
    for k in (raw.get("kernels") or [])[:PROFILE_MAX_KERNELS] if isinstance(raw.get("kernels"), list) else []:
        if not isinstance(k, Mapping):
            continue
        kernels.append({"name": _text(k.get("name", "?")), "launches": _num(k.get("launches"), 0, 1e7) or 0.0,
                        "ms": _num(k.get("ms"), 0, 1e7) or 0.0, "grid": _dims(k.get("grid")),
                        "block": _dims(k.get("block")), "smem_bytes": _int(_num(k.get("smem_bytes"), 0, 1 << 30)),
                        "registers": _int(_num(k.get("registers"), 0, 1024)),
                        "configs": int(_num(k.get("configs"), 0, 1e6) or 1)})
    out["kernels"] = kernels
    other = raw.get("other") if isinstance(raw.get("other"), Mapping) else {}
    out["other"] = {"kernels": int(_num(other.get("kernels"), 0, 1e7) or 0), "ms": _num(other.get("ms"), 0, 1e7) or 0.0}
    return out


def sanitize_resources(raw: Any) -> dict[str, list[dict]]:
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, list[dict]] = {}
    for base, entries in list(raw.items())[:256]:
        if not isinstance(entries, list):
            continue
        clean = []
        for e in entries[:16]:
            if isinstance(e, Mapping):
                clean.append({"mangled": _text(e.get("mangled", ""), 200),
                              "registers": int(_num(e.get("registers"), 0, 1024) or 0),
                              "stack_bytes": int(_num(e.get("stack_bytes"), 0, 1 << 30) or 0),
                              "static_smem": int(_num(e.get("static_smem"), 0, 1 << 30) or 0)})
        if clean:
            out[_text(base, 200)] = clean
    return out


def _match_resources(kernel: Mapping, resources: Mapping[str, list[dict]]) -> tuple[dict | None, bool]:
    """cuobjdump's entry of a traced kernel: by base name, then by the register count the launch used when
    several instances share it. (entry, ambiguous)."""
    entries = resources.get(base_name(str(kernel.get("name", ""))))
    if not entries:
        return None, False
    if len(entries) > 1 and kernel.get("registers") is not None:
        same = [e for e in entries if e["registers"] == kernel["registers"]]
        entries = same or entries
    if len(entries) == 1:
        return entries[0], False
    worst = max(entries, key=lambda e: (e["stack_bytes"], e["static_smem"]))
    return worst, len({(e["registers"], e["stack_bytes"], e["static_smem"]) for e in entries}) > 1


def annotate(side: dict, limits: DeviceLimits | None, resources: Mapping[str, list[dict]] | None = None,
             own_names: Iterable[str] = ()) -> dict:
    """Shares, the candidate's own kernels' compiler resources and every kernel's theoretical occupancy."""
    total = side.get("gpu_ms") or 0.0
    own = {base_name(n) for n in own_names}   # the build's kernel symbols, mangled or demangled
    for k in side.get("kernels", []):
        k["share"] = k["ms"] / total if total > 0 else None
        entry, ambiguous = _match_resources(k, resources or {})
        base = base_name(k["name"])
        k["own"] = entry is not None or base in own
        if entry is not None:
            k["stack_bytes"] = entry["stack_bytes"]
            k["static_smem"] = entry["static_smem"]
            if ambiguous:
                k["resources_ambiguous"] = True
            if k.get("registers") is None:
                k["registers"] = entry["registers"]
            if k.get("smem_bytes") is not None:
                k["dynamic_smem"] = max(0, k["smem_bytes"] - entry["static_smem"])
        block = math.prod(k["block"]) if k.get("block") else 0
        if limits is not None and block and k.get("registers") is not None:
            static = k.get("static_smem", k.get("smem_bytes") or 0)
            dynamic = k.get("dynamic_smem", 0)
            occ = occupancy(limits, block, int(k["registers"]), int(static), int(dynamic))
            k["occupancy"] = round(occ["occupancy"], 4)
            k["occupancy_limited_by"] = occ["limited_by"]
            k["blocks_per_sm"] = occ["blocks_per_sm"]
    return side


def forward_summary(*, time_ms: float | None, input_bytes: int, param_bytes: int, output_bytes: int,
                    copy_gbps: float | None, flops: float | None, ref_time_ms: float | None) -> dict:
    """Bytes that must move at least (inputs and weights read once, outputs written once) and FLOPs of the
    reference's matmuls/convolutions, over the measured times."""
    min_bytes = int(input_bytes + param_bytes + output_bytes)
    out: dict[str, Any] = {"min_bytes": min_bytes, "input_bytes": int(input_bytes), "param_bytes": int(param_bytes),
                           "output_bytes": int(output_bytes), "time_ms": time_ms, "ref_time_ms": ref_time_ms,
                           "copy_gbps": copy_gbps, "flops": flops}
    if time_ms and time_ms > 0:
        out["gbps"] = min_bytes / (time_ms * 1e-3) / 1e9
        if copy_gbps:
            out["copy_share"] = out["gbps"] / copy_gbps
        if flops:
            out["tflops"] = flops / (time_ms * 1e-3) / 1e12
    if ref_time_ms and ref_time_ms > 0 and flops:
        out["ref_tflops"] = flops / (ref_time_ms * 1e-3) / 1e12
    return out


# ----------------------------------------------------------------------------------------------- texts
def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _smem(n: float) -> str:
    return f"{n / 1024:.3g} KB" if n >= 1024 else f"{int(n)} B"


def _share(x: float) -> str:
    return f"{x:.1%}" if x < 0.01 else f"{x:.0%}"


def _ms(x: float) -> str:
    return f"{x:.3g} ms" if x >= 0.01 else f"{x * 1e3:.3g} us"


def _dim_text(d: list[int]) -> str:
    while len(d) > 1 and d[-1] == 1:
        d = d[:-1]
    return "x".join(str(v) for v in d) or "?"


def _kernel_text(k: Mapping, detail: bool) -> str:
    text = f"{_share(k['share'])} {short_name(k['name'])}" if k.get("share") is not None else short_name(k["name"])
    if not detail:
        return text
    parts = []
    if k.get("launches", 1) > 1.01:
        parts.append(f"{k['launches']:.3g} launches")
    if k.get("grid"):
        parts.append(f"grid {_dim_text(list(k['grid']))}")
    if k.get("block"):
        parts.append(f"{math.prod(k['block'])} threads")
    if k.get("registers") is not None:
        parts.append(f"{k['registers']} registers")
    if "stack_bytes" in k:
        parts.append(f"{k['stack_bytes']} B stack/spill")
    smem = k.get("smem_bytes")
    if "static_smem" in k:
        smem_parts = [f"{_smem(k['static_smem'])} static"]
        if k.get("dynamic_smem"):
            smem_parts.append(f"{_smem(k['dynamic_smem'])} dynamic")
        if k["static_smem"] or k.get("dynamic_smem"):
            parts.append("smem " + " + ".join(smem_parts))
    elif smem:
        parts.append(f"smem {_smem(smem)}")
    if k.get("occupancy") is not None:
        occ = f"{k['occupancy']:.0%} occupancy"
        if k["occupancy"] < 0.5 and k.get("occupancy_limited_by") not in (None, "warps", "blocks"):
            occ += f", limited by {k['occupancy_limited_by']}"
        parts.append(occ)
    return text + (f" ({', '.join(parts)})" if parts else "")


def _side_text(label: str, side: Mapping, n_kernels: int, detail: bool) -> str:
    launches = side.get("launches") or 0
    text = f"- {label}: {launches:.3g} launch{'es' if abs(launches - 1) > 1e-9 else ''}"
    if side.get("gpu_ms") is not None:
        text += f", {_ms(side['gpu_ms'])} of GPU time"
    kernels = list(side.get("kernels") or [])
    shown = kernels[:n_kernels]
    if shown:
        text += "; " + "; ".join(_kernel_text(k, detail) for k in shown)
    hidden = len(kernels) - len(shown) + (side.get("other") or {}).get("kernels", 0)
    if hidden > 0 and shown:
        text += f"; {hidden} more kernel{'s' if hidden > 1 else ''}"
    copies = [f"{side[c]['count']:.3g} {c}" for c in ("memcpy", "memset") if (side.get(c) or {}).get("count")]
    if copies:
        text += f"; also {', '.join(copies)}"
    return text


def _rate(gbps: float) -> str:
    return f"{gbps / 1e3:.2g} TB/s" if gbps >= 1e3 else f"{gbps:.3g} GB/s"


def _memory_text(fwd: Mapping, gpu: bool = True) -> str | None:
    if not fwd.get("gbps") or not fwd.get("time_ms"):
        return None
    text = (f"- memory: your forward moves >= {_bytes(fwd['min_bytes'])} (inputs and weights read once, outputs "
            f"written once) in {_ms(fwd['time_ms'])} = {_rate(fwd['gbps'])}")
    if fwd.get("copy_share") is not None and fwd.get("copy_gbps"):
        text += (f", {_share(fwd['copy_share'])} of this {'GPU' if gpu else 'machine'}'s {_rate(fwd['copy_gbps'])} "
                 "copy bandwidth")
    return text


def _compute_text(fwd: Mapping) -> str | None:
    if not fwd.get("tflops"):
        return None
    text = f"- compute: {fwd['flops'] / 1e9:.3g} GFLOP of matmul/convolution in {_ms(fwd['time_ms'])} = " \
           f"{fwd['tflops']:.3g} TFLOP/s"
    if fwd.get("ref_tflops"):
        text += f" (the reference: {fwd['ref_tflops']:.3g} TFLOP/s)"
    return text


def render_feedback(profile: Mapping | None, max_chars: int = FEEDBACK_PROFILE_CHARS) -> str | None:
    """The profile part of a correct kernel's feedback: a few lines, shortened until they fit `max_chars`; None when
    there is no usable profile of the candidate (the caller then keeps the plain text)."""
    if not isinstance(profile, Mapping) or profile.get("error"):
        return None
    cand = profile.get("candidate")
    if not isinstance(cand, Mapping) or cand.get("error"):
        return None
    ref = profile.get("reference") if isinstance(profile.get("reference"), Mapping) else None
    if ref is not None and ref.get("error"):
        ref = None
    fwd = profile.get("forward") if isinstance(profile.get("forward"), Mapping) else {}
    gpu = profile.get("device", {}).get("type") != "cpu"
    tail = [t for t in (_memory_text(fwd, gpu), _compute_text(fwd)) if t]
    # from the most to the least detailed: (your kernels, with details?, reference kernels)
    for n_c, detail, n_r in ((3, True, 2), (2, True, 1), (1, True, 1), (1, True, 0), (1, False, 0), (0, False, 0)):
        lines = ["Profile of one forward (GPU time per kernel):" if gpu else "Profile of one forward:"]
        if gpu:
            lines.append(_side_text("yours", cand, n_c, detail))
            if ref is not None:
                lines.append(_side_text("reference", ref, n_r, False))
        lines += tail
        text = "\n".join(lines)
        if len(text) <= max_chars:
            return text
    return text[:max_chars]


def render_breakdown(profile: Mapping | None) -> str:
    """The long form for reports (launch/eval.py --profile): every kernel kept, both sides, with details."""
    if not isinstance(profile, Mapping):
        return "no profile"
    if profile.get("error"):
        return f"no profile: {profile['error']}"
    lines = []
    for label in ("candidate", "reference"):
        side = profile.get(label)
        if not isinstance(side, Mapping):
            continue
        if side.get("error"):
            lines.append(f"{label}: no profile ({side['error']})")
            continue
        lines.append(f"{label}: {side.get('launches', 0):.3g} launches, {_ms(side.get('gpu_ms') or 0.0)} of GPU "
                     f"time per forward (span {_ms(side.get('span_ms') or 0.0)})")
        for k in side.get("kernels") or []:
            lines.append(f"  {_ms(k['ms']):>10}  {_kernel_text(k, True)}")
        other = side.get("other") or {}
        if other.get("kernels"):
            lines.append(f"  {_ms(other['ms']):>10}  {other['kernels']} other kernels")
    fwd = profile.get("forward") or {}
    gpu = (profile.get("device") or {}).get("type") != "cpu"
    lines += [t[2:] for t in (_memory_text(fwd, gpu), _compute_text(fwd)) if t]
    for what, why in (profile.get("notes") or {}).items():
        lines.append(f"note: {what}: {why}")
    return "\n".join(lines)
