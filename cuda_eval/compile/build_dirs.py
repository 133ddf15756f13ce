"""The directories of one build: `src/` (ours, read-only for the build's sandbox uid), `out/` (the sandbox uid's: the
compilers' cwd), `product/` (ours: what the build produced, copied out of `out/` through a checked descriptor).
Nothing of ours ever writes into `out/` or follows a link there.
"""
from __future__ import annotations

import dataclasses
import os
import stat

from cuda_eval.compile.cache import copy_untrusted
from cuda_eval.sandbox import runner as sb


def write_private(directory: str, name: str, text: str) -> str:
    """Write `text` to directory/name, a directory of ours that no one else can write to; never through a link.
    Returns the path."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"bad file name {name!r}")
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o644)
        f.write(text)
    return path


def write_private_tree(directory: str, files: dict[str, str]) -> None:
    """write_private for {relative path: text}, the sub-directories made as ours (0755)."""
    if not os.path.isdir(directory) or os.path.islink(directory):
        _make_private_dir(directory)
    for rel, text in files.items():
        parts = rel.split("/")
        d = directory
        for part in parts[:-1]:
            if not part or part in (".", ".."):
                raise ValueError(f"bad file name {rel!r}")
            d = os.path.join(d, part)
            if not os.path.isdir(d) or os.path.islink(d):
                _make_private_dir(d)
        write_private(d, parts[-1], text)


def _make_private_dir(path: str) -> str:
    os.mkdir(path, 0o755)
    os.chmod(path, 0o755)  # readable by the sandbox uid, writable by us alone (whatever the umask)
    return path


@dataclasses.dataclass
class BuildDirs:
    """The directories of one build (see the module doc): src (ours, read-only for the sandbox), out (the sandbox
    uid's: the compilers' cwd), product (ours: outputs copied out of `out`). `owner`: the uid whose files `out`
    may hold, set once the sandbox session exists."""
    root: str
    src: str
    out: str
    product: str
    owner: int = -1

    @classmethod
    def create(cls, root: str) -> BuildDirs:
        """Fresh sub-dirs of `root` (a new directory of ours, or one we create)."""
        os.makedirs(root, exist_ok=True)
        st = os.lstat(root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(f"build dir {root} is not a directory of ours")
        os.chmod(root, 0o755)
        return cls(root, _make_private_dir(os.path.join(root, "src")), os.path.join(root, "out"),
                   _make_private_dir(os.path.join(root, "product")))

    def confine(self, session: sb.SandboxSession) -> None:
        """Set `owner`, and make `src` readable by this build's sandbox uid alone (its group): other candidates'
        processes see the compilers' command lines in /proc, which name files in it."""
        self.owner = session.uid if session.uid is not None else os.geteuid()
        if session.uid is not None:
            os.chown(self.src, os.geteuid(), session.uid)
            os.chmod(self.src, 0o750)

    def take(self, name: str, max_bytes: int | None) -> str:
        """Copy out/<name>, written by the sandbox uid, to product/<name> (checked: a regular file with one link,
        owned by that uid, at most max_bytes); returns the copy. Raises UnsafeFile or OSError."""
        dst = os.path.join(self.product, name)
        if os.path.lexists(dst):
            os.unlink(dst)
        return copy_untrusted(self.out, name, dst, owner=self.owner, max_bytes=max_bytes or MAX_PRODUCT_BYTES)


MAX_PRODUCT_BYTES = 4 << 30  # the largest product or object copied out of a build
