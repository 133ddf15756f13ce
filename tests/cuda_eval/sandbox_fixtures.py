"""Fixtures shared by the compile-stage tests (imported by the test modules that use them; not collected)."""
import fcntl
import os
import pathlib
import shutil
import tempfile

import pytest


def _test_arch() -> str:
    """The arch of the GPU here (nvidia-smi, no CUDA context), else toolchain.DEFAULT_ARCH: the builds the GPU tests
    run are made for the card they run on (an A100, L40S, H100 or B200 alike)."""
    from cuda_eval.compile import toolchain as tc
    return tc.resolve_arch("auto")[0]


TEST_ARCH = _test_arch()


@pytest.fixture
def sandbox_tmp():
    """A scratch dir that a sandbox uid can reach (pytest's tmp_path lives under a 0700 directory)."""
    path = tempfile.mkdtemp(prefix="cuda_eval_test_")
    os.chmod(path, 0o711)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_dir():
    """One directory for the whole test run, shared by the xdist workers (builds are expensive: each is done once
    and then found in the cache) and reachable by sandbox uids. Not under pytest's tmp tree: pytest resets that to
    0700 whenever another session starts. Reference-counted: the last worker using it removes it."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    path = pathlib.Path(tempfile.gettempdir()) / f"cuda_eval_test_{run}"
    path.mkdir(mode=0o711, exist_ok=True)
    os.chmod(path, 0o711)
    count = path / "users"

    def add(delta: int) -> int:
        with open(path / "users.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            n = int(count.read_text() or 0) if count.exists() else 0
            n += delta
            count.write_text(str(n))
            return n
    add(+1)
    yield path
    if add(-1) == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def run_lock(shared_dir):
    """lock(name): a context manager serialising one expensive step across xdist workers."""
    import contextlib

    @contextlib.contextmanager
    def lock(name: str):
        with open(shared_dir / f"{name}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield
    return lock


@pytest.fixture(scope="session")
def toolchain(shared_dir, run_lock):
    from cuda_eval.compile import toolchain as tc
    with run_lock("toolchain"):
        return tc.detect(TEST_ARCH, cache_dir=str(shared_dir / "cache"))


CANDIDATES = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "candidates"


def candidate_pair(name: str) -> tuple[str, str]:
    """(task source, solution source) of benchmarks/candidates/<name>."""
    return (CANDIDATES / "tasks" / f"{name}.py").read_text(), (CANDIDATES / f"{name}.py").read_text()


def make_pool(shared_dir, **overrides):
    from cuda_eval.compile.pool import CompileConfig, CompilePool
    cfg = dict(workers=min(16, os.cpu_count() or 2), arch=TEST_ARCH, cache_dir=str(shared_dir / "cache"), pch="off",
               work_root=str(shared_dir / "work"), record_timeout_s=120, compile_timeout_s=900)
    cfg.update(overrides)
    return CompilePool(CompileConfig(**cfg))


@pytest.fixture(scope="session")
def compile_pool(shared_dir, toolchain):
    with make_pool(shared_dir) as pool:
        yield pool


@pytest.fixture(scope="session")
def built_add(compile_pool, run_lock):
    """KernelBench's add example, compiled once per test run (the other worker then gets a cache hit)."""
    with run_lock("add"):
        return compile_pool.compile(*candidate_pair("add"))
