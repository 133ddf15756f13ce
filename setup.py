"""Builds cuda_eval._native (pybind11, C++17). No CUDA toolkit needed at build time: libcudart is dlopen'ed at run
time so that the module imports on CPU-only machines (CI)."""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

native = Pybind11Extension(
    "cuda_eval._native",
    sources=["cuda_eval/_native/module.cpp", "cuda_eval/_native/sandbox.cpp", "cuda_eval/_native/cuda_timer.cpp"],
    include_dirs=["cuda_eval/_native"],
    cxx_std=17,
    extra_compile_args=["-O2", "-Wall"],
    libraries=["dl"],
)

setup(ext_modules=[native], cmdclass={"build_ext": build_ext})
