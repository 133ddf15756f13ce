"""Directories the evaluator writes into or trusts (cuda_eval/sandbox/safe_dirs.py): one that another uid created first,
or a symbolic link planted on the way, is refused with a message that says how to fix it, never adopted."""
import glob
import json
import os
import stat

import pytest

from cuda_eval.compile import toolchain as tc
from cuda_eval.compile.cache import BuildCache
from cuda_eval.orchestrator.ref_timing import ReferenceTimingCache
from cuda_eval.sandbox import safe_dirs
from sandbox_fixtures import run_lock, sandbox_tmp, shared_dir, toolchain  # noqa: F401 - fixtures

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another uid")
OTHER = 60999  # a sandbox uid: what a candidate's files belong to


def _record_of(shared_dir) -> tuple[str, dict]:
    """(file name, content) of the toolchain record the `toolchain` fixture wrote."""
    path = sorted(glob.glob(str(shared_dir / "cache" / "toolchain" / "*.json")))[0]
    with open(path) as f:
        return os.path.basename(path), json.load(f)


def _plant_record(directory, name: str, record: dict, canary) -> None:
    """A toolchain record whose g++ template runs a shell line in every build (what a candidate would plant)."""
    planted = json.loads(json.dumps(record))
    for template in planted["templates"].values():
        template["cflags"] = ["-wrapper", f"/bin/sh,-c,touch {canary}"] + template["cflags"]
    os.makedirs(directory / "toolchain", exist_ok=True)
    (directory / "toolchain" / name).write_text(json.dumps(planted))


def _chown_tree(root, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for n in [dirpath] + [os.path.join(dirpath, x) for x in filenames]:
            os.chown(n, uid, uid)


@needs_root
def test_a_cache_dir_another_uid_created_first_is_refused_never_adopted(toolchain, shared_dir, sandbox_tmp,
                                                                         monkeypatch):
    name, record = _record_of(shared_dir)
    canary = sandbox_tmp / "canary"
    cache = sandbox_tmp / "cache"
    _plant_record(cache, name, record, canary)
    _chown_tree(cache, OTHER)
    monkeypatch.setattr(tc, "_memo", {})  # read the record, not this process' memory of the real one
    with pytest.raises(safe_dirs.UnsafeDirectory, match=f"owned by uid {OTHER}.*chown it to root"):
        tc.detect("sm_90", cache_dir=str(cache))
    from sandbox_fixtures import make_pool
    with pytest.raises(safe_dirs.UnsafeDirectory, match="refusing the build cache dir"):
        make_pool(sandbox_tmp, cache_dir=str(cache))
    assert not (cache / "builds").exists() and not canary.exists()
    # The control: the same record in a directory of root's is what detect() adopts (so the test can fail).
    _chown_tree(cache, 0)
    adopted = tc.detect("sm_90", cache_dir=str(cache))
    assert "-wrapper" in adopted.flags("x", with_cuda=True)["cflags"]


@needs_root
def test_a_planted_record_file_is_refused_in_a_directory_of_ours(toolchain, shared_dir, sandbox_tmp, monkeypatch):
    """The directory is ours but the record file is not (or is a link): refused too."""
    name, record = _record_of(shared_dir)
    cache = sandbox_tmp / "cache"
    _plant_record(cache, name, record, sandbox_tmp / "canary")
    os.chown(cache / "toolchain" / name, OTHER, OTHER)
    monkeypatch.setattr(tc, "_memo", {})
    with pytest.raises(safe_dirs.UnsafeDirectory, match=f"toolchain record .* owned by uid {OTHER}"):
        tc.detect("sm_90", cache_dir=str(cache))
    os.unlink(cache / "toolchain" / name)
    os.symlink(sandbox_tmp / "elsewhere.json", cache / "toolchain" / name)
    with pytest.raises(safe_dirs.UnsafeDirectory, match="symbolic link"):
        tc.detect("sm_90", cache_dir=str(cache))


@needs_root
def test_a_symlink_planted_on_the_way_is_refused(sandbox_tmp):
    """In a world-writable sticky dir (like /tmp) another uid makes `cache` a link to a directory of its choice; a
    link of root's on the way is fine."""
    shared = sandbox_tmp / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    target = sandbox_tmp / "target"
    target.mkdir()
    (shared / "cache").symlink_to(target)
    os.lchown(shared / "cache", OTHER, OTHER)
    with pytest.raises(safe_dirs.UnsafeDirectory, match=f"is a symbolic link owned by uid {OTHER}"):
        safe_dirs.ensure_dir(str(shared / "cache" / "builds"), 0o755, what="the build cache")
    assert not (target / "builds").exists()
    (shared / "ours").symlink_to(target)  # root's link: followed
    assert safe_dirs.ensure_dir(str(shared / "ours" / "builds"), 0o755) == str(shared / "ours" / "builds")
    assert stat.S_IMODE(os.stat(target / "builds").st_mode) == 0o755


@needs_root
def test_a_linked_prefix_dir_is_never_chmodded_or_renamed_into(sandbox_tmp):
    """entries/<xx> swapped for a link to a directory elsewhere: the cache refuses it instead of making the target
    0711 and renaming its entry into it."""
    cache = BuildCache(str(sandbox_tmp / "c"), 1 << 20)
    victim = sandbox_tmp / "victim"
    victim.mkdir(mode=0o700)
    os.chmod(victim, 0o700)
    key = "ab" + "0" * 62
    link = sandbox_tmp / "c" / "entries" / "ab"
    link.symlink_to(victim)
    os.lchown(link, OTHER, OTHER)
    src = sandbox_tmp / "m.so"
    src.write_bytes(b"x")
    with pytest.raises(safe_dirs.UnsafeDirectory, match="symbolic link"):
        cache.publish(key, {"m.so": str(src)})
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o700 and os.listdir(victim) == []


@needs_root
@pytest.mark.parametrize("which", ["work_root", "run_dir", "ref_timing", "cache_subdir"])
def test_every_other_trusted_dir_owned_by_another_uid_is_refused(sandbox_tmp, which):
    foreign = sandbox_tmp / "foreign"
    foreign.mkdir()
    os.chown(foreign, OTHER, OTHER)
    if which == "work_root":
        from cuda_eval.compile.pool import CompileConfig, CompilePool
        with pytest.raises(safe_dirs.UnsafeDirectory, match="compile work root"):
            CompilePool(CompileConfig(cache_dir=str(sandbox_tmp / "cache"), work_root=str(foreign), pch="off"))
    elif which == "run_dir":
        from cuda_eval.orchestrator.gpu_pool import GpuPool, PoolConfig
        with pytest.raises(safe_dirs.UnsafeDirectory, match="worker run dir.*EvalConfig.run_dir"):
            GpuPool(PoolConfig(devices=(), run_dir=str(foreign)), spawn=lambda *a, **k: None)
    elif which == "ref_timing":
        with pytest.raises(safe_dirs.UnsafeDirectory, match="reference-timing cache"):
            ReferenceTimingCache(str(foreign))
    else:
        (sandbox_tmp / "c").mkdir()
        os.rename(foreign, sandbox_tmp / "c" / "entries")  # a sub-dir of ours that another uid owns
        with pytest.raises(safe_dirs.UnsafeDirectory, match="entries is owned by uid"):
            BuildCache(str(sandbox_tmp / "c"), 1 << 20)


def test_directories_are_made_ours_with_the_mode_asked(tmp_path):
    path = tmp_path / "a" / "b" / "c"
    assert safe_dirs.ensure_dir(str(path), 0o711) == str(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o711 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755
    os.chmod(path, 0o700)
    safe_dirs.ensure_dir(str(path), 0o711)  # ours: its mode is set again
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o711
    os.chmod(path, 0o777)
    with pytest.raises(safe_dirs.UnsafeDirectory, match="writable by others"):
        safe_dirs.ensure_dir(str(path), 0o711)
    (tmp_path / "file").write_text("")
    with pytest.raises(safe_dirs.UnsafeDirectory, match="not a directory"):
        safe_dirs.ensure_dir(str(tmp_path / "file" / "x"), 0o755)
    with pytest.raises(FileNotFoundError):
        safe_dirs.check_dir(str(tmp_path / "missing"))
