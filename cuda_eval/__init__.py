"""cuda_eval: the evaluator (= the reward function) for model-written CUDA kernels.

Importing this package is cheap and never imports torch: the trainer process runs JAX, torch lives in the
sandboxed compile and GPU worker processes. The public door is `cuda_eval.api`; the layers below it are described in
docs/ARCHITECTURE.md ("cuda_eval internals").
"""
import importlib.machinery
import importlib.util
import os
import sys

NATIVE_NOT_BUILT = ("the native extension cuda_eval._native is not built: run `pip install -e .` or "
                    "`python setup.py build_ext --inplace`")


class _NativeFinder:
    """Resolves `cuda_eval._native` to the built extension module only. Without it, a directory named `_native`
    (the C++ sources once lived in one; an old checkout keeps it, with its __pycache__) would be imported as an
    empty namespace package whenever the .so is missing, and fail much later with an AttributeError."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "cuda_eval._native":
            return None
        for d in path or ():  # the __path__ of whichever cuda_eval is being imported
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                candidate = os.path.join(d, "_native" + suffix)
                if os.path.isfile(candidate):
                    return importlib.util.spec_from_file_location(fullname, candidate)
        raise ImportError(NATIVE_NOT_BUILT, name=fullname)


if not any(type(f).__name__ == "_NativeFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _NativeFinder())
