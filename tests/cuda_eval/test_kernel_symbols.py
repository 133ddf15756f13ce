"""The candidate's kernels, read from its built binary (protocol/kernel_symbols.py): what the build produced, never
what the source's text mentions or what a kernel is called."""
import os
import struct
import subprocess

import pytest

from cuda_eval.protocol import kernel_symbols

# Real kernels named like an allocator's copy and like our digest, a templated one in a namespace and an extern "C"
# one; kernels that exist only in a comment, a string and a dead #if 0 block.
WITH_KERNELS = r'''
// __global__ void in_a_comment(float* y) {}
/* __global__ void in_a_block_comment(float* y) {} */
static const char* text = "__global__ void in_a_string(float* y) {}";
#if 0
__global__ void in_dead_code(float* y) {}
#endif
__global__ void copy_kernel_relu(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
namespace ns { template <int N> __global__ void digest_tree_k(float* y) { y[threadIdx.x] *= N; } }
extern "C" __global__ void plain_c(float* y) { y[0] = 1.f; }
void launch(const float* x, float* y, int n) {
    copy_kernel_relu<<<1, 1>>>(x, y, n);
    ns::digest_tree_k<3><<<1, 1>>>(y);
    plain_c<<<1, 1>>>(y);
}
const char* keep() { return text; }
'''
# No kernel at all, though its text declares some: what a source regex took for the candidate's kernels.
WITHOUT_KERNELS = r'''
#include <cuda_runtime.h>
// __global__ void relu_kernel(const float* x, float* y, int n) { ... }
static const char* doc = "__global__ void vectorized_elementwise_kernel(float* y) {}";
#if 0
__global__ void relu_kernel(const float* x, float* y, int n) {}
#endif
int host_only(int n) { return n + (doc[0] == '_'); }
'''


def _build(tmp_path, name: str, source: str, *flags: str) -> str:
    cu, so = tmp_path / f"{name}.cu", tmp_path / f"{name}.so"
    cu.write_text(source)
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", *flags, "-o", str(so), str(cu)], check=True,
                   capture_output=True, timeout=600)
    return str(so)


@pytest.mark.nvcc
def test_kernels_are_the_binarys_entry_points(tmp_path):
    so = _build(tmp_path, "with", WITH_KERNELS, "-gencode=arch=compute_90,code=sm_90")
    symbols = kernel_symbols.binary_kernels(so)
    assert symbols == ["_Z16copy_kernel_reluPKfPfi", "_ZN2ns13digest_tree_kILi3EEEvPf", "plain_c"]
    # the names the CUDA profiler shows (demangled), beside the symbols
    assert kernel_symbols.kernel_names(symbols) == [
        "_Z16copy_kernel_reluPKfPfi", "_ZN2ns13digest_tree_kILi3EEEvPf", "copy_kernel_relu(float const*, float*, int)",
        "plain_c", "void ns::digest_tree_k<3>(float*)"]
    # -arch=sm_90 adds nvcc's compressed PTX beside the cubin: the cubin holds the same kernels
    assert kernel_symbols.binary_kernels(_build(tmp_path, "arch", WITH_KERNELS, "-arch=sm_90")) == symbols


@pytest.mark.nvcc
def test_a_binary_without_kernels_has_none_whatever_its_text_says(tmp_path):
    so = _build(tmp_path, "without", WITHOUT_KERNELS, "-gencode=arch=compute_90,code=sm_90")
    assert kernel_symbols.binary_kernels(so) == []


@pytest.mark.nvcc
def test_unreadable_device_code_leaves_the_kernels_unknown(tmp_path):
    """PTX only (compressed by nvcc, no cubin beside it): the kernels are unknown, not "none"."""
    assert kernel_symbols.binary_kernels(_build(tmp_path, "ptx", WITH_KERNELS, "-arch=compute_90")) is None


def test_files_that_are_not_readable_binaries(tmp_path):
    """A missing file, a non-ELF file, a truncated ELF and a fat binary whose entry runs past its end give None
    (unknown) or [] (no device code), never an exception."""
    assert kernel_symbols.binary_kernels(str(tmp_path / "missing.so")) is None
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF" + os.urandom(200))
    assert kernel_symbols.binary_kernels(str(junk)) is None
    junk.write_bytes(b"not an elf at all")
    assert kernel_symbols.binary_kernels(str(junk)) is None
    # one fat binary with one ELF entry claiming 1 MiB in a 64-byte body
    section = struct.pack("<IHHQ", kernel_symbols.FATBIN_MAGIC, 1, 16, 64) + struct.pack("<HHIQ", 2, 0x101, 64, 1 << 20)
    with pytest.raises(kernel_symbols.BinaryError):
        kernel_symbols.fatbin_kernels(section + bytes(48))
    assert kernel_symbols.fatbin_kernels(b"") == ([], 0)


def test_demangling_is_bounded():
    assert kernel_symbols.demangle("_Z3fooPf") == "foo(float*)"
    assert kernel_symbols.demangle("plain_c") == "plain_c"
    assert kernel_symbols.demangle("_Z" + "x" * 10000) == "_Z" + "x" * 10000      # too long: left as it is
    assert kernel_symbols.demangle("_Z3foo;rm") == "_Z3foo;rm"                    # not a symbol


def test_a_section_table_without_sections_is_unknown(tmp_path):
    """An ELF header that declares no sections (e_shnum 0, e_shstrndx 0) is unknown, not an IndexError."""
    elf = bytearray(128)
    elf[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", elf, 0x28, 64)
    struct.pack_into("<HHH", elf, 0x3A, 64, 0, 0)
    path = tmp_path / "no_sections.so"
    path.write_bytes(bytes(elf))
    assert kernel_symbols.binary_kernels(str(path)) is None


def test_more_kernels_than_are_read_is_unknown(monkeypatch):
    """A PTX text with more `.entry`s than are read makes the kernels unknown, never a list silently cut short."""
    monkeypatch.setattr(kernel_symbols, "_MAX_KERNELS", 3)
    ptx = b"".join(b".visible .entry k%d(\n)\n{\n}\n" % i for i in range(5))
    entry = struct.pack("<HHIQ", 1, 0x101, 16, len(ptx)) + ptx
    section = struct.pack("<IHHQ", kernel_symbols.FATBIN_MAGIC, 1, 16, len(entry)) + entry
    with pytest.raises(kernel_symbols.BinaryError):
        kernel_symbols.fatbin_kernels(section)
    monkeypatch.setattr(kernel_symbols, "_MAX_KERNELS", 10)
    assert kernel_symbols.fatbin_kernels(section) == ([f"k{i}" for i in range(5)], 0)


def test_a_demangled_form_too_large_is_left_out(monkeypatch):
    """The demangler runs in a child with its own limits; a demangled form over the size cap is dropped (the
    mangled name then stands alone), the others are kept."""
    monkeypatch.setattr(kernel_symbols, "_MAX_DEMANGLED", 12)
    assert kernel_symbols.demangle_all(["_Z3fooPf", "_Z6foobarPfS_S_"]) == {"_Z3fooPf": "foo(float*)"}
    assert kernel_symbols.kernel_names(["_Z6foobarPfS_S_"]) == ["_Z6foobarPfS_S_"]
