"""Builds cuda_eval._native (pybind11, C++17). No CUDA toolkit needed at build time: libcudart is dlopen'ed at run
time so that the module imports on CPU-only machines (CI)."""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

native = Pybind11Extension(
    "cuda_eval._native",
    # The sources live in native_src/, not _native/: a directory named like the module would be imported as an
    # empty namespace package whenever the built .so is missing (docs/EVALUATOR.md, "Known limits").
    sources=["cuda_eval/sandbox/native_src/module.cpp", "cuda_eval/sandbox/native_src/sandbox.cpp",
             "cuda_eval/sandbox/native_src/cuda_timer.cpp"],
    include_dirs=["cuda_eval/sandbox/native_src"],
    cxx_std=17,
    extra_compile_args=["-O2", "-Wall"],
    libraries=["dl"],
)

setup(ext_modules=[native], cmdclass={"build_ext": build_ext})
