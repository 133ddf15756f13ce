"""The CUDA kernels a built extension holds, read from the binary itself: which kernels are the candidate's is
decided by what its build produced, never by what its source says (a `__global__` in a comment, a string or an
`#if 0` block defines nothing) or by what a kernel is called.

An extension's device code is in the `.nv_fatbin` section of its shared object: one fat binary per translation
unit, each a list of entries (a cubin, an ELF per GPU architecture, or PTX text). A kernel is an entry point of a
cubin (a FUNC symbol marked STO_CUDA_ENTRY) or a `.entry` of PTX. Entries compressed by nvcc (zstd/LZ4) are read
only when the same fat binary holds a cubin (the cubin of a translation unit holds every kernel its PTX does);
otherwise the kernels are unknown (None), and callers fall back to checks that need no names.

Parsing is plain Python over bytes with every offset bounded: the shared object is built from hostile source, so
no tool of ours (cuobjdump, a C demangler on unbounded input) runs on it in the trusted process.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import struct

FATBIN_MAGIC = 0xBA55ED50
_KIND_PTX, _KIND_ELF = 1, 2
_FLAG_COMPRESSED = 0x2000 | 0x8000     # LZ4 (nvcc's "speed" mode) | zstd (its default for PTX)
STO_CUDA_ENTRY = 0x10
_STT_FUNC = 2
_MAX_NAME = 4096                       # symbol names longer than this are cut (no demangling of them either)
_MAX_KERNELS = 4096
_PTX_ENTRY = re.compile(rb"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$%][\w$%]*)", re.M)


class BinaryError(ValueError):
    """The file is not an ELF shared object we can read."""


def _sections(elf: bytes) -> dict[str, tuple[int, int, int, int, int]]:
    """{name: (offset, size, link, entsize, index)} of a little-endian ELF64 file."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise BinaryError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shentsize < 64 or shnum > 65535 or shoff + shnum * shentsize > len(elf) or shstrndx >= max(shnum, 1):
        raise BinaryError("bad section table")
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_off, names_size = heads[shstrndx][4], heads[shstrndx][5]
    out = {}
    for i, (name, _type, _flags, _addr, off, size, link, _info, _align, entsize) in enumerate(heads):
        if name >= names_size:
            continue
        end = elf.find(b"\0", names_off + name, names_off + names_size)
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
    entsize = entsize or 24
    by_index = {v[4]: v for v in sections.values()}
    if link not in by_index:
        raise BinaryError("symbol table without its string table")
    str_off, str_size = by_index[link][0], by_index[link][1]
    names = []
    for p in range(off, off + size - entsize + 1, entsize):
        st_name, st_info, st_other = struct.unpack_from("<IBB", elf, p)
        if st_info & 0xF != _STT_FUNC or not st_other & STO_CUDA_ENTRY or st_name >= str_size:
            continue
        end = elf.find(b"\0", str_off + st_name, str_off + str_size)
        if end > str_off + st_name:
            names.append(elf[str_off + st_name:min(end, str_off + st_name + _MAX_NAME)].decode("latin-1"))
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
            elif kind == _KIND_PTX:
                ptx_names += [m.group(1)[:_MAX_NAME].decode("latin-1") for m in _PTX_ENTRY.finditer(body)]
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
    has none, None when some of it cannot be read (see the module doc) or the file is no ELF we can read."""
    try:
        with open(path, "rb") as f:
            elf = f.read()
        sections = _sections(elf)
        fatbin = sections.get(".nv_fatbin")
        if fatbin is None:
            return []
        names, unreadable = fatbin_kernels(elf[fatbin[0]:fatbin[0] + fatbin[1]])
    except (OSError, BinaryError, struct.error):
        return None
    if unreadable:
        return None
    return sorted(set(names))[:_MAX_KERNELS]


@functools.lru_cache(maxsize=1)
def _cxa_demangle():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return fn, free


def demangle(name: str) -> str:
    """The C++ demangled form of a symbol, as the CUDA profiler shows kernel names (`_Z3fooPf` -> `foo(float*)`);
    the name itself when it is not a mangled C++ name (extern "C" kernels) or cannot be demangled."""
    if not name.startswith("_Z") or len(name) > _MAX_NAME or not re.fullmatch(r"[\w$.]+", name):
        return name
    found = _cxa_demangle()
    if found is None:
        return name
    fn, free = found
    status = ctypes.c_int(0)
    ptr = fn(name.encode("latin-1"), None, None, ctypes.byref(status))
    if not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode("latin-1") if status.value == 0 else name
    finally:
        free(ptr)


def kernel_names(symbols) -> list[str]:
    """The names a kernel trace may show for these symbols: each mangled name and its demangled form."""
    out = set()
    for s in symbols:
        out.add(s)
        out.add(demangle(s))
    return sorted(out)
