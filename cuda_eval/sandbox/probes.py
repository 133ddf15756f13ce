"""Probes, once per process: can a sandbox uid run the (staged) interpreter and import this package and torch from
where we expect, and which namespaces (network, IPC, the unprivileged user set) can a sandboxed process get."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from typing import Any

from cuda_eval import _native
from cuda_eval.sandbox import runtime as sandbox_runtime
from cuda_eval.sandbox.environment import DEFAULT_ENV_ALLOW, _base_env
from cuda_eval.sandbox.runtime import RuntimeView

log = logging.getLogger(__name__)
_lock = threading.Lock()


_probe_result: list = []  # [None (ok) or why not], once per process: all slot uids see the same permissions
_ns_results: dict[str, str | None] = {}  # "net" / "ipc" / "user": None (works) or why not, once per process


_PROBE = """\
import importlib.util, os, sys
bad = []
for arg in sys.argv[1:]:
    name, _, expected = arg.partition('=')
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not os.access(spec.origin, os.R_OK):
        bad.append(name + ' is not importable')
        continue
    where = os.path.realpath(os.path.dirname(spec.origin))
    if where != os.path.realpath(expected):
        bad.append(f'{name} resolves to {where}, not {expected}')
    elif name == 'torch':
        lib = os.path.join(where, 'lib')
        if os.path.isdir(lib) and not all(os.access(os.path.join(lib, f), os.R_OK) for f in os.listdir(lib)):
            bad.append('torch/lib is not readable')
import cuda_eval._native
sys.stdout.write('; '.join(bad))
"""


def _expected_modules(view: RuntimeView) -> list[str]:
    """name=directory the sandbox must import it from: this package (or its staged copy) and torch if we have it."""
    import importlib.util
    out = [f"cuda_eval={view.map_path(sandbox_runtime.PACKAGE_DIR)}"]
    spec = importlib.util.find_spec("torch")  # finds, does not import
    if spec is not None and spec.origin:
        out.append(f"torch={view.map_path(os.path.dirname(spec.origin))}")
    return out


def _probe_uid(uid: int, view: RuntimeView) -> str | None:
    """None if `uid` can run the (staged) interpreter and import this package (with its native module) and torch
    from where we expect; else why not."""
    with _lock:
        if _probe_result:
            return _probe_result[0]
    env = _base_env("/", DEFAULT_ENV_ALLOW, {}, view)
    try:
        res = _native.run([view.python, "-c", _PROBE, *_expected_modules(view)], env=env, cwd="/", timeout_s=120,
                          limits={}, output_cap_bytes=1 << 16, uid=uid, gid=uid)
        if res["exit_code"] != 0:
            why = f"{view.python} failed as uid {uid}: " + res["stderr"].decode(errors="replace").strip()[-600:]
        elif res["stdout"].strip():
            why = f"as uid {uid}: {res['stdout'].decode(errors='replace')}"
        else:
            why = None
    except RuntimeError as e:
        why = f"cannot run {view.python} as uid {uid}: {e}"
    with _lock:
        _probe_result[:] = [why]
    return why


_NS_WHAT = {"net": "a network namespace", "ipc": "an IPC namespace",
            "user": "user, mount, PID, network and IPC namespaces"}


def _probe_namespace(kind: str, uid: int | None) -> str | None:
    """None if a sandboxed process can get `kind` namespaces ("net", "ipc": need CAP_SYS_ADMIN, run as `uid`;
    "user": the unprivileged set, as ourselves); else why not. Once per process."""
    with _lock:
        if kind in _ns_results:
            return _ns_results[kind]
    kwargs: dict[str, Any] = {"uid": uid, "gid": uid}
    scratch = None
    if kind == "net":
        kwargs["new_netns"] = True
    elif kind == "ipc":
        kwargs["new_ipcns"] = True
    else:
        scratch = tempfile.mkdtemp(prefix="cuda_eval_nsprobe_")
        kwargs = {"userns": True, "writable_dir": scratch}
    try:
        res = _native.run(["true"], env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout_s=30, limits={},
                          output_cap_bytes=4096, **kwargs)
        why = None if res["exit_code"] == 0 else f"`true` in {_NS_WHAT[kind]} exited with {res['exit_code']}"
    except RuntimeError as e:
        why = str(e)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    with _lock:
        first = kind not in _ns_results
        _ns_results[kind] = why
    if why and first and kind == "net":
        log.warning("sandboxed processes keep the host's network: a network namespace cannot be created (%s)", why)
    if why and first and kind == "ipc":
        log.warning("sandboxed processes share the host's IPC namespace: one cannot be created (%s); POSIX message "
                    "queues are then refused to them (RLIMIT_MSGQUEUE 0) and their SysV IPC swept", why)
    return why


def _probe_netns(uid: int) -> str | None:
    return _probe_namespace("net", uid)
