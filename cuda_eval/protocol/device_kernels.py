"""Kernels of our own that the judge and the worker run (judge and worker processes only; imports torch): the output
digest, a worker's commitment to the output of every call before the judge's clock stops (docs/EVALUATOR.md,
"Timing"), and the time-based gate of the gated timer.

On a GPU both are CUDA compiled with NVRTC (torch.cuda._compile_kernel) when the process starts, before any
candidate code runs; on the CPU, or where NVRTC cannot be loaded, the same functions run as torch ops (the digest
then costs ~10 passes over the output instead of one; `Kernels.backend` and `Kernels.fallback_reason` say which).

The digest of one tensor, a function of its bytes and a 64-bit key, the same on every backend:
  words  the tensor's bytes as little-endian uint32 words, the last one zero-padded: n words;
  lanes  L = max(1, ceil(n / 16)) lanes; lane j reads words j, L + j, ..., 15L + j (0 past the end), in order:
           h = mix(key ^ ((j + 1) * G));  for r in 0..15:  h = mix(h ^ word ^ (r << 40)) + h
  tree   the lane states, zero-padded to a multiple of 256, folded per block of 256 by halves
           (v[t] = fold(v[t], v[t + half]), half = 128, 64, ..., 1; fold(a, b) = mix(a ^ mix(b)) + b),
         repeated while more than 1024 values are left (always at least once);
  host   blake2b-128 over (key, n, the values).
mix is MurmurHash3's 64-bit finaliser, G = 0x9E3779B97F4A7C15, arithmetic mod 2^64. Why a chain per lane and a
tree rather than a sum: a sum of per-word terms can be hit after the fact by choosing, within the tolerance, the
low bits of many output values (a generalised birthday search); a chained lane with a feed-forward (`+ h`) cannot
be run backwards, so an output that matches a given digest has to be found by trying whole lane inputs (2^64 per
lane). The key is no secret (the worker needs it to digest): the argument does not rest on it.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import os
import secrets
import struct
from typing import Any

import torch

from cuda_eval.protocol.wire import Received

try:   # the digest of host tensors over their raw memory (our own C++: no ATen op a candidate can register over)
    from cuda_eval._native import digest_values as _native_digest_values
except ImportError:   # a checkout without the built module: the torch-op form, the same digests
    _native_digest_values = None

_cuda_synchronize = torch.cuda.synchronize
# The tensor metadata the host digest reads: attributes of the tensor itself, never dispatched ops.
_data_ptr, _size, _stride = torch.Tensor.data_ptr, torch.Tensor.size, torch.Tensor.stride
_element_size = torch.Tensor.element_size
WORDS_PER_LANE = 16
BLOCK = 256
MAX_VALUES = 1024             # tree levels until at most this many 64-bit values go to the host
CHUNK_LANES = 1 << 20         # lanes per chunk of the torch-op digest of a large tensor (64 MiB of words) ...
CHUNK_BYTES = 4 * WORDS_PER_LANE * CHUNK_LANES   # ... used for tensors over this size
_G = 0x9E3779B97F4A7C15
_M1, _M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53
_MASK64 = (1 << 64) - 1

CUDA_SOURCE = r"""
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 mix(u64 x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return x;
}
__device__ __forceinline__ u64 fold(u64 a, u64 b) { return mix(a ^ mix(b)) + b; }

__device__ __forceinline__ void fold_block(u64* v, u64* out) {
  __syncthreads();
  for (int half = 128; half > 0; half >>= 1) {
    if (threadIdx.x < half) v[threadIdx.x] = fold(v[threadIdx.x], v[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = v[0];
}

// One thread per lane, 256 lanes per block; the block's lane states folded into out[blockIdx.x].
extern "C" __global__ void digest_lanes__TOKEN__(const u32* words, u32 n_lo, u32 n_hi, u32 lanes, u32 key_lo,
                                                 u32 key_hi, u64* out) {
  __shared__ u64 v[256];
  const u64 n = ((u64)n_hi << 32) | n_lo, key = ((u64)key_hi << 32) | key_lo, L = lanes;
  const u64 j = (u64)blockIdx.x * 256 + threadIdx.x;
  u64 h = 0;
  if (j < L) {
    u32 w[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const u64 i = (u64)r * L + j;
      w[r] = i < n ? words[i] : 0u;
    }
    h = mix(key ^ ((j + 1) * 0x9E3779B97F4A7C15ULL));
#pragma unroll
    for (int r = 0; r < 16; ++r) h = mix(h ^ (u64)w[r] ^ ((u64)r << 40)) + h;
  }
  v[threadIdx.x] = h;
  fold_block(v, out);
}

extern "C" __global__ void digest_tree__TOKEN__(const u64* in, u32 count, u64* out) {
  __shared__ u64 v[256];
  const u64 j = (u64)blockIdx.x * 256 + threadIdx.x;
  v[threadIdx.x] = j < count ? in[j] : 0ULL;
  fold_block(v, out);
}

// The gate of the gated timer: holds the stream for `ns` nanoseconds of the GPU's global timer (wall time, whatever
// the SM clock does; a cycle-counting spin lasts longer when the clock drops).
extern "C" __global__ void cuda_eval_gate__TOKEN__(u32 ns_lo, u32 ns_hi) {
  const u64 ns = ((u64)ns_hi << 32) | ns_lo;
  u64 start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// The L2 flush between timed calls: zeroes `words` words (grid-stride). Ours, so that the kernel trace knows it by
// this process's name for it (a torch fill would be named like any candidate's).
extern "C" __global__ void cuda_eval_flush__TOKEN__(u32* p, u32 words_lo, u32 words_hi) {
  const u64 words = ((u64)words_hi << 32) | words_lo;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (u64)gridDim.x * blockDim.x) p[i] = 0u;
}
"""
# Base names of our kernels. Each process compiles them under names of its own (base + "_" + a random token drawn at
# start-up, before any candidate code exists), so that the kernel trace tells ours from a candidate's by a name no
# program can know when it is built (Kernels.names); the static rules still reserve the base names.
GATE_KERNEL = "cuda_eval_gate"
DIGEST_KERNELS = ("digest_lanes", "digest_tree")
FLUSH_KERNEL = "cuda_eval_flush"


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


_SM1, _SM2, _SG = _signed(_M1), _signed(_M2), _signed(_G)


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 values seen as uint64."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _lsr(x, 33)
    x = x * _SM1
    x = x ^ _lsr(x, 33)
    x = x * _SM2
    return x ^ _lsr(x, 33)


def _fold(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _mix(a ^ _mix(b)) + b


def _fold_blocks(values: torch.Tensor) -> torch.Tensor:
    """One tree level of the spec: zero-pad to a multiple of BLOCK, fold each block by halves."""
    pad = (-values.numel()) % BLOCK
    if pad:
        values = torch.cat([values, values.new_zeros(pad)])
    v = values.view(-1, BLOCK)
    half = BLOCK // 2
    while half:
        v = _fold(v[:, :half], v[:, half:2 * half])
        half //= 2
    return v.reshape(-1)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as uint32 words (the last zero-padded), as a flat contiguous int32 tensor."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.numel() % 4 or raw.data_ptr() % 4:
        padded = raw.new_zeros(-(-raw.numel() // 4) * 4)
        padded[:raw.numel()] = raw
        raw = padded
    return raw.view(torch.int32)


def lanes_for(n_words: int) -> int:
    return max(1, -(-n_words // WORDS_PER_LANE))


def _values_torch(words: torch.Tensor, key: int) -> torch.Tensor:
    n = words.numel()
    lanes = lanes_for(n)
    w = words.to(torch.int64) & 0xFFFFFFFF
    if w.numel() < WORDS_PER_LANE * lanes:
        w = torch.cat([w, w.new_zeros(WORDS_PER_LANE * lanes - w.numel())])
    w = w.view(WORDS_PER_LANE, lanes)
    j = torch.arange(1, lanes + 1, dtype=torch.int64, device=words.device)
    h = _mix(j * _SG ^ _signed(key))
    for r in range(WORDS_PER_LANE):
        h = _mix(h ^ w[r] ^ (r << 40)) + h
    values = _fold_blocks(h)
    while values.numel() > MAX_VALUES:
        values = _fold_blocks(values)
    return values


def _values_torch_chunked(t: torch.Tensor, key: int, device: torch.device,
                          chunk_lanes: int | None = None) -> tuple[torch.Tensor, int]:
    """(the values of `_values_torch`, on `device`; n words) computed CHUNK_LANES lanes at a time, each chunk's words
    copied to `device` as it is needed: the same values (a lane reads only its own words, and a chunk is a whole
    number of tree blocks) with bounded temporaries. For outputs of many GB (the torch ops widen every word to 64
    bits, ~4x the output) and for a host copy digested on the GPU (no second copy of the whole output there)."""
    chunk = chunk_lanes or CHUNK_LANES
    assert chunk % BLOCK == 0
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    n_bytes = raw.numel()
    n = -(-n_bytes // 4)
    lanes = lanes_for(n)
    key = _signed(key)
    parts = []
    for a in range(0, lanes, chunk):
        b = min(lanes, a + chunk)
        rows = torch.zeros(WORDS_PER_LANE, 4 * (b - a), dtype=torch.uint8, device=device)  # words past n: 0
        for r in range(WORDS_PER_LANE):
            lo, hi = 4 * (r * lanes + a), min(4 * (r * lanes + b), n_bytes)
            if hi > lo:
                rows[r, :hi - lo].copy_(raw[lo:hi])
        w = rows.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        del rows
        j = torch.arange(a + 1, b + 1, dtype=torch.int64, device=device)
        h = _mix(j * _SG ^ key)
        for r in range(WORDS_PER_LANE):
            h = _mix(h ^ w[r] ^ (r << 40)) + h
        parts.append(_fold_blocks(h))
    values = torch.cat(parts)
    while values.numel() > MAX_VALUES:
        values = _fold_blocks(values)
    return values, n


def finish(values: bytes, n_words: int, key: int) -> bytes:
    """The host step of the spec: blake2b-128 over (key, n, the values as little-endian uint64)."""
    return hashlib.blake2b(struct.pack("<QQ", key & _MASK64, n_words) + values, digest_size=16).digest()


def _host_bytes(values: torch.Tensor) -> bytes:
    return values.cpu().numpy().astype("<i8").tobytes()


def digest_tensor_torch(t: torch.Tensor, key: int) -> bytes:
    """The spec with torch ops, on the tensor's own device (what the CUDA kernels are checked against)."""
    words = _words(t)
    return finish(_host_bytes(_values_torch(words, key)), words.numel(), key)


class Kernels:
    """This process's digest and gate. `backend`: "nvrtc" (CUDA kernels) or "torch" (ops; the gate falls back to
    torch.cuda._sleep, whose length in cycles the caller converts)."""

    def __init__(self, device_type: str, hold=None):
        """`hold()`: a context manager held while the kernels are loaded and first run (the device lock)."""
        self.device_type = device_type
        self.backend = "torch"
        self.fallback_reason = "" if device_type != "cuda" else "not compiled"
        self._lanes = self._tree = self._gate = self._flush = None
        self.token = secrets.token_hex(8)
        # this process's names of its kernels: {"gate", "flush", "digests": (lanes, tree)}
        self.names = {"gate": f"{GATE_KERNEL}_{self.token}", "flush": f"{FLUSH_KERNEL}_{self.token}",
                      "digests": tuple(f"{n}_{self.token}" for n in DIGEST_KERNELS)}
        if device_type == "cuda":
            try:
                self._compile(hold)
                self.backend = "nvrtc"
                self.fallback_reason = ""
            except Exception as e:  # no NVRTC here: the torch ops give the same digests, slower
                self._lanes = self._tree = self._gate = self._flush = None
                self.fallback_reason = f"{type(e).__name__}: {e}"[:300]

    def _compile(self, hold) -> None:
        names = self.names["digests"] + (self.names["gate"], self.names["flush"])
        source = CUDA_SOURCE.replace("__TOKEN__", "_" + self.token)
        try:
            binary = _nvrtc_binary(source, names[0])
        except OSError:
            _preload_nvrtc()   # torch looks for libnvrtc by soname only; the wheel's copy is not on the search path
            binary = _nvrtc_binary(source, names[0])
        with (hold() if hold is not None else contextlib.nullcontext()):
            self._lanes, self._tree, self._gate, self._flush = _load_kernels(binary, names)
            self._probe()

    def _probe(self) -> None:
        # First launches: here, not inside a timed region.
        probe = torch.arange(37, dtype=torch.int32, device="cuda")
        if self.digest_tensor(probe, 12345) != digest_tensor_torch(probe, 12345):
            raise RuntimeError("the NVRTC digest differs from the torch-op digest")
        self.gate(0.01)
        scratch = torch.ones(4096, dtype=torch.uint8, device="cuda")
        if not self.flush(scratch) or scratch.any():
            raise RuntimeError("the flush kernel did not zero its buffer")
        _cuda_synchronize()

    # --- digest ---
    def _values(self, t: torch.Tensor, key: int, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
        """(the values the host step hashes, still on `device` (default: the tensor's); n words). A large tensor
        goes in chunks where no digest kernel reads it in place: on another device than `device` (a host copy
        digested on the GPU), under the torch ops, or not made of aligned words (_values_torch_chunked)."""
        device = t.device if device is None else torch.device(device)
        elsewhere = t.device.type != device.type or None not in (t.device.index, device.index) and \
            t.device.index != device.index
        n_bytes = t.numel() * t.element_size()
        if n_bytes > CHUNK_BYTES and (elsewhere or self._lanes is None or device.type != "cuda" or n_bytes % 4 or
                                      t.data_ptr() % 4):   # (the kernel reads whole aligned words: else a copy)
            return _values_torch_chunked(t, key, device)
        if elsewhere:
            t = t.to(device)
        words = _words(t)
        n = words.numel()
        if self._lanes is None or t.device.type != "cuda":
            return _values_torch(words, key), n
        lanes = lanes_for(n)
        key &= _MASK64
        blocks = -(-lanes // BLOCK)
        values = torch.empty(blocks, dtype=torch.int64, device=t.device)
        self._lanes(grid=(blocks, 1, 1), block=(BLOCK, 1, 1),
                    args=[words, n & 0xFFFFFFFF, n >> 32, lanes, key & 0xFFFFFFFF, key >> 32, values])
        while values.numel() > MAX_VALUES:
            count = values.numel()
            blocks = -(-count // BLOCK)
            folded = torch.empty(blocks, dtype=torch.int64, device=t.device)
            self._tree(grid=(blocks, 1, 1), block=(BLOCK, 1, 1), args=[values, count, folded])
            values = folded
        return values, n

    def digest_tensor(self, t: torch.Tensor, key: int) -> bytes:
        host = _host_digest(t, key)
        if host is not None:
            return host
        values, n = self._values(t, key)
        return finish(_host_bytes(values), n, key)

    def digests(self, outputs: list, key: int, device: torch.device | None = None) -> list[str]:
        """The digest of each call's whole output (tensors, nested tuples/lists, scalars), as the worker holds it or
        as the judge received it (wire.Received leaves; moved to `device` first): the same string for the same
        bytes. The kernels of every output are launched first and their values copied to the host at once."""
        plans, pending = [], []
        for out in outputs:
            parts: list = []

            def walk(x: Any) -> None:
                if type(x) in (tuple, list):
                    parts.append(f"[{type(x).__name__}:{len(x)}".encode())
                    for item in x:
                        walk(item)
                    parts.append(b"]")
                    return
                t = x.tensor if type(x) is Received else x
                if isinstance(t, torch.Tensor):
                    parts.append(f"T{str(t.dtype).replace('torch.', '')}{list(t.shape)}".encode())
                    host = _host_digest(t, key) if device is None or torch.device(device).type == "cpu" else None
                    if host is not None:   # a host tensor: its digest now, from its memory
                        parts.append(host)
                        return
                    values, n = self._values(t, key, device)
                    parts.append((len(pending), n))
                    pending.append(values)
                elif x is None or type(x) in (bool, int, float, str):
                    parts.append(("V" + repr(x[:200] if type(x) is str else x)).encode())
                else:
                    name = getattr(x, "type_name", None) or f"{type(x).__module__}.{type(x).__qualname__}"
                    parts.append(("O" + name[:200]).encode())

            walk(out)
            plans.append(parts)
        sizes = [v.numel() for v in pending]
        if not pending:
            host = b""
        elif len({v.device for v in pending}) == 1:   # one copy to the host for the whole group
            host = _host_bytes(torch.cat([v.reshape(-1) for v in pending]))
        else:
            host = b"".join(_host_bytes(v) for v in pending)
        offsets = [0]
        for size in sizes:
            offsets.append(offsets[-1] + 8 * size)
        out = []
        for parts in plans:
            h = hashlib.blake2b(digest_size=16)
            for part in parts:
                if isinstance(part, tuple):
                    i, n = part
                    h.update(finish(host[offsets[i]:offsets[i + 1]], n, key))
                else:
                    h.update(part)
            out.append(h.hexdigest())
        return out

    # --- flush ---
    def flush(self, buffer: torch.Tensor) -> bool:
        """Zero `buffer` (a contiguous CUDA tensor of whole 4-byte words) with our flush kernel; False where there is
        none (the caller then zeroes it with torch)."""
        n_bytes = buffer.numel() * buffer.element_size()
        if self._flush is None or n_bytes % 4 or buffer.data_ptr() % 4 or not buffer.is_contiguous():
            return False
        words = n_bytes // 4
        blocks = max(1, min(4096, -(-words // (256 * 4))))
        self._flush(grid=(blocks, 1, 1), block=(256, 1, 1), args=[buffer, words & 0xFFFFFFFF, words >> 32])
        return True

    # --- gate ---
    def gate(self, ms: float) -> bool:
        """Hold the current stream for `ms` of wall time; False where there is no time-based gate (the caller then
        uses torch.cuda._sleep)."""
        if self._gate is None:
            return False
        ns = max(0, int(ms * 1e6))
        self._gate(grid=(1, 1, 1), block=(1, 1, 1), args=[ns & 0xFFFFFFFF, ns >> 32])
        return True


def _host_digest(t: torch.Tensor, key: int, *, _values=_native_digest_values, _ptr=_data_ptr, _sizes=_size,
                 _strides=_stride, _itemsize=_element_size) -> bytes | None:
    """The digest of a strided host tensor computed by our C++ over its memory (None: not a host tensor, or no
    native module here). The digest of a candidate's output must not run through ATen ops: an extension can
    register its own kernel for any of them (TORCH_LIBRARY_IMPL(aten, CPU, m)) and finish deferred work there,
    after its call returned (docs/EVALUATOR.md, "Known limits")."""
    if _values is None or t.device.type != "cpu" or t.layout != torch.strided:
        return None
    values, n = _values(_ptr(t), list(_sizes(t)), list(_strides(t)), _itemsize(t), key & _MASK64)
    return finish(values, n, key)


def _nvrtc_binary(source: str, name: str) -> bytes:
    """`source` (CUDA_SOURCE with this process's names) compiled by NVRTC for this device (torch's helper, torch >=
    2.8): CPU work only."""
    try:
        from torch.cuda._utils import _nvrtc_compile
    except ImportError as e:
        raise RuntimeError(f"torch {torch.__version__} cannot compile CUDA at run time (no NVRTC helper)") from e
    binary, _ = _nvrtc_compile(source, name)
    return binary


def _load_kernels(binary: bytes, names: tuple[str, ...]) -> list:
    from torch.cuda._utils import _cuda_load_module
    loaded = _cuda_load_module(binary, list(names))   # extern "C": the names are not mangled
    return [loaded[n] for n in names]


def _preload_nvrtc() -> None:
    """Load the NVRTC of torch's CUDA wheels by path (RTLD_GLOBAL), so that torch's load by soname finds it."""
    major = str(torch.version.cuda or "").split(".")[0]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    found = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", f"libnvrtc.so.{major}*")) +
                   glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libnvrtc.so*")))
    found = [p for p in found if "builtins" not in os.path.basename(p)]
    if not found:
        raise OSError(f"no libnvrtc.so.{major} under {site}/nvidia")
    ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
