"""The content-addressed build cache: atomic publication, lock-free reads, LRU bound, hostile sources."""
import hashlib
import multiprocessing
import os
import time

import pytest

from cuda_eval.compile.cache import BuildCache


def key(i) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def make_file(tmp_path, name, size, fill=b"x"):
    p = tmp_path / name
    p.write_bytes(fill * size)
    return str(p)


def test_publish_then_lookup(tmp_path):
    cache = BuildCache(str(tmp_path / "c"), 1 << 20)
    assert cache.lookup(key(1)) is None
    src = make_file(tmp_path, "m.so", 100)
    entry = cache.publish(key(1), {"m.so": src}, {"name": "m"})
    assert os.path.exists(src)  # copied, not moved, by default
    hit = cache.lookup(key(1), required=("m.so",))
    assert hit.path == entry.path and hit.meta["name"] == "m" and hit.meta["files"] == ["m.so"]
    assert open(hit.file("m.so"), "rb").read() == b"x" * 100
    assert cache.lookup(key(1), required=("other.so",)) is None
    assert oct(os.stat(hit.file("m.so")).st_mode & 0o777) == "0o755"  # .so: loadable by other uids


def test_move_publish(tmp_path):
    cache = BuildCache(str(tmp_path / "c"), 1 << 20)
    src = make_file(tmp_path, "obj.o", 10)
    cache.publish(key(2), {"obj.o": src}, move=True)
    assert not os.path.exists(src)


def test_lru_eviction_keeps_recently_used(tmp_path):
    cache = BuildCache(str(tmp_path / "c"), 1000, min_age_s=0, evict_interval_s=3600)
    cache._last_evict = time.monotonic()  # no automatic eviction while filling
    for i in range(4):
        cache.publish(key(i), {"f.bin": make_file(tmp_path, f"s{i}", 300)})
        os.utime(cache.entry_dir(key(i)), (time.time() - 100 + i, time.time() - 100 + i))
    # Entry 0 is the oldest, but a hit makes it the most recent.
    assert cache.lookup(key(0)) is not None
    cache.maybe_evict(force=True)
    assert cache.size_bytes() <= 900
    assert cache.lookup(key(0)) is not None
    assert cache.lookup(key(1)) is None


def test_recent_entries_are_never_evicted(tmp_path):
    cache = BuildCache(str(tmp_path / "c"), 500, min_age_s=3600, evict_interval_s=0)
    for i in range(3):
        cache.publish(key(i), {"f.bin": make_file(tmp_path, f"s{i}", 300)})
    assert all(cache.lookup(key(i)) for i in range(3))  # over budget, but all too young to evict


def _publish_worker(root, src, k, n):
    cache = BuildCache(root, 1 << 30)
    for _ in range(n):
        cache.publish(k, {"m.so": src}, {"pid": os.getpid()})
        entry = cache.lookup(k, required=("m.so",))
        assert entry is not None and open(entry.file("m.so"), "rb").read() == b"y" * 4096


def test_concurrent_publishers_of_one_key(tmp_path):
    root = str(tmp_path / "c")
    src = make_file(tmp_path, "m.so", 4096, b"y")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_publish_worker, args=(root, src, key(7), 20)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    cache = BuildCache(root, 1 << 30)
    assert cache.lookup(key(7), required=("m.so",)) is not None
    assert os.listdir(os.path.join(root, "tmp")) == []


def test_refuses_links_planted_by_a_sandbox(tmp_path):
    cache = BuildCache(str(tmp_path / "c"), 1 << 20)
    secret = make_file(tmp_path, "secret", 10)
    os.symlink(secret, tmp_path / "link.so")
    with pytest.raises(ValueError, match="regular file"):
        cache.publish(key(3), {"m.so": str(tmp_path / "link.so")})
    os.link(secret, tmp_path / "hard.so")
    with pytest.raises(ValueError, match="single link"):
        cache.publish(key(3), {"m.so": str(tmp_path / "hard.so")})
    assert cache.lookup(key(3)) is None


@pytest.mark.parametrize("bad", ["", "short", "../../etc/passwd0000", "ABCDEF0123456789"])
def test_bad_keys_and_names(tmp_path, bad):
    cache = BuildCache(str(tmp_path / "c"), 1 << 20)
    with pytest.raises(ValueError):
        cache.lookup(bad)
    with pytest.raises(ValueError, match="file name"):
        cache.publish(key(1), {"../x": make_file(tmp_path, "f", 1)})
    with pytest.raises(ValueError):
        BuildCache(str(tmp_path / "d"), 0)
