"""What an unprivileged sandbox uid needs to run Python and compile, staged where it can read it.

A dedicated sandbox uid cannot read files under a 0700 directory such as /root: a pyenv interpreter
(/root/.pyenv/...), its stdlib and Python.h, or a checkout of this repository under /root. When that is the case we
copy the missing pieces once per machine into a world-readable runtime dir (`CUDA_EVAL_SANDBOX_RUNTIME_DIR`, default
/tmp/cuda_eval_runtime; ~150 MB, about a second):
- this package (cuda_eval/*.py and the native module) -> <runtime>/pkg-<hash>/cuda_eval, first on PYTHONPATH;
- the base interpreter, its stdlib (without test/ and site-packages), libpython and include dir -> <runtime>/py-<hash>/base,
  plus a venv whose site-packages is a symlink to ours (it must itself be world-readable: /work/venv is).
Files are copied, never made readable in place: we do not change permissions of anything we did not create.
`RuntimeView.python` is the interpreter to exec in the sandbox, `path_map` rewrites real paths (e.g. compiler include
dirs) into staged ones, `env` adds LD_LIBRARY_PATH/PYTHONPATH entries.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
import threading

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
RUNTIME_DIR = os.environ.get("CUDA_EVAL_SANDBOX_RUNTIME_DIR", "/tmp/cuda_eval_runtime")
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"}


@dataclasses.dataclass(frozen=True)
class RuntimeView:
    python: str                       # interpreter path the sandbox uid can execute
    path_map: tuple[tuple[str, str], ...] = ()  # (real prefix, staged prefix), longest first
    env: tuple[tuple[str, str], ...] = ()       # variables to prepend (os.pathsep-joined) in the sandbox
    staged: tuple[str, ...] = ()      # what had to be staged, for logs

    def map_path(self, path: str) -> str:
        for real, staged in self.path_map:
            if path == real or path.startswith(real + os.sep):
                return staged + path[len(real):]
        return path


def world_readable(path: str) -> bool:
    """True if any uid can read `path` (and list/enter it if it is a directory): every ancestor has o+x."""
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:
        return False
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
    if st.st_mode & need != need:
        return False
    parent = os.path.dirname(path)
    while True:
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def _tree_key(root: str, skip=frozenset()) -> str:
    h = hashlib.sha256(root.encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and d != "__pycache__")
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            h.update(f"{os.path.relpath(os.path.join(dirpath, name), root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _publish(final: str, build) -> str:
    """Create `final` (a directory) once, atomically, under a lock: build(tmp_dir) fills a temp dir that is renamed."""
    if os.path.isdir(final):
        return final
    os.makedirs(RUNTIME_DIR, exist_ok=True)
    os.chmod(RUNTIME_DIR, 0o755)
    with open(os.path.join(RUNTIME_DIR, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(final):
            return final
        tmp = tempfile.mkdtemp(prefix=".staging-", dir=RUNTIME_DIR)
        try:
            build(tmp)
            for dirpath, dirnames, filenames in os.walk(tmp):
                os.chmod(dirpath, 0o755)
                for name in filenames:
                    p = os.path.join(dirpath, name)
                    if not os.path.islink(p):
                        os.chmod(p, 0o755 if os.access(p, os.X_OK) else 0o644)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _stage_package() -> str:
    """Copy of this package (sources and native module) readable by any uid; returns the dir to put on PYTHONPATH."""
    key = _tree_key(PACKAGE_DIR)
    final = os.path.join(RUNTIME_DIR, f"pkg-{key}")

    def build(tmp: str) -> None:
        shutil.copytree(PACKAGE_DIR, os.path.join(tmp, "cuda_eval"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return _publish(final, build)


def _stage_interpreter() -> tuple[str, list[tuple[str, str]], str]:
    """(python, path_map entries, lib dir) of a staged copy of our base interpreter as a venv over our site-packages."""
    real_python = os.path.realpath(sys.executable)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = sysconfig.get_paths()["stdlib"]
    include = sysconfig.get_paths()["include"]
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    purelib = sysconfig.get_paths()["purelib"]
    if sys.prefix == sys.base_prefix:
        raise RuntimeError(f"the interpreter {real_python} is not readable by the sandbox uid and we do not run in a "
                           "venv whose site-packages could be shared; use a world-readable Python")
    if not world_readable(purelib):
        raise RuntimeError(f"site-packages {purelib} is not readable by the sandbox uid")
    key = hashlib.sha256(f"{real_python}|{sys.version}|{os.stat(real_python).st_mtime_ns}|{purelib}".encode())
    final = os.path.join(RUNTIME_DIR, f"py-{key.hexdigest()[:16]}")
    libs = [f for f in (os.listdir(libdir) if os.path.isdir(libdir) else []) if f.startswith("libpython")
            and ".so" in f]

    def build(tmp: str) -> None:
        base = os.path.join(tmp, "base")
        os.makedirs(os.path.join(base, "bin"))
        shutil.copy2(real_python, os.path.join(base, "bin", f"python{version}"))
        shutil.copytree(stdlib, os.path.join(base, "lib", f"python{version}"),
                        ignore=lambda d, names: [n for n in names if d == stdlib and n in _STDLIB_SKIP])
        for lib in libs:
            src = os.path.join(libdir, lib)
            dst = os.path.join(base, "lib", lib)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            else:
                shutil.copy2(src, dst)
        if os.path.isdir(include):
            shutil.copytree(include, os.path.join(base, "include", os.path.basename(include)))
        venv = os.path.join(tmp, "venv")
        os.makedirs(os.path.join(venv, "bin"))
        os.makedirs(os.path.join(venv, "lib", f"python{version}"))
        with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
            f.write(f"home = {os.path.join(final, 'base', 'bin')}\ninclude-system-site-packages = false\n"
                    f"version = {sys.version.split()[0]}\n")
        os.symlink(os.path.join(final, "base", "bin", f"python{version}"), os.path.join(venv, "bin", "python"))
        os.symlink(purelib, os.path.join(venv, "lib", f"python{version}", "site-packages"))
    _publish(final, build)
    path_map = [(stdlib, os.path.join(final, "base", "lib", f"python{version}"))]
    if os.path.isdir(include):
        path_map.append((include, os.path.join(final, "base", "include", os.path.basename(include))))
    return os.path.join(final, "venv", "bin", "python"), path_map, os.path.join(final, "base", "lib")


_lock = threading.Lock()
_view: list[RuntimeView] = []


def runtime_view() -> RuntimeView:
    """The (cached) view of our runtime for a sandbox uid; stages what it cannot read. Raises RuntimeError if that
    is impossible (the caller then runs the sandbox as our own uid)."""
    with _lock:
        if _view:
            return _view[0]
        python = sys.executable
        path_map: list[tuple[str, str]] = []
        env: list[tuple[str, str]] = []
        staged: list[str] = []
        paths = sysconfig.get_paths()
        interp_ok = all(world_readable(p) for p in
                        (os.path.realpath(sys.executable), paths["stdlib"], paths["include"], paths["purelib"]))
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and not world_readable(libdir):
            interp_ok = False
        if not interp_ok:
            python, entries, lib = _stage_interpreter()
            path_map += entries
            env.append(("LD_LIBRARY_PATH", lib))
            staged.append(f"interpreter {os.path.realpath(sys.executable)} -> {python}")
        if not world_readable(os.path.join(PACKAGE_DIR, "__init__.py")):
            pkg_parent = _stage_package()
            env.append(("PYTHONPATH", pkg_parent))
            path_map.append((PACKAGE_DIR, os.path.join(pkg_parent, "cuda_eval")))
            staged.append(f"package {PACKAGE_DIR} -> {pkg_parent}")
        path_map.sort(key=lambda e: -len(e[0]))
        view = RuntimeView(python=python, path_map=tuple(path_map), env=tuple(env), staged=tuple(staged))
        _view.append(view)
        return view
