"""What an unprivileged sandbox uid needs to run Python and compile, staged where it can read it.

A dedicated sandbox uid cannot read files under a 0700 directory: a pyenv interpreter under /root, a clone of this
repository in a private folder (`mktemp -d`, anything under /root) and the .venv inside it, with torch and an editable
install of this package. We never make anything readable in place; instead the pieces the uid cannot read are staged
once per machine (and again when they change) into a world-readable runtime dir (`CUDA_EVAL_SANDBOX_RUNTIME_DIR`,
default /tmp/cuda_eval_runtime), each keyed by a stamp of its content (paths, sizes, mtimes, inodes):
- the base interpreter (binary, stdlib, libpython, include dir) -> <runtime>/py-<key>/base;
- the venv (site-packages with torch: tens of thousands of files) -> <runtime>/venv-<key>, a tree of hard links to
  the original files where that is safe (same filesystem, file already o+r, not o+w, not setuid), else copies;
  when the venv is readable and only the interpreter is not, a small venv whose site-packages is a symlink to ours;
- this package (sources and the built native module) -> <runtime>/pkg-<key>/cuda_eval, first on PYTHONPATH, so an
  editable install's finder in site-packages never gets to point the sandbox at the unreadable original.
Directories and copies are ours (0755 / 0644 or 0755); hard-linked files keep their own (already o+r) modes.
Publishing is atomic (a temp dir renamed under a lock), so concurrent evaluators share one staging.
`RuntimeView.python` is the interpreter to exec in the sandbox, `path_map` rewrites real paths (compiler include
dirs, the interpreter's own files) into staged ones, `env` adds LD_LIBRARY_PATH/PYTHONPATH entries.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import os
import shutil
import site
import stat
import sys
import sysconfig
import tempfile
import threading

import cuda_eval
from cuda_eval.sandbox import safe_dirs

PACKAGE_DIR = os.path.dirname(os.path.abspath(cuda_eval.__file__))  # the whole package, not this folder
RUNTIME_DIR = os.environ.get("CUDA_EVAL_SANDBOX_RUNTIME_DIR", "/tmp/cuda_eval_runtime")
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"}
# Never part of a content stamp: our own imports rewrite them, and a stale .pyc is only slower, never wrong.
_STAMP_SKIP = {"__pycache__"}


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
    return why_unreadable(path) is None


def why_unreadable(path: str) -> str | None:
    """None if any uid can read `path`; else which component stops them, e.g. "/root (mode 0700) lacks o+x"."""
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{path}: {e.strerror}"
    need, what = (stat.S_IROTH | stat.S_IXOTH, "o+rx") if stat.S_ISDIR(st.st_mode) else (stat.S_IROTH, "o+r")
    if st.st_mode & need != need:
        return f"{path} (mode {stat.S_IMODE(st.st_mode):04o}) lacks {what}"
    parent = os.path.dirname(path)
    while True:
        try:
            mode = os.stat(parent).st_mode
        except OSError as e:
            return f"{parent}: {e.strerror}"
        if not mode & stat.S_IXOTH:
            return f"{parent} (mode {stat.S_IMODE(mode):04o}) lacks o+x"
        if parent == "/":
            return None
        parent = os.path.dirname(parent)


# --- content stamps -----------------------------------------------------------------------------------------------
def _tree_key(root: str, skip=frozenset()) -> str:
    """A stamp of everything under `root` (names, types, modes, sizes, mtimes, inodes, link targets): any install,
    upgrade or replaced file changes it. `skip`: names of top-level entries to leave out."""
    h = hashlib.sha256(root.encode())
    stack = [(root, True)]
    while stack:
        d, top = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.name in _STAMP_SKIP or (top and e.name in skip):
                continue
            st = e.stat(follow_symlinks=False)
            rel = os.path.relpath(e.path, root)
            h.update(f"{rel}\0{st.st_mode}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}\n".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(e.path).encode())
            elif stat.S_ISDIR(st.st_mode):
                stack.append((e.path, False))
    return h.hexdigest()[:16]


# --- publishing ---------------------------------------------------------------------------------------------------
def _check_runtime_dir() -> None:
    """Create RUNTIME_DIR (0755) and make sure nobody else controls it or a directory above it (safe_dirs): whoever
    could write there could plant code that every sandboxed process (and every later evaluator) imports."""
    safe_dirs.ensure_dir(RUNTIME_DIR, 0o755, what="to stage code in the sandbox runtime dir",
                         fix="Remove it (or chown it to root), or set CUDA_EVAL_SANDBOX_RUNTIME_DIR elsewhere")


_held: list[int] = []  # fds holding a shared flock on <dir>/.in_use for every staged dir this process uses


def _hold(final: str) -> bool:
    """Mark `final` as used by this process for its lifetime (a shared flock that _collect respects)."""
    try:
        fd = os.open(os.path.join(final, ".in_use"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_SH)
    if not os.path.isdir(final):  # collected between the open and the lock
        os.close(fd)
        return False
    _held.append(fd)
    return True


def _collect(kind: str, keep: str) -> None:
    """Remove stagings of `kind` (e.g. "venv-") that no live process holds: every install change makes a new one.
    Called under the runtime lock, so leftover .staging-* dirs are dead builds and go too."""
    for e in os.scandir(RUNTIME_DIR):
        if e.name.startswith(".staging-") or e.name.startswith(".trash-"):
            shutil.rmtree(e.path, ignore_errors=True)
            continue
        if not e.name.startswith(kind) or e.path == keep or not e.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(os.path.join(e.path, ".in_use"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # not made by this code: leave it
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            trash = tempfile.mkdtemp(prefix=".trash-", dir=RUNTIME_DIR)
            os.rename(e.path, os.path.join(trash, e.name))
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)


def _publish(final: str, build) -> str:
    """Create `final` (a directory) once, atomically, under a lock: build(tmp_dir) fills a temp dir that is renamed.
    The caller's process holds it (see _hold) until it exits; older stagings of the same kind are collected."""
    if _hold(final):
        return final
    _check_runtime_dir()
    # Only we may open the lock files: a sandboxed process holding one would stall every evaluator's staging.
    lock_fd = os.open(os.path.join(RUNTIME_DIR, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(lock_fd, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        if os.path.isdir(final):
            _mark_in_use(final)  # staged by a version of this code that did not mark its dirs
            if _hold(final):
                return final
        tmp = tempfile.mkdtemp(prefix=".staging-", dir=RUNTIME_DIR)
        try:
            build(tmp)
            for dirpath, dirnames, filenames in os.walk(tmp):
                os.chmod(dirpath, 0o755)
                for name in filenames:
                    p = os.path.join(dirpath, name)
                    st = os.lstat(p)
                    # Hard links share the original's inode: their mode is the original's, never ours to change.
                    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                        os.chmod(p, 0o755 if st.st_mode & 0o111 else 0o644)
            _mark_in_use(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if not _hold(final):
            raise OSError(errno.ENOENT, f"{final} vanished right after it was staged")
        _collect(os.path.basename(final).split("-", 1)[0] + "-", keep=final)
    finally:
        os.close(lock_fd)
    return final


def _mark_in_use(d: str) -> None:
    os.close(os.open(os.path.join(d, ".in_use"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))


def _can_link(st: os.stat_result, dst_dev: int) -> bool:
    """A hard link makes the file reachable by every uid: only for files any uid could read anyway (o+r) that no
    sandbox may write through the link (not o+w) and that carry no privileges (no setuid/setgid)."""
    mode = st.st_mode
    return (st.st_dev == dst_dev and stat.S_ISREG(mode) and bool(mode & stat.S_IROTH)
            and not mode & (stat.S_IWOTH | stat.S_ISUID | stat.S_ISGID))


def _link_or_copy(src: str, dst: str, st: os.stat_result, dst_dev: int) -> None:
    if _can_link(st, dst_dev):
        try:
            os.link(src, dst, follow_symlinks=False)
            return
        except OSError:  # EXDEV, EMLINK, a filesystem without links: a copy does
            pass
    shutil.copy2(src, dst, follow_symlinks=False)  # keeps mtimes: the .pyc files next to sources stay valid
    os.chmod(dst, 0o755 if st.st_mode & 0o111 else 0o644)  # never setuid, never o+w


def _link_tree(src: str, dst: str, *, skip=frozenset(), relink: tuple[tuple[str, str], ...] = ()) -> None:
    """Mirror `src` into `dst` (created): directories made by us, files hard-linked when _can_link allows, else
    copied, symlinks recreated (absolute ones into a `relink` prefix are pointed at the staged copy). Sockets, fifos
    and devices are left out; `skip`: top-level names to leave out."""
    os.makedirs(dst, mode=0o755, exist_ok=True)
    dst_dev = os.stat(dst).st_dev
    stack = [(src, dst, True)]
    while stack:
        s_dir, d_dir, top = stack.pop()
        for e in os.scandir(s_dir):
            if top and e.name in skip:
                continue
            d = os.path.join(d_dir, e.name)
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(d, 0o755)
                stack.append((e.path, d, False))
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(e.path)
                for real, staged in relink:
                    if target == real or target.startswith(real + os.sep):
                        target = staged + target[len(real):]
                        break
                os.symlink(target, d)
            elif stat.S_ISREG(st.st_mode):
                _link_or_copy(e.path, d, st, dst_dev)


# --- the pieces ---------------------------------------------------------------------------------------------------
def _version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _base_python() -> str:
    """The base interpreter's binary (a venv's bin/python is a symlink to it)."""
    cfg = _venv_cfg()
    exe = cfg.get("executable")
    if exe and os.path.exists(exe):
        return os.path.realpath(exe)
    return os.path.realpath(sys.executable)


def _venv_cfg() -> dict[str, str]:
    if sys.prefix == sys.base_prefix:
        return {}
    out = {}
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg")) as f:
            for line in f:
                k, sep, v = line.partition("=")
                if sep:
                    out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def _site_dirs() -> list[str]:
    return [d for d in dict.fromkeys(site.getsitepackages() + [sysconfig.get_paths()["purelib"],
                                                                sysconfig.get_paths()["platlib"]])
            if os.path.isdir(d)]


def _libpython() -> tuple[str, list[str]]:
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not os.path.isdir(libdir):
        return libdir, []
    return libdir, sorted(f for f in os.listdir(libdir) if f.startswith("libpython") and ".so" in f)


def _base_unreadable() -> list[str]:
    paths = sysconfig.get_paths()
    libdir, libs = _libpython()
    need = [_base_python(), paths["stdlib"], paths["include"]] + [os.path.join(libdir, lib) for lib in libs]
    if _venv_cfg().get("include-system-site-packages", "false").lower() == "true" or sys.prefix == sys.base_prefix:
        need += [d for d in _site_dirs() if _under(d, sys.base_prefix)]
    return [w for w in (why_unreadable(p) for p in need if os.path.exists(p)) if w]


def _under(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _stage_base() -> tuple[str, list[tuple[str, str]], str]:
    """(python, path_map entries, lib dir) of a staged copy of the base interpreter."""
    real_python = _base_python()
    version = _version()
    paths = sysconfig.get_paths()
    stdlib, include = paths["stdlib"], paths["include"]
    libdir, libs = _libpython()
    base_prefix = os.path.realpath(sys.base_prefix)
    # Without a venv the interpreter's own site-packages is where the packages are; with a venv only when it says
    # include-system-site-packages.
    with_site = sys.prefix == sys.base_prefix or \
        _venv_cfg().get("include-system-site-packages", "false").lower() == "true"
    site_dirs = [d for d in _site_dirs() if _under(d, base_prefix)] if with_site else []
    st = os.stat(real_python)
    key_src = [real_python, sys.version, str(st.st_mtime_ns), str(st.st_ino), stdlib,
               _tree_key(stdlib, skip=frozenset(_STDLIB_SKIP))]
    key_src += [f"{d}:{_tree_key(d)}" for d in site_dirs]
    final = os.path.join(RUNTIME_DIR, "py-" + hashlib.sha256("|".join(key_src).encode()).hexdigest()[:16])
    staged_stdlib = os.path.join(final, "base", "lib", f"python{version}")

    def build(tmp: str) -> None:
        base = os.path.join(tmp, "base")
        os.makedirs(os.path.join(base, "bin"))
        dev = os.stat(base).st_dev
        _link_or_copy(real_python, os.path.join(base, "bin", f"python{version}"), os.stat(real_python), dev)
        _link_tree(stdlib, os.path.join(base, "lib", f"python{version}"), skip=frozenset(_STDLIB_SKIP))
        for d in site_dirs:
            _link_tree(d, os.path.join(base, os.path.relpath(os.path.realpath(d), base_prefix)))
        for lib in libs:
            src, dst = os.path.join(libdir, lib), os.path.join(base, "lib", lib)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            else:
                _link_or_copy(src, dst, os.stat(src), dev)
        if os.path.isdir(include):
            _link_tree(include, os.path.join(base, "include", os.path.basename(include)))
    _publish(final, build)
    path_map = [(stdlib, staged_stdlib)]
    if os.path.realpath(stdlib) != stdlib:
        path_map.append((os.path.realpath(stdlib), staged_stdlib))
    if os.path.isdir(include):
        path_map.append((include, os.path.join(final, "base", "include", os.path.basename(include))))
    for d in site_dirs:
        path_map.append((d, os.path.join(final, "base", os.path.relpath(os.path.realpath(d), base_prefix))))
    python = os.path.join(final, "base", "bin", f"python{version}")
    return python, path_map, os.path.join(final, "base", "lib")


def _stage_venv(base_python: str, venv_readable: bool) -> tuple[str, list[tuple[str, str]]]:
    """(python, path_map entries) of a venv over `base_python`: all of our venv (hard links / copies) when the uid
    cannot read it, else a small venv whose site-packages is a symlink to ours."""
    version = _version()
    prefix = sys.prefix
    real_prefix = os.path.realpath(prefix)
    cfg = _venv_cfg()
    include_system = cfg.get("include-system-site-packages", "false").lower() == "true"
    if venv_readable:
        key_src = f"small|{base_python}|{real_prefix}|{include_system}"
    else:
        key_src = f"full|{base_python}|{real_prefix}|{include_system}|{_tree_key(real_prefix)}"
    final = os.path.join(RUNTIME_DIR, "venv-" + hashlib.sha256(key_src.encode()).hexdigest()[:16])
    site_packages = os.path.join("lib", f"python{version}", "site-packages")

    def build(tmp: str) -> None:
        if venv_readable:
            os.makedirs(os.path.join(tmp, os.path.dirname(site_packages)))
            os.makedirs(os.path.join(tmp, "bin"))
            os.symlink(sysconfig.get_paths()["purelib"], os.path.join(tmp, site_packages))
        else:
            _link_tree(real_prefix, tmp, skip=frozenset({"pyvenv.cfg"}), relink=((prefix, final),
                                                                                 (real_prefix, final)))
            _fix_scripts(os.path.join(tmp, "bin"), (prefix, real_prefix), final)
        for name in ("python", "python3", f"python{version}"):
            p = os.path.join(tmp, "bin", name)
            if os.path.lexists(p):
                os.unlink(p)
            os.symlink(base_python, p)
        with open(os.path.join(tmp, "pyvenv.cfg"), "w") as f:
            f.write(f"home = {os.path.dirname(base_python)}\n"
                    f"include-system-site-packages = {'true' if include_system else 'false'}\n"
                    f"version = {sys.version.split()[0]}\nexecutable = {base_python}\n")
    _publish(final, build)
    path_map = []
    if not venv_readable:
        path_map += [(prefix, final), (real_prefix, final)]
    return os.path.join(final, "bin", "python"), path_map


def _fix_scripts(bin_dir: str, real_prefixes: tuple[str, ...], staged_prefix: str) -> None:
    """Console scripts start with `#!<real venv>/bin/python`: point them at the staged venv (fresh copies; the
    hard-linked originals are left alone)."""
    if not os.path.isdir(bin_dir):
        return
    for e in os.scandir(bin_dir):
        if not e.is_file(follow_symlinks=False):
            continue
        with open(e.path, "rb") as f:
            head = f.read(2)
            if head != b"#!":
                continue
            text = head + f.read()
        line, nl, rest = text.partition(b"\n")
        new = line
        for real in real_prefixes:
            new = new.replace(f"{real}/bin/".encode(), f"{staged_prefix}/bin/".encode())
        if new != line:
            mode = 0o755 if e.stat(follow_symlinks=False).st_mode & 0o111 else 0o644
            os.unlink(e.path)
            with open(e.path, "wb") as f:
                f.write(new + nl + rest)
            os.chmod(e.path, mode)


def _stage_package() -> str:
    """Copy of this package (sources and native module) readable by any uid; returns the dir to put on PYTHONPATH."""
    if not any(n.startswith("_native.") and n.endswith(".so") for n in os.listdir(PACKAGE_DIR)):
        raise RuntimeError(f"the native extension cuda_eval._native is not built in {PACKAGE_DIR}: run "
                           "`pip install -e .` or `python setup.py build_ext --inplace`")
    key = _tree_key(PACKAGE_DIR)
    final = os.path.join(RUNTIME_DIR, f"pkg-{key}")

    def build(tmp: str) -> None:
        shutil.copytree(PACKAGE_DIR, os.path.join(tmp, "cuda_eval"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return _publish(final, build)


_lock = threading.Lock()
_view: list[RuntimeView] = []


def staged_path_map() -> list[list[str]]:
    """[real prefix, staged prefix] for every path a sandbox uid reaches through the staged runtime (as root, where
    candidates run as dedicated uids); [] otherwise (a sandbox of our own uid reads our paths as they are)."""
    return [list(e) for e in runtime_view().path_map] if os.geteuid() == 0 else []


def runtime_view() -> RuntimeView:
    """The (cached) view of our runtime for a sandbox uid; stages what it cannot read. Raises OSError/RuntimeError
    if that is impossible (the sandbox then refuses to start: see sandbox.SandboxUnavailable)."""
    with _lock:
        if _view:
            return _view[0]
        python = sys.executable
        path_map: list[tuple[str, str]] = []
        env: list[tuple[str, str]] = []
        staged: list[str] = []
        base_python = _base_python()
        base_why = _base_unreadable()
        in_venv = sys.prefix != sys.base_prefix
        venv_why = [w for w in (why_unreadable(p) for p in [sys.prefix, *_site_dirs()]
                                if _under(p, sys.prefix)) if w] if in_venv else []
        if base_why:
            base_python, entries, lib = _stage_base()
            python = base_python
            path_map += entries
            env.append(("LD_LIBRARY_PATH", lib))
            staged.append(f"interpreter {_base_python()} -> {os.path.dirname(os.path.dirname(base_python))} "
                          f"({base_why[0]})")
        if in_venv and (base_why or venv_why):
            python, entries = _stage_venv(base_python, venv_readable=not venv_why)
            path_map += entries
            if venv_why:
                staged.append(f"venv {sys.prefix} -> {os.path.dirname(os.path.dirname(python))} ({venv_why[0]})")
        pkg_why = why_unreadable(os.path.join(PACKAGE_DIR, "__init__.py"))
        if pkg_why:
            pkg_parent = _stage_package()
            env.append(("PYTHONPATH", pkg_parent))
            path_map.append((PACKAGE_DIR, os.path.join(pkg_parent, "cuda_eval")))
            staged.append(f"package {PACKAGE_DIR} -> {pkg_parent} ({pkg_why})")
        path_map.sort(key=lambda e: -len(e[0]))
        view = RuntimeView(python=python, path_map=tuple(path_map), env=tuple(env), staged=tuple(staged))
        _view.append(view)
        return view
