"""Directories that the evaluator (often root) writes into or trusts: the build cache, the compile work root, the
toolchain record, the reference-timing cache, the run dir, the sandbox uid leases and the staged runtime.

A sandboxed candidate may create any name in a world-writable directory (/tmp, /var/tmp) before an evaluator first
starts on the machine. Whatever it creates there must never be adopted: a cache dir of its own would let it plant a
toolchain record (its compiler template then runs in every build) or build products, a symbolic link would send
root's chmods and renames anywhere. So a directory is used only when its whole path is trusted:
- every directory on the way is owned by root or by us, and not writable by anyone else unless it is sticky (/tmp)
  and the next component is ours or root's (the sticky bit stops others renaming or deleting it);
- a symbolic link on the way is followed only if root or we own it (a link somebody else left in /tmp is refused);
- the directory itself is ours (or, for reading only, root's) and writable by its owner alone.
Missing components are created, ours, 0755 on the way and the requested mode at the end. Each component is opened
relative to the one before with O_NOFOLLOW, so a link swapped in between two checks is refused, never followed.
Refusals are `UnsafeDirectory` errors that say what is wrong and how to fix it.
"""
from __future__ import annotations

import errno
import os
import stat

_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup


class UnsafeDirectory(OSError):
    """A directory we were to write into or trust is not safe to use (see the module doc); the message says why and
    how to fix it."""

    def __init__(self, message: str):
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return self.strerror


class NotOurs(UnsafeDirectory):
    """The directory is trusted (root's) but not ours: readable, not ours to write (e.g. the cache dir of a root
    evaluator seen from one of its sandboxed processes)."""


def _trusted_owners() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def _describe_owner(uid: int) -> str:
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def fix_hint(knob: str = "") -> str:
    """How to fix a refused directory: remove it or give it to the uid we run as, or name another one (`knob`)."""
    owner = "root" if os.geteuid() == 0 else f"uid {os.geteuid()} (us)"
    return (f"Remove it or chown it to {owner} after checking what is inside"
            + (f", or set {knob} to another directory" if knob else ""))


def _refuse(what: str, path: str, why: str, fix: str) -> UnsafeDirectory:
    return UnsafeDirectory(f"refusing {what} {path}: {why}. {fix}")


def _open_trusted(path: str, *, create: bool, mode: int, what: str, fix: str) -> int:
    """An O_PATH descriptor of the directory `path` once the whole path passed the checks of the module doc (created
    if `create`). The caller closes it."""
    path = os.path.abspath(path)
    owners = _trusted_owners()
    me = os.geteuid()
    fix = fix or fix_hint()
    todo = [p for p in path.split("/") if p][::-1]
    levels: list[tuple[int, str, os.stat_result]] = []
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    levels.append((fd, "/", os.fstat(fd)))
    links = 0
    try:
        while todo:
            name = todo.pop()
            top_fd, top_path, top_st = levels[-1]
            if name == ".":
                continue
            if name == "..":
                if len(levels) > 1:
                    os.close(levels.pop()[0])
                continue
            here = os.path.join(top_path, name)
            last = not todo
            try:
                st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, mode if last else 0o755, dir_fd=top_fd)
                except FileExistsError:  # someone was faster: checked below like anything else
                    pass
                st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
                if st.st_uid == me:
                    _fchmod_at(top_fd, name, mode if last else 0o755)
                    st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in owners:
                    raise _refuse(what, path, f"{here} is a symbolic link owned by {_describe_owner(st.st_uid)} "
                                  "(a link there could send our writes anywhere)", fix)
                links += 1
                if links > _MAX_LINKS:
                    raise _refuse(what, path, "too many symbolic links", fix)
                target = os.readlink(name, dir_fd=top_fd)
                if target.startswith("/"):
                    while len(levels) > 1:
                        os.close(levels.pop()[0])
                todo.extend([p for p in target.split("/") if p][::-1])
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise _refuse(what, path, f"{here} is not a directory", fix)
            if st.st_uid not in owners:
                raise _refuse(what, path, f"{here} is owned by {_describe_owner(st.st_uid)}, not by root or us "
                              "(whoever owns it could have planted files there)", fix)
            writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if writable_by_others and (last or not st.st_mode & stat.S_ISVTX):
                raise _refuse(what, path, f"{here} (mode {stat.S_IMODE(st.st_mode):04o}) is writable by others "
                              "(anyone could have replaced what is inside); after checking its contents, "
                              f"`chmod go-w {here}`", fix)
            sub = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top_fd)
            got = os.fstat(sub)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):  # swapped between the two looks
                os.close(sub)
                raise _refuse(what, path, f"{here} changed while it was being checked", fix)
            levels.append((sub, here, got))
        fd, final, st = levels.pop()
        if create and st.st_uid != me:
            os.close(fd)
            raise NotOurs(f"refusing {what} {path}: {final} belongs to {_describe_owner(st.st_uid)}, not to us "
                          f"(uid {me}): we cannot write there. {fix}")
        if st.st_uid == me and mode is not None and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(f"/proc/self/fd/{fd}", mode)
        return fd
    finally:
        for level_fd, _, _ in levels:
            os.close(level_fd)


def _fchmod_at(dir_fd: int, name: str, mode: int) -> None:
    """chmod of a directory we just created, whatever the umask, never through a link."""
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def ensure_dir(path: str, mode: int, *, what: str = "directory", fix: str = "") -> str:
    """Create `path` (ours, `mode`) or accept it if it is safe (see the module doc; its mode is then set to `mode`).
    Returns the absolute path. UnsafeDirectory (NotOurs for a safe directory of root's when we are not root)
    otherwise; `what` names it and `fix` says how to fix it in the message."""
    os.close(_open_trusted(path, create=True, mode=mode, what=what, fix=fix))
    return os.path.abspath(path)


def check_dir(path: str, *, what: str = "directory", fix: str = "") -> str:
    """Accept an existing `path` for reading only if it is safe (ours or root's, see the module doc); nothing is
    created or changed. FileNotFoundError if it is missing, UnsafeDirectory if it is not safe."""
    os.close(_open_trusted(path, create=False, mode=None, what=what, fix=fix))
    return os.path.abspath(path)


def read_trusted_file(directory: str, name: str, *, max_bytes: int, what: str = "file", fix: str = "") -> bytes:
    """The bytes of `directory`/`name` if the directory is safe and the file is a regular file with one link, owned
    by root or us, writable by its owner alone and at most max_bytes. FileNotFoundError if either is missing;
    UnsafeDirectory otherwise."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"bad file name {name!r}")
    dfd = _open_trusted(directory, create=False, mode=None, what=f"the directory of {what}", fix=fix)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(what, os.path.join(directory, name), "it is a symbolic link", fix) from None
        raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        path = os.path.join(directory, name)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise _refuse(what, path, "not a regular file with a single link", fix)
        if st.st_uid not in _trusted_owners():
            raise _refuse(what, path, f"owned by {_describe_owner(st.st_uid)}, not by root or us", fix)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise _refuse(what, path, f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})", fix)
        if st.st_size > max_bytes:
            raise _refuse(what, path, f"{st.st_size} bytes (at most {max_bytes} expected)", fix)
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise _refuse(what, path, f"it grew beyond {max_bytes} bytes", fix)
        return data
    finally:
        os.close(fd)
