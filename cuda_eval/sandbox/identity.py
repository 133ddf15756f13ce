"""Who a sandboxed process runs as (root: a leased uid, "dedicated"; not root: user namespaces, "namespaces"; or
our own uid, "same", inside a sandbox or when opted in), the refusals when none is safe, and `isolation()`: what a
sandboxed process gets here, for logs and docs."""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from cuda_eval.sandbox import cgroups
from cuda_eval.sandbox import runtime as sandbox_runtime
from cuda_eval.sandbox.config import IDENTITY, INSIDE_SANDBOX_ENV, OOM_SCORE_ADJ, SandboxUnavailable, _MODES
from cuda_eval.sandbox.leases import _Lease, _account_of, _lease_uid
from cuda_eval.sandbox.probes import _probe_namespace, _probe_netns, _probe_uid
from cuda_eval.sandbox.quota import DEFAULT_DISK_BYTES
from cuda_eval.sandbox.runtime import runtime_view, why_unreadable
from cuda_eval.sandbox.sweeps import world_writable_dirs

log = logging.getLogger(__name__)
_lock = threading.Lock()


_lock = threading.Lock()


def _unavailable(why: str) -> SandboxUnavailable:
    """The error for a root evaluator whose dedicated sandbox uid cannot be used: what is wrong, how to fix it."""
    import importlib.util
    paths = [os.path.realpath(sys.executable), sys.prefix, sandbox_runtime.PACKAGE_DIR]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        paths.append(os.path.dirname(spec.origin))
    unreadable = [w for w in dict.fromkeys(why_unreadable(p) for p in paths) if w]
    return SandboxUnavailable(
        f"refusing to run sandboxed candidates: we are root and a dedicated sandbox uid cannot be used: {why}. "
        + (f"Not readable by other users (so staged into {sandbox_runtime.RUNTIME_DIR}): {'; '.join(unreadable)}. "
           if unreadable else "")
        + "Fix one of: set CUDA_EVAL_SANDBOX_RUNTIME_DIR to a directory every user can reach (o+x on each "
        "ancestor) on a filesystem mounted without noexec, where we can write; or make the paths above readable "
        "by other users (chmod o+rx on the directories named); or run the evaluator as an unprivileged user "
        "(weaker isolation). Candidates are never run as root.")


# What a candidate can do when it runs as our own uid with no namespace (docs/EVALUATOR.md, "Sandbox").
UNSANDBOXED_LOSSES = ("it can read, change and delete every file our uid can (checkpoints, keys, the caches)",
                      "it can signal, ptrace and read the memory of our processes (the trainer included)",
                      "it can reach the network",
                      "processes it detaches from its group outlive it, and its temp files are not swept")


def _unprivileged_mode() -> str:
    """"namespaces" or "same" for a process that is not root, following IDENTITY; SandboxUnavailable where neither
    is allowed."""
    mode = IDENTITY.mode
    if mode not in _MODES:
        raise ValueError(f"CUDA_EVAL_SANDBOX_IDENTITY must be one of {'|'.join(_MODES)}, got {mode!r}")
    if _inside_sandbox():
        return "same"  # the outer sandbox (a leased uid or namespaces of its own) confines what this one starts
    if mode == "dedicated":
        raise SandboxUnavailable("CUDA_EVAL_SANDBOX_IDENTITY=dedicated needs root (to switch to the sandbox uids); "
                                 "unset it to isolate candidates with user namespaces instead")
    if mode == "same":
        _note_unsandboxed("CUDA_EVAL_SANDBOX_IDENTITY=same")
        return "same"
    why = _probe_namespace("user", None)
    if why is None:
        return "namespaces"
    if mode == "namespaces":
        raise SandboxUnavailable(f"user namespaces cannot be used here: {why}")
    if IDENTITY.allow_unsandboxed:
        _note_unsandboxed(f"allow_unsandboxed (user namespaces do not work here: {why})")
        return "same"
    raise SandboxUnavailable(
        f"refusing to run candidates: we are not root and this kernel does not give an unprivileged process user "
        f"namespaces ({why}). Unsandboxed, a candidate runs as our own uid: " + "; ".join(UNSANDBOXED_LOSSES)
        + ". Fix one of: allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
        "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04+); run the evaluator as root (dedicated "
        "sandbox uids); or accept the risk with EvalConfig(allow_unsandboxed=True) (CUDA_EVAL_ALLOW_UNSANDBOXED=1)")


def _inside_sandbox() -> bool:
    """True in a process started by a sandbox: the marker in its environment, and a uid that only a sandbox gives
    (one without an account: the leased uids have none) or a user namespace (the non-root sandbox's). A user who
    exported the marker by mistake still gets a sandbox."""
    if os.environ.get(INSIDE_SANDBOX_ENV) != "1":
        return False
    try:
        with open("/proc/self/uid_map") as f:
            if f.read().split() != ["0", "0", "4294967295"]:
                return True
    except OSError:
        pass
    return _account_of(os.getuid()) is None


_unsandboxed_noted: list[bool] = []


def _note_unsandboxed(reason: str) -> None:
    with _lock:
        if _unsandboxed_noted:
            return
        _unsandboxed_noted.append(True)
    log.warning("candidates run UNSANDBOXED as uid %d (%s): %s", os.getuid(), reason, "; ".join(UNSANDBOXED_LOSSES))


def _acquire_identity() -> _Lease | None:
    """A dedicated uid lease as root, None otherwise (then _unprivileged_mode() says how), following IDENTITY."""
    mode = IDENTITY.mode
    if mode not in _MODES:
        raise ValueError(f"CUDA_EVAL_SANDBOX_IDENTITY must be one of {'|'.join(_MODES)}, got {mode!r}")
    if os.geteuid() != 0:
        return None
    if mode in ("same", "namespaces"):
        raise SandboxUnavailable(f"CUDA_EVAL_SANDBOX_IDENTITY={mode} is refused as root: candidates would run as "
                                 "root. Unset it (dedicated sandbox uids) or run the evaluator as an unprivileged "
                                 "user")
    lease = _lease_uid()
    try:
        lease.view = runtime_view()
        why = _probe_uid(lease.uid, lease.view)
    except (OSError, RuntimeError) as e:
        why = f"the runtime could not be staged for it: {e}"
    except BaseException:
        lease.release()
        raise
    if why is None:
        return lease
    lease.release()
    raise _unavailable(why)


def identity_mode() -> str:
    """"dedicated" (leased uids, as root), "namespaces" (not root: user namespaces) or "same" (not root, our own uid:
    only inside a sandbox or when opted in). Raises SandboxUnavailable when candidates cannot be run safely and
    nobody opted in (nothing would run)."""
    lease = _acquire_identity()
    if lease is None:
        return _unprivileged_mode()
    lease.release()
    return "dedicated"


def isolation() -> dict[str, Any]:
    """What sandboxed processes get here, for logs and docs: identity ("dedicated" | "namespaces" | "same"), uid
    range, network ("isolated": an empty namespace | "shared": the host's) and why, ipc ("isolated" | "swept": no
    namespace, message queues refused and SysV IPC swept | "shared"), pid and filesystem isolation, the memory
    cgroup (None and why where there is none), oom_score_adj, what was staged for the uid, the swept world-writable
    dirs, the default disk quota and `lost`: what a candidate can do here that the full sandbox prevents. Raises
    SandboxUnavailable like identity_mode()."""
    lease = _acquire_identity()
    try:
        mode = "dedicated" if lease is not None else _unprivileged_mode()
        if mode == "dedicated":
            net_why = _probe_netns(lease.uid)
            ipc_why = _probe_namespace("ipc", lease.uid)
        elif mode == "namespaces":
            net_why = ipc_why = None
        else:
            net_why = ipc_why = "our own uid, no namespaces"
        cfg = IDENTITY
        lost = []
        if mode == "same":
            lost += list(UNSANDBOXED_LOSSES)
        elif net_why:
            lost.append("it can reach the network")
        if mode == "namespaces":
            lost.append("it can read (not write) every file our uid can")
        cg_why = cgroups.available()
        return {"identity": mode,
                "uid_range": None if lease is None else [cfg.uid_base, cfg.uid_base + cfg.slots - 1],
                "network": "shared" if net_why else "isolated", "network_note": net_why,
                "ipc": "isolated" if not ipc_why else ("swept" if mode == "dedicated" else "shared"),
                "ipc_note": ipc_why,
                "pid": "isolated" if mode == "namespaces" else ("uid" if mode == "dedicated" else "shared"),
                "filesystem": {"dedicated": "writes only to its work dir and the swept temp dirs",
                               "namespaces": "read-only except its work dir",
                               "same": "everything our uid can"}[mode],
                "memory_cgroup": cgroups.describe(), "memory_cgroup_note": cg_why,
                "oom_score_adj": OOM_SCORE_ADJ,
                "staged": [] if lease is None else list(lease.view.staged),
                "world_writable_dirs": list(world_writable_dirs()),
                "disk_quota_bytes": DEFAULT_DISK_BYTES,
                "lost": lost}
    finally:
        if lease is not None:
            lease.release()
