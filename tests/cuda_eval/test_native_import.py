"""`import cuda_eval._native` gives the built extension or a clear ImportError, never an empty namespace package
(which a leftover `_native/` directory, e.g. the C++ sources' old home, would otherwise become)."""
import os
import shutil
import subprocess
import sys

import cuda_eval
from cuda_eval import _native

PACKAGE_DIR = os.path.dirname(os.path.abspath(cuda_eval.__file__))


def test_the_real_extension_is_imported():
    assert _native.__file__.endswith(".so") and hasattr(_native, "kill_uid")


def test_a_missing_build_is_a_clear_import_error(tmp_path):
    pkg = tmp_path / "cuda_eval"
    shutil.copytree(PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so", "native_src"))
    (pkg / "_native").mkdir()  # the namespace-package trap
    (pkg / "_native" / "module.cpp").write_text("// sources\n")
    code = ("import cuda_eval, sys\n"
            "assert cuda_eval.__file__.startswith(sys.argv[1]), cuda_eval.__file__\n"
            "stmts = ('import cuda_eval._native', 'from cuda_eval import _native', "
            "'from cuda_eval.sandbox import runner')\n"
            "for stmt in stmts:\n"
            "    try:\n"
            "        exec(stmt)\n"
            "        print('IMPORTED', stmt)\n"
            "    except ImportError as e:\n"
            "        print('ImportError:', e)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("ImportError: the native extension cuda_eval._native is not "
                                                   "built: run `pip install -e .`") for line in lines), out.stdout
