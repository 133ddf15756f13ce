"""A memory cgroup per sandboxed process group, where the machine offers one.

Rlimits bound one process' address space or data segment; a memory cgroup bounds what the whole group holds in RAM,
page cache and tmpfs included, and the kernel reclaims or OOM-kills inside the group before it touches the rest of
the host (sandboxed processes also get oom_score_adj 1000 from the native runner: if the host runs out anyway, they
go first, not the trainer). Where the cgroups go:
- cgroup v2: next to our own cgroup, under the same parent, so that the parent's limits (a batch job's, a
  container's) still bound them. Needs write access to that parent and the memory controller enabled there (it is
  whenever our own cgroup has it). Not possible where our cgroup is the root of the mount (a container with a
  cgroup namespace: v2 forbids children of a cgroup with processes in it); then there is none.
- cgroup v1 (hosts that still mount the memory hierarchy): a child of our own memory cgroup.
Found and tried once per process; where there is none (not root, no memory controller, a container) that is logged
once and `available()` says why. Each cgroup is named cuda_eval-<our pid>-<n>; those of dead evaluators are removed
when found empty.
"""
from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import threading
import time

log = logging.getLogger(__name__)
PREFIX = "cuda_eval-"


@dataclasses.dataclass(frozen=True)
class _Place:
    version: int   # 1 or 2
    parent: str    # where our cgroups are created


@dataclasses.dataclass
class Cgroup:
    """One process group's cgroup: `procs` is the file a process writes "0" into to join it."""
    path: str
    version: int

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def memory_max(self) -> int | None:
        """The limit in force (None: none)."""
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        with open(os.path.join(self.path, name)) as f:
            text = f.read().strip()
        return None if text == "max" or int(text) >= 1 << 62 else int(text)

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Remove it once its processes are gone (they are killed by then, but may still be exiting). v2 kills
        whatever is left (cgroup.kill). True if removed."""
        deadline = time.monotonic() + timeout_s
        killed = False
        while True:
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.warning("cannot remove cgroup %s: %s", self.path, e)
                    return False
            if not killed and self.version == 2 and os.path.exists(os.path.join(self.path, "cgroup.kill")):
                _write(os.path.join(self.path, "cgroup.kill"), "1")
                killed = True
            time.sleep(0.01)


_lock = threading.Lock()
_state: list = []   # [(_Place | None, why not | None)], once per process
_counter = itertools.count()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root within the filesystem, fstype, super options) of our mount namespace."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                a, b = left.split(), right.split()
                if len(a) >= 5 and len(b) >= 3:
                    out.append((a[4], a[3], b[0], b[2]))
    except OSError:
        pass
    return out


def _own() -> dict[str, str]:
    """Our cgroup paths: {"v2": path} and/or {"memory": path} (v1)."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    out["v2"] = path
                elif "memory" in controllers.split(","):
                    out["memory"] = path
    except (OSError, ValueError):
        pass
    return out


def _join(mount_point: str, mount_root: str, path: str) -> str | None:
    """Where our cgroup `path` appears under a mount of the hierarchy rooted at `mount_root` (None: not visible)."""
    if mount_root != "/":
        if path != mount_root and not path.startswith(mount_root.rstrip("/") + "/"):
            return None
        path = path[len(mount_root):] or "/"
    return os.path.normpath(mount_point + "/" + path.lstrip("/"))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _locate() -> tuple[_Place | None, str]:
    own, mounts = _own(), _mounts()
    notes = []
    v2 = next((m for m in mounts if m[2] == "cgroup2"), None)
    if v2 is not None and "v2" in own:
        here = _join(v2[0], v2[1], own["v2"])
        if here is None or not os.path.isdir(here):
            notes.append(f"our cgroup v2 {own['v2']} is not visible under {v2[0]}")
        elif "memory" not in _read(os.path.join(here, "cgroup.controllers")).split():
            notes.append(f"cgroup v2 at {v2[0]}: the memory controller is not enabled for our cgroup {own['v2']}")
        elif not os.path.exists(os.path.join(here, "memory.max")):   # the root cgroup: children are allowed
            if "memory" in _read(os.path.join(here, "cgroup.subtree_control")).split():
                return _Place(2, here), ""
            try:
                _write(os.path.join(here, "cgroup.subtree_control"), "+memory")
                return _Place(2, here), ""
            except OSError as e:
                notes.append(f"cannot enable the memory controller in {here}: {e.strerror}")
        elif here == os.path.normpath(v2[0]):
            notes.append(f"our cgroup is the root of the cgroup v2 mount {v2[0]} (a container's cgroup namespace): "
                         "no room for cgroups next to it")
        elif not os.access(os.path.dirname(here), os.W_OK):
            notes.append(f"no write access to {os.path.dirname(here)} (the parent of our cgroup v2)")
        else:
            return _Place(2, os.path.dirname(here)), ""
    v1 = next((m for m in mounts if m[2] == "cgroup" and "memory" in m[3].split(",")), None)
    if v1 is not None and "memory" in own:
        here = _join(v1[0], v1[1], own["memory"])
        if here is None or not os.path.isdir(here):
            notes.append(f"our v1 memory cgroup {own['memory']} is not visible under {v1[0]}")
        elif not os.access(here, os.W_OK):
            notes.append(f"no write access to our v1 memory cgroup {here}")
        else:
            return _Place(1, here), ""
    if not notes:
        notes.append("no cgroup v2 or v1 memory hierarchy is mounted")
    return None, "; ".join(notes)


def _remove_stale(place: _Place) -> None:
    """Empty cgroups left by evaluators that died: named by their pid."""
    try:
        names = [e.name for e in os.scandir(place.parent) if e.name.startswith(PREFIX) and e.is_dir()]
    except OSError:
        return
    for name in names:
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(place.parent, name))
            except OSError:
                pass


def _make(place: _Place, memory_bytes: int | None) -> Cgroup:
    path = os.path.join(place.parent, f"{PREFIX}{os.getpid()}-{next(_counter)}")
    os.mkdir(path)
    cg = Cgroup(path, place.version)
    try:
        if place.version == 2:
            _write(os.path.join(path, "memory.max"), "max" if memory_bytes is None else str(memory_bytes))
            # Over memory.max it must be reclaimed or killed, not pushed to swap (that would slow the host)...
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):  # ...and killed as a group
                if os.path.exists(os.path.join(path, name)):
                    _write(os.path.join(path, name), value)
        elif memory_bytes is not None:
            _write(os.path.join(path, "memory.limit_in_bytes"), str(memory_bytes))
            if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                try:
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                except OSError:  # swap accounting off
                    pass
    except BaseException:
        cg.remove(0.0)
        raise
    return cg


def _probe(place: _Place) -> str:
    """"" if a process can join a cgroup made there, else why not."""
    from cuda_eval import _native
    try:
        cg = _make(place, 1 << 30)
    except OSError as e:
        return f"cannot create a cgroup in {place.parent}: {e}"
    try:
        res = _native.run(["true"], env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout_s=30, limits={},
                          output_cap_bytes=4096, cgroup_procs=cg.procs)
        return "" if res["exit_code"] == 0 else f"`true` in a cgroup of {place.parent} exited {res['exit_code']}"
    except RuntimeError as e:
        return f"a process cannot join a cgroup of {place.parent}: {e}"
    finally:
        cg.remove()


def _place() -> _Place | None:
    with _lock:
        if not _state:
            place, why = _locate()
            if place is not None:
                _remove_stale(place)
                why = _probe(place)
                if why:
                    place = None
            if place is None:
                log.warning("sandboxed processes get no memory cgroup (their rlimits and oom_score_adj 1000 still "
                            "apply): %s", why)
            _state.append((place, why or None))
        return _state[0][0]


def available() -> str | None:
    """None if sandboxed process groups get memory cgroups here, else why not."""
    _place()
    return _state[0][1]


def describe() -> str | None:
    """e.g. "v2 under /sys/fs/cgroup/user.slice" (None: none)."""
    place = _place()
    return None if place is None else f"v{place.version} under {place.parent}"


def create(memory_bytes: int | None) -> Cgroup | None:
    """A fresh cgroup limited to `memory_bytes` (None: no limit, accounting only), or None where there are none.
    Never raises for a machine without them; a failure to create one is logged and gives None."""
    place = _place()
    if place is None:
        return None
    try:
        return _make(place, memory_bytes)
    except OSError as e:
        log.warning("cannot create a memory cgroup in %s: %s", place.parent, e)
        return None
