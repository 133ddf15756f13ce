"""The CUDA kernels a built extension holds, read from the binary itself: which kernels are the candidate's is
decided by what its build produced, never by what its source says (a `__global__` in a comment, a string or an
`#if 0` block defines nothing) or by what a kernel is called.

An extension's device code is in the `.nv_fatbin` section of its shared object: one fat binary per translation
unit, each a list of entries (a cubin, an ELF per GPU architecture, or PTX text). A kernel is an entry point of a
cubin (a FUNC symbol marked STO_CUDA_ENTRY) or a `.entry` of PTX. Entries compressed by nvcc (zstd/LZ4) are read
only when the same fat binary holds a cubin (the cubin of a translation unit holds every kernel its PTX does);
otherwise the kernels are unknown (None), and callers fall back to checks that need no names.

Parsing is plain Python over bytes with every offset, scan and count bounded (a linear pass over at most the fat
binary section): the shared object is built from hostile source, so no tool of ours (cuobjdump) runs on it, and
anything malformed makes the kernels unknown (None), never an error. Demangling (a mangled name with
back-references grows exponentially when demangled) runs in a child process with a memory and CPU limit.
"""
from __future__ import annotations

import json
import mmap
import re
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
_KIND_PTX, _KIND_ELF = 1, 2
_FLAG_COMPRESSED = 0x2000 | 0x8000     # LZ4 (nvcc's "speed" mode) | zstd (its default for PTX)
STO_CUDA_ENTRY = 0x10
_STT_FUNC = 2
_MAX_NAME = 4096                       # symbol names longer than this are cut (no demangling of them either)
_MAX_KERNELS = 4096                    # more kernel symbols than this: unknown (never a silently cut list)
_MAX_FATBIN = 32 << 20                 # a larger .nv_fatbin section: unknown (honest ones are KBs to MBs)
_MAX_PTX = 32 << 20                    # a larger PTX text: unreadable
_MAX_DEMANGLED = 8 * _MAX_NAME         # a longer demangled form: the mangled name stands alone
_SYMBOL_SIZE = 24                      # an ELF64 symbol table entry
# [ \t], not \s: with re.M, \s also matches newlines, and a body of newlines would backtrack quadratically
_PTX_ENTRY = re.compile(rb"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]+([A-Za-z_$%][\w$%]*)", re.M)


class BinaryError(ValueError):
    """The file is not an ELF shared object we can read."""


def _sections(elf: bytes) -> dict[str, tuple[int, int, int, int, int]]:
    """{name: (offset, size, link, entsize, index)} of a little-endian ELF64 file."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise BinaryError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shentsize < 64 or not 0 < shnum <= 65535 or shoff + shnum * shentsize > len(elf) or shstrndx >= shnum:
        raise BinaryError("bad section table")
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_off, names_size = heads[shstrndx][4], heads[shstrndx][5]
    out = {}
    for i, (name, _type, _flags, _addr, off, size, link, _info, _align, entsize) in enumerate(heads):
        if name >= names_size:
            continue
        end = elf.find(b"\0", names_off + name, min(names_off + names_size, names_off + name + _MAX_NAME + 1))
        if end < 0:
            continue
        if off + size > len(elf) and _type != 8:   # SHT_NOBITS has no bytes in the file
            raise BinaryError("section beyond the end of the file")
        out.setdefault(elf[names_off + name:end].decode("latin-1"), (off, size, link, entsize, i))
    return out


def cubin_kernels(elf: bytes) -> list[str]:
    """The entry points (kernels) of one cubin: FUNC symbols marked STO_CUDA_ENTRY."""
    sections = _sections(elf)
    sym = sections.get(".symtab")
    if sym is None:
        return []
    off, size, link, entsize, _ = sym
    if entsize not in (0, _SYMBOL_SIZE):
        raise BinaryError("symbol table entries of an unexpected size")
    entsize = _SYMBOL_SIZE
    by_index = {v[4]: v for v in sections.values()}
    if link not in by_index:
        raise BinaryError("symbol table without its string table")
    str_off, str_size = by_index[link][0], by_index[link][1]
    names = []
    for p in range(off, off + size - entsize + 1, entsize):
        st_name, st_info, st_other = struct.unpack_from("<IBB", elf, p)
        if st_info & 0xF != _STT_FUNC or not st_other & STO_CUDA_ENTRY or st_name >= str_size:
            continue
        start = str_off + st_name
        end = elf.find(b"\0", start, min(str_off + str_size, start + _MAX_NAME))
        if end < 0:
            end = min(str_off + str_size, start + _MAX_NAME)   # cut (a name no profiler shows whole either)
        if end > start:
            names.append(elf[start:end].decode("latin-1"))
            if len(names) > _MAX_KERNELS:
                raise BinaryError("more kernel symbols than are read")
    return names


def fatbin_kernels(section: bytes) -> tuple[list[str], int]:
    """(kernel symbols, number of fat binaries whose kernels could not be read) of a `.nv_fatbin` section."""
    names: list[str] = []
    unreadable = 0
    p = 0
    while p + 16 <= len(section):
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", section, p)
        if magic != FATBIN_MAGIC:
            p += 8   # fat binaries are 8-aligned, with padding between them
            continue
        end = min(len(section), p + header_size + body_size)
        q = p + header_size
        found, ptx_names, compressed = False, [], False
        while q + 16 <= end:
            kind, _v, entry_header, entry_size = struct.unpack_from("<HHIQ", section, q)
            if entry_header < 16 or q + entry_header + entry_size > end:
                raise BinaryError("fat binary entry beyond its fat binary")
            flags = struct.unpack_from("<Q", section, q + 40)[0] if entry_header >= 48 else 0
            body = section[q + entry_header:q + entry_header + entry_size]
            if flags & _FLAG_COMPRESSED or (kind == _KIND_ELF and body[:4] != b"\x7fELF"):
                compressed = compressed or kind in (_KIND_ELF, _KIND_PTX)
            elif kind == _KIND_ELF:
                found = True
                names += cubin_kernels(body)
            elif kind == _KIND_PTX and len(body) > _MAX_PTX:
                compressed = True        # too large to read: unknown, as a compressed one
            elif kind == _KIND_PTX:
                ptx_names += [m.group(1)[:_MAX_NAME].decode("latin-1") for m in _PTX_ENTRY.finditer(body)]
            if len(names) + len(ptx_names) > _MAX_KERNELS:
                raise BinaryError("more kernel symbols than are read")
            q += entry_header + entry_size
        if found:
            pass                      # the cubins hold every kernel of this translation unit
        elif compressed:
            unreadable += 1
        else:
            names += ptx_names
        p = max(end, p + 16)
    return names, unreadable


def binary_kernels(path: str) -> list[str] | None:
    """The kernel symbols (mangled, sorted, unique) of the device code in the shared object at `path`: [] when it
    has none, None when some of it cannot be read (see the module doc) or the file is no ELF we can read. The file is
    mapped, not read: only its section table and its `.nv_fatbin` section are looked at."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as elf:
            sections = _sections(elf)
            fatbin = sections.get(".nv_fatbin")
            if fatbin is None:
                return []
            if fatbin[1] > _MAX_FATBIN:
                return None
            names, unreadable = fatbin_kernels(elf[fatbin[0]:fatbin[0] + fatbin[1]])
    except (OSError, ValueError, IndexError, OverflowError, struct.error, MemoryError):   # BinaryError included
        return None
    if unreadable:
        return None
    return sorted(set(names))


# The child that demangles: its own address-space and CPU limits bound what a hostile name can cost; names on stdin
# (JSON), their demangled forms (or null) on stdout.
_DEMANGLER = r"""
import ctypes, ctypes.util, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
resource.setrlimit(resource.RLIMIT_CPU, (5, 5))
try:
    lib = ctypes.CDLL("libstdc++.so.6")
except OSError:
    lib = ctypes.CDLL(ctypes.util.find_library("stdc++"))
fn = lib.__cxa_demangle
fn.restype = ctypes.c_void_p
fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
free = ctypes.CDLL(None).free
free.argtypes = [ctypes.c_void_p]
out = []
for name in json.load(sys.stdin):
    status = ctypes.c_int(0)
    ptr = fn(name.encode("latin-1"), None, None, ctypes.byref(status))
    text = None
    if ptr:
        if status.value == 0:
            raw = ctypes.string_at(ptr)
            text = raw.decode("latin-1") if len(raw) <= MAX_CHARS else None
        free(ptr)
    out.append(text)
json.dump(out, sys.stdout)
"""


def _mangled(name: str) -> bool:
    return name.startswith("_Z") and len(name) <= _MAX_NAME and re.fullmatch(r"[\w$.]+", name) is not None


def demangle_all(names) -> dict[str, str]:
    """{name: its C++ demangled form, as the CUDA profiler shows kernel names (`_Z3fooPf` -> `foo(float*)`)} for the
    names that are mangled C++ names and demangle within the child's limits (the others are left out: extern "C"
    kernels, and names whose demangled form is too large, which then match only by their mangled form)."""
    todo = sorted({n for n in names if _mangled(n)})
    if not todo:
        return {}
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _DEMANGLER.replace("MAX_CHARS", str(_MAX_DEMANGLED))],
                              input=json.dumps(todo), capture_output=True, text=True, timeout=20)
        out = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        out = None
    if not isinstance(out, list) or len(out) != len(todo):
        return {}
    return {n: d for n, d in zip(todo, out) if isinstance(d, str) and d}


def demangle(name: str) -> str:
    """The demangled form of one symbol (demangle_all), or the name itself."""
    return demangle_all([name]).get(name, name)


def kernel_names(symbols) -> list[str]:
    """The names a kernel trace may show for these symbols: each mangled name and its demangled form."""
    symbols = list(symbols)
    return sorted(set(symbols) | set(demangle_all(symbols).values()))
