"""What a sandbox uid can read, and the staged runtime used when it cannot read ours (cuda_eval.sandbox.runtime)."""
import json
import os
import stat
import subprocess
import sys

import pytest

from cuda_eval.sandbox import identity as sandbox_identity, runner as sb, runtime as rt
from cuda_eval.sandbox.runtime import RuntimeView, runtime_view, why_unreadable, world_readable
from sandbox_fixtures import sandbox_tmp  # noqa: F401 - fixture


def test_world_readable(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    f = open_dir / "f.txt"
    f.write_text("x")
    os.chmod(tmp_path, 0o711)
    os.chmod(open_dir, 0o755)
    os.chmod(f, 0o644)
    parents_ok = all(os.stat(p).st_mode & 0o001 for p in list(tmp_path.parents)[:-1])
    assert world_readable(str(f)) == parents_ok
    os.chmod(f, 0o600)
    assert not world_readable(str(f))
    os.chmod(f, 0o644)
    os.chmod(open_dir, 0o700)
    assert not world_readable(str(f))
    assert not world_readable(str(tmp_path / "missing"))


def test_map_path_longest_prefix_first():
    view = RuntimeView(python="/staged/python", path_map=(("/root/py/lib/python3", "/s/lib"), ("/root/py", "/s")))
    assert view.map_path("/root/py/lib/python3/os.py") == "/s/lib/os.py"
    assert view.map_path("/root/py/include") == "/s/include"
    assert view.map_path("/root/python") == "/root/python"  # a prefix match must end at a path boundary


def test_the_view_runs_for_the_sandbox_uid(sandbox_tmp):
    view = runtime_view()
    assert world_readable(view.python) or os.geteuid() != 0
    if sandbox_identity.identity_mode() == "dedicated":
        env = dict(view.env)
        out = subprocess.run([view.python, "-c", "import cuda_eval, torch; print('ok')"], capture_output=True,
                             text=True, env={**os.environ, **env}, timeout=120)
        assert out.stdout.strip() == "ok", out.stderr[-500:]
    # ... and as the sandbox uid itself, from where the view says (the staged copies when something was staged)
    code = ("import json, os, sys, cuda_eval, cuda_eval._native, torch\n"
            "print(json.dumps([os.getuid(), cuda_eval.__file__, cuda_eval._native.__file__, torch.__file__]))")
    res = sb.run_sandboxed([sys.executable, "-c", code], str(sandbox_tmp / "w"),
                           sb.SandboxLimits(wall_timeout_s=300, address_space_bytes=None))
    assert res["exit_code"] == 0, res["stderr"][-2000:]
    uid, pkg, native, torch_init = json.loads(res["stdout"])
    assert native.endswith(".so")
    assert os.path.dirname(pkg) == view.map_path(rt.PACKAGE_DIR)
    if res["uid"] is not None:
        assert uid == res["uid"] and all(world_readable(p) for p in (pkg, native, torch_init))


def test_why_unreadable_names_the_blocking_component(sandbox_tmp):
    d = sandbox_tmp / "private"
    d.mkdir()
    (d / "f").write_text("x")
    os.chmod(d, 0o700)
    assert why_unreadable(str(d / "f")) == f"{d} (mode 0700) lacks o+x"
    os.chmod(d, 0o755)
    os.chmod(d / "f", 0o640)
    assert why_unreadable(str(d / "f")) == f"{d / 'f'} (mode 0640) lacks o+r"
    os.chmod(d / "f", 0o644)
    assert why_unreadable(str(d / "f")) is None


def _tree(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = os.lstat(p)
    return out


def test_link_tree_links_only_what_is_safe_and_changes_no_mode(sandbox_tmp, monkeypatch):
    """Readable files are hard-linked (fast: torch is thousands of files); private, world-writable and setuid files
    are copied (a link would expose or let a sandbox write the original); no original changes mode."""
    monkeypatch.setattr(rt, "RUNTIME_DIR", str(sandbox_tmp / "runtime"))
    src = sandbox_tmp / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    files = {"pkg/open.py": 0o644, "pkg/sub/tool": 0o755, "pkg/secret.py": 0o600, "pkg/shared.txt": 0o666,
             "pkg/suid": 0o4755}
    for rel, mode in files.items():
        (src / rel).write_text(rel)
        os.chmod(src / rel, mode)
    os.symlink(str(src / "pkg" / "open.py"), src / "pkg" / "abs_link")
    os.symlink("open.py", src / "pkg" / "rel_link")
    before = {k: (v.st_mode, v.st_ino) for k, v in _tree(src).items()}
    final = str(sandbox_tmp / "runtime" / "tree")
    rt._publish(final, lambda tmp: rt._link_tree(str(src), tmp, relink=((str(src), final),)))
    assert {k: (v.st_mode, v.st_ino) for k, v in _tree(src).items()} == before
    dst = _tree(final)
    same_fs = os.stat(src).st_dev == os.stat(final).st_dev
    for rel, mode in files.items():
        linked = dst[rel].st_ino == before[rel][1]
        assert linked == (same_fs and rel in ("pkg/open.py", "pkg/sub/tool")), rel
        assert stat.S_IMODE(dst[rel].st_mode) in (0o644, 0o755) and (src / rel).read_text() == rel
        assert open(os.path.join(final, rel)).read() == rel
    assert stat.S_IMODE(dst["pkg/suid"].st_mode) == 0o755
    assert os.readlink(os.path.join(final, "pkg/abs_link")) == os.path.join(final, "pkg", "open.py")
    assert os.readlink(os.path.join(final, "pkg/rel_link")) == "open.py"
    assert all(stat.S_IMODE(v.st_mode) == 0o755 for v in dst.values() if stat.S_ISDIR(v.st_mode))


def test_stamps_follow_content_not_bytecode(sandbox_tmp):
    root = sandbox_tmp / "site"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text("a = 1\n")
    key = rt._tree_key(str(root))
    (root / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    assert rt._tree_key(str(root)) == key
    (root / "pkg" / "m.py").unlink()
    (root / "pkg" / "m.py").write_text("a = 1\n")  # reinstalled: a new file
    assert rt._tree_key(str(root)) != key


def test_a_runtime_dir_someone_else_owns_is_refused(sandbox_tmp, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a dir owned by another uid")
    foreign = sandbox_tmp / "foreign"
    foreign.mkdir()
    os.chown(foreign, 60999, 60999)
    monkeypatch.setattr(rt, "RUNTIME_DIR", str(foreign))
    with pytest.raises(OSError, match="refusing to stage code in .* owned by uid 60999"):
        rt._publish(str(foreign / "x"), lambda tmp: None)


def test_old_stagings_are_collected_unless_a_process_uses_them(sandbox_tmp, monkeypatch):
    root = sandbox_tmp / "runtime"
    monkeypatch.setattr(rt, "RUNTIME_DIR", str(root))
    rt._publish(str(root / "kind-a"), lambda tmp: None)  # held by this process from now on
    dead = root / "kind-b"  # staged by a process that has exited: nobody holds it
    rt._publish(str(dead), lambda tmp: None)
    for fd in rt._held[-1:]:
        os.close(fd)
    del rt._held[-1:]
    (root / ".staging-crashed").mkdir()
    (root / "kind-old").mkdir()  # not marked: made by older code, left alone
    (root / "other-x").mkdir()
    rt._mark_in_use(str(root / "other-x"))
    rt._publish(str(root / "kind-c"), lambda tmp: None)
    assert sorted(os.listdir(root)) == [".lock", "kind-a", "kind-c", "kind-old", "other-x"]
    assert stat.S_IMODE(os.stat(root / ".lock").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(root / "kind-a" / ".in_use").st_mode) == 0o600
