"""What a sandboxed process starts with: its environment (an allow-list, HOME/TMPDIR = its work dir, this package on
PYTHONPATH, the staged runtime's paths), its work dir handed to its uid, paths rewritten to their staged copies, and
the task count RLIMIT_NPROC sees."""
from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Mapping

from cuda_eval.sandbox import runtime as sandbox_runtime
from cuda_eval.sandbox.config import INSIDE_SANDBOX_ENV
from cuda_eval.sandbox.leases import _Lease
from cuda_eval.sandbox.runtime import RuntimeView


# Environment variables passed through from our environment when set (everything else is dropped).
DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_HOME", "CUDA_PATH", "CUDA_MODULE_LOADING", "LD_LIBRARY_PATH",
    "VIRTUAL_ENV", "CONDA_PREFIX",
)


PACKAGE_PARENT = os.path.dirname(sandbox_runtime.PACKAGE_DIR)   # what holds cuda_eval/: on the sandbox's PYTHONPATH


def _base_env(workdir: str, env_allow: Iterable[str], extra_env: Mapping[str, str],
              view: RuntimeView | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in env_allow if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # The interpreter's directory first, so that "python" in the sandbox is the one running us (or its staged copy).
    py_dir = os.path.dirname(sys.executable if view is None else view.python)
    if py_dir not in env["PATH"].split(os.pathsep):
        env["PATH"] = py_dir + os.pathsep + env["PATH"]
    # Sandbox uids have no passwd entry: getpass.getuser() (torch._dynamo's import calls it for its cache dir)
    # raises KeyError unless USER/LOGNAME name someone; and torch's caches belong in the confined work dir.
    env.update(HOME=workdir, TMPDIR=workdir, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               LANG=env.get("LANG", "C.UTF-8"), USER="cuda_eval_sandbox", LOGNAME="cuda_eval_sandbox",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(workdir, ".torchinductor"), **{INSIDE_SANDBOX_ENV: "1"})
    pythonpath = [PACKAGE_PARENT]
    for k, v in extra_env.items():
        if k == "PYTHONPATH":
            pythonpath = [p for p in v.split(os.pathsep) if p] + pythonpath
        else:
            env[k] = str(v)
    if view is not None:
        pythonpath = [view.map_path(p) for p in pythonpath]
        for k, v in view.env:
            if k == "PYTHONPATH":
                pythonpath.insert(0, v)
            else:
                env[k] = v + (os.pathsep + env[k] if env.get(k) else "")
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pythonpath))
    return env


def _count_own_tasks(uid: int) -> int:
    """Tasks (threads) of `uid`: what RLIMIT_NPROC counts."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                text = f.read()
        except OSError:
            continue
        uid_line = threads = None
        for line in text.splitlines():
            if line.startswith("Uid:"):
                uid_line = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        if uid_line == uid and threads:
            total += threads
    return total


def prepare_workdir(workdir: str, lease: _Lease | None) -> None:
    """Create `workdir` if needed and hand it (and its top-level entries) to the sandbox uid."""
    os.makedirs(workdir, exist_ok=True)
    if lease is None:
        return
    os.chown(workdir, lease.uid, lease.gid)
    os.chmod(workdir, 0o700)
    for entry in os.scandir(workdir):
        os.chown(entry.path, lease.uid, lease.gid, follow_symlinks=False)
    # The uid must be able to reach the dir: every ancestor needs o+x.
    parent = os.path.dirname(os.path.abspath(workdir))
    while parent and parent != "/":
        mode = os.stat(parent).st_mode
        if not mode & stat.S_IXOTH:
            raise PermissionError(f"sandbox uid {lease.uid} cannot reach {workdir}: {parent} lacks o+x "
                                  "(use a work root like /tmp)")
        parent = os.path.dirname(parent)


def _our_python_names() -> set[str]:
    v = sys.version_info
    return {sys.executable, os.path.realpath(sys.executable), "python", "python3", f"python{v.major}.{v.minor}"}


def map_in(arg: str, view: RuntimeView) -> str:
    """Rewrite real paths that the sandbox uid cannot read (anywhere inside one argument, e.g. -I<path>)."""
    for real, staged in view.path_map:
        if real in arg:
            arg = arg.replace(real, staged)
    return arg
