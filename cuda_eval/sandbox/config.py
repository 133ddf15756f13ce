"""How this process sandboxes candidates: the identity settings (`IdentityConfig`, process-wide; `configure()`,
called by the Evaluator with its EvalConfig), the range of dedicated uids, the constants every sandboxed process
gets, and the error raised when nothing can run safely."""
from __future__ import annotations

import dataclasses
import os


class SandboxUnavailable(RuntimeError):
    """Sandboxed processes cannot be started safely here (we are root and no dedicated sandbox uid can be used, or
    running candidates as root was asked for). The message says what is wrong and how to fix it."""


DEFAULT_UID_RANGE = (60000, 60999)
OOM_SCORE_ADJ = 1000          # sandboxed processes are the OOM killer's first pick, never the trainer
SHM_BYTES = 1 << 30           # the private /dev/shm of a process isolated by namespaces (tmpfs: host RAM)


# Set in every sandboxed process' environment: sandboxes started from inside one (a worker's run-time build) run as
# that process' own identity, confined by the outer sandbox.
INSIDE_SANDBOX_ENV = "CUDA_EVAL_INSIDE_SANDBOX"


@dataclasses.dataclass
class IdentityConfig:
    """How sandboxed processes are isolated (process-wide; `configure()` sets it, the Evaluator from EvalConfig).
    `mode`: "auto" (root: "dedicated"; otherwise "namespaces" where the kernel allows it, else refuse unless
    allow_unsandboxed), "dedicated" (a leased uid; needs root), "namespaces" (user, mount, PID, network and IPC
    namespaces; no root needed), "same" (our own uid, no isolation: an explicit opt-in; refused as root).
    uid_base/slots: the range of dedicated uids. allow_unsandboxed: without root and without namespaces, run
    candidates as our own uid (with a warning) instead of refusing."""
    mode: str = os.environ.get("CUDA_EVAL_SANDBOX_IDENTITY", "auto")
    uid_base: int = DEFAULT_UID_RANGE[0]
    slots: int = DEFAULT_UID_RANGE[1] - DEFAULT_UID_RANGE[0] + 1
    allow_unsandboxed: bool = os.environ.get("CUDA_EVAL_ALLOW_UNSANDBOXED", "") == "1"


IDENTITY = IdentityConfig()


def parse_uid_range(text: str) -> tuple[int, int]:
    """"60000-60999" -> (60000, 60999): the inclusive range of dedicated sandbox uids. ValueError if malformed."""
    first, sep, last = str(text).strip().partition("-")
    try:
        lo, hi = int(first), int(last)
    except ValueError:
        raise ValueError(f"sandbox uid range {text!r}: expected FIRST-LAST, e.g. 60000-60999") from None
    if not sep or lo < 1 or hi < lo or hi >= (1 << 31) - 1:
        raise ValueError(f"sandbox uid range {text!r}: expected FIRST-LAST with 1 <= FIRST <= LAST < 2**31-1")
    if hi - lo >= 1 << 20:
        raise ValueError(f"sandbox uid range {text!r}: at most {1 << 20} uids")
    if lo <= 65534 <= hi or lo <= 65535 <= hi:
        raise ValueError(f"sandbox uid range {text!r} contains 65534/65535 (nobody, the 16-bit -1)")
    return lo, hi


def configure(*, uid_range: str | tuple[int, int] | None = None, allow_unsandboxed: bool | None = None,
              mode: str | None = None) -> None:
    """Set how this process sandboxes candidates (see IdentityConfig). Called by the Evaluator with its config;
    validated here."""
    if uid_range is not None:
        lo, hi = parse_uid_range(uid_range if isinstance(uid_range, str) else f"{uid_range[0]}-{uid_range[1]}")
        IDENTITY.uid_base, IDENTITY.slots = lo, hi - lo + 1
    if allow_unsandboxed is not None:
        IDENTITY.allow_unsandboxed = bool(allow_unsandboxed)
    if mode is not None:
        if mode not in _MODES:
            raise ValueError(f"sandbox identity mode must be one of {_MODES}, got {mode!r}")
        IDENTITY.mode = mode


_MODES = ("auto", "dedicated", "namespaces", "same")
