"""The GPU timing lock is machine-wide and named by the physical GPU, so that two evaluators on one GPU never time at
the same time; CPU-mode slots keep per-pool locks."""
import os
import stat

from cuda_eval.gpu_pool import GpuPool, PoolConfig


def pool(tmp_path, name, **kw):
    # devices=() starts no slot thread and no worker: only the lock naming is exercised
    return GpuPool(PoolConfig(devices=(), run_dir=str(tmp_path / name), device_lock_dir=str(tmp_path / "locks"), **kw))


def test_two_pools_on_one_physical_gpu_share_its_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    a, b = pool(tmp_path, "a"), pool(tmp_path, "b")
    assert a._lock_file("0") == b._lock_file("0") == str(tmp_path / "locks" / "device-2.lock")
    gpu3 = a._lock_file("1")
    assert gpu3 == str(tmp_path / "locks" / "device-3.lock")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")            # another process pinned to GPU 3 meets the same lock
    assert pool(tmp_path, "c")._lock_file("0") == gpu3
    # Ours alone: processes get a descriptor of the file (pass_fds), never write access to its directory.
    mode = os.stat(tmp_path / "locks").st_mode
    assert stat.S_IMODE(mode) == 0o755 and stat.S_IMODE(os.stat(a._lock_file("0")).st_mode) == 0o600


def test_gpu_uuids_make_safe_lock_names(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-d0e052fd-41c1/x")
    path = pool(tmp_path, "a")._lock_file("0")
    assert os.path.dirname(path) == str(tmp_path / "locks")
    assert os.path.basename(path) == "device-GPU-d0e052fd-41c1_x.lock"


def test_cpu_slots_lock_per_pool(tmp_path):
    a, b = pool(tmp_path, "a", device_type="cpu"), pool(tmp_path, "b", device_type="cpu")
    assert a._lock_file("cpu0") == str(tmp_path / "a" / "device-cpu0.lock") != b._lock_file("cpu0")


def test_a_planted_lock_dir_is_not_followed(tmp_path):
    """A candidate creates the machine-wide lock dir before any GPU pool did, with a link named like a lock file
    pointing where root must not create files. The pool neither follows the link nor uses that dir."""
    locks, target = tmp_path / "locks", tmp_path / "root_must_not_create_this"
    locks.mkdir()
    os.chmod(locks, 0o777)  # writable by others: not ours alone
    (locks / "device-0.lock").symlink_to(target)
    a = pool(tmp_path, "a")
    path = a._lock_file("0")
    assert os.path.dirname(path) == str(tmp_path / "a") and not target.exists()
    planted = tmp_path / "ours" / "device-0.lock"
    planted.parent.mkdir()
    planted.symlink_to(target)
    b = GpuPool(PoolConfig(devices=(), run_dir=str(tmp_path / "b"), device_lock_dir=str(planted.parent)))
    try:
        b._lock_file("0")
        raise AssertionError("a link as lock file was opened")
    except OSError:
        pass
    assert not target.exists()
