"""The sandboxed runner (cuda_eval._native + cuda_eval.sandbox) against real misbehaving programs."""
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest

from cuda_eval import _native
from cuda_eval.orchestrator import gpu_pool
from sandbox_fixtures import sandbox_tmp  # noqa: F401 - fixture
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import sweeps as sandbox_sweeps
from cuda_eval.sandbox import runner as sb

DEDICATED = sandbox_identity.identity_mode() == "dedicated"
ROOT_WITHOUT_UID = os.geteuid() == 0 and not DEDICATED
needs_dedicated = pytest.mark.skipif(not DEDICATED, reason="needs root and a usable dedicated sandbox uid")

LIMITS = sb.SandboxLimits(address_space_bytes=4 << 30, cpu_seconds=30, open_files=256, file_size_bytes=64 << 20,
                          processes=64, wall_timeout_s=20, output_cap_bytes=64 << 10)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def run(sandbox_tmp, code: str, **overrides) -> dict:
    limits = sb.SandboxLimits(**{**LIMITS.__dict__, **overrides})
    return sb.run_sandboxed(py(code), str(sandbox_tmp / "work"), limits)


def test_runs_and_captures_output(sandbox_tmp):
    res = run(sandbox_tmp, "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)")
    assert res["exit_code"] == 3 and res["signal"] == 0 and not res["timed_out"]
    assert res["stdout"] == b"out\n" and res["stderr"] == b"err\n"
    assert res["wall_s"] > 0 and res["cpu_s"] > 0
    assert res["workdir"] == str(sandbox_tmp / "work")


def test_environment_is_an_allow_list(sandbox_tmp, monkeypatch):
    monkeypatch.setenv("KEVIN_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    res = run(sandbox_tmp, "import os, json; print(json.dumps(dict(os.environ)))")
    import json
    env = json.loads(res["stdout"])
    assert "KEVIN_SECRET_TOKEN" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["HOME"] == str(sandbox_tmp / "work") and env["TMPDIR"] == str(sandbox_tmp / "work")
    assert sandbox_environment.PACKAGE_PARENT in env["PYTHONPATH"].split(os.pathsep) or DEDICATED


def test_output_is_capped_and_the_rest_drained(sandbox_tmp):
    t0 = time.monotonic()
    res = run(sandbox_tmp,
              "import sys\nfor _ in range(200): sys.stdout.write('x' * 65536)\nprint('done', file=sys.stderr)")
    assert res["exit_code"] == 0
    assert len(res["stdout"]) == LIMITS.output_cap_bytes and res["stdout_truncated"]
    assert res["stderr"] == b"done\n" and not res["stderr_truncated"]
    assert time.monotonic() - t0 < 15


def test_infinite_loop_is_killed_at_the_wall_timeout(sandbox_tmp):
    t0 = time.monotonic()
    res = run(sandbox_tmp, "while True: pass", wall_timeout_s=1.0)
    assert res["timed_out"] and res["signal"] == signal.SIGKILL and res["exit_code"] == -1
    assert time.monotonic() - t0 < 5
    assert "timed out" in sb.describe(res)


def test_os_exit_and_signals_are_reported(sandbox_tmp):
    assert run(sandbox_tmp, "import os; os._exit(7)")["exit_code"] == 7
    res = run(sandbox_tmp, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert res["signal"] == signal.SIGSEGV and not res["timed_out"]
    assert "SIGSEGV" in sb.describe(res)


def test_huge_allocation_fails_inside_the_sandbox(sandbox_tmp):
    t0 = time.monotonic()
    res = run(sandbox_tmp, "x = bytearray(100 * 1024**3)")
    assert res["exit_code"] == 1 and b"MemoryError" in res["stderr"]
    assert time.monotonic() - t0 < 10


def test_cpu_time_limit(sandbox_tmp):
    res = run(sandbox_tmp, "while True: pass", cpu_seconds=1, wall_timeout_s=15)
    assert not res["timed_out"]
    assert res["signal"] in (signal.SIGXCPU, signal.SIGKILL)
    assert "CPU time limit" in sb.describe(res, sb.SandboxLimits(cpu_seconds=1))


@pytest.mark.skipif(ROOT_WITHOUT_UID, reason="root without a sandbox uid: RLIMIT_NPROC would not hold a fork bomb")
def test_fork_bomb_is_contained_and_cleaned_up(sandbox_tmp):
    code = ("import os\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n")
    t0 = time.monotonic()
    res = run(sandbox_tmp, code, wall_timeout_s=3.0, processes=32)
    assert res["timed_out"]
    assert time.monotonic() - t0 < 15
    if res["uid"] is not None:
        assert _native.count_uid_processes(res["uid"]) == 0


@needs_dedicated
def test_setsid_escapee_is_killed_with_the_uid(sandbox_tmp):
    code = ("import subprocess, sys\n"
            "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
            "print('spawned')\n")
    res = run(sandbox_tmp, code)
    assert res["exit_code"] == 0 and res["uid"] is not None
    assert _native.count_uid_processes(res["uid"]) == 0


@needs_dedicated
def test_cannot_write_outside_its_dir_and_temp_files_are_swept(sandbox_tmp):
    outside = sandbox_tmp / "outside"
    outside.mkdir()
    os.chmod(outside, 0o755)
    marker = f"/tmp/cuda_eval_test_leftover_{os.getpid()}"
    code = (f"import os\n"
            f"open('inside.txt', 'w').write('ok')\n"
            f"open('{marker}', 'w').write('left behind')\n"
            f"try:\n"
            f"    open('{outside}/x.txt', 'w')\n"
            f"    print('WROTE')\n"
            f"except PermissionError:\n"
            f"    print('denied')\n")
    res = run(sandbox_tmp, code)
    assert res["stdout"] == b"denied\n", res
    assert not (outside / "x.txt").exists()
    assert (sandbox_tmp / "work" / "inside.txt").read_text() == "ok"
    assert not os.path.exists(marker)


@needs_dedicated
def test_runs_under_a_leased_uid_that_is_released(sandbox_tmp):
    res = run(sandbox_tmp, "import os; print(os.getuid(), os.getgid())")
    uid, gid = map(int, res["stdout"].split())
    assert uid == res["uid"] and uid >= sandbox_config.IDENTITY.uid_base and gid == uid
    assert os.stat(sandbox_tmp / "work").st_uid == uid


def test_spawn_write_stdin_and_wait(sandbox_tmp):
    p = sb.spawn_sandboxed(py("import sys; print(sys.stdin.readline().strip().upper())"), str(sandbox_tmp / "w"),
                           LIMITS)
    assert p.pid > 0
    p.write_stdin(b"job.json\n")
    p.close_stdin()
    res = p.wait(10)
    assert res["exit_code"] == 0 and res["stdout"] == b"JOB.JSON\n"
    assert p.wait(10) is res  # idempotent


def test_spawn_wait_timeout_kills(sandbox_tmp):
    p = sb.spawn_sandboxed(py("import time; time.sleep(60)"), str(sandbox_tmp / "w"), LIMITS)
    t0 = time.monotonic()
    res = p.wait(0.5)
    assert res["timed_out"] and time.monotonic() - t0 < 5
    assert not p.alive


def test_spawn_lifetime_cap(sandbox_tmp):
    limits = sb.SandboxLimits(**{**LIMITS.__dict__, "wall_timeout_s": 1.0})
    p = sb.spawn_sandboxed(py("import time; time.sleep(60)"), str(sandbox_tmp / "w"), limits)
    res = p.wait(None)
    assert res["timed_out"] and res["wall_s"] < 5


PARENT_THEN_KILLED = """
import os, signal, sys, time
sys.path[:0] = {paths!r}
from cuda_eval.orchestrator import gpu_pool
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import sweeps as sandbox_sweeps
from cuda_eval.sandbox import runner as sb
limits = sb.SandboxLimits(**{limits!r})
argv = [sys.executable, "-c", "import time; time.sleep(120)"]
if {pool!r}:
    p = gpu_pool.default_spawn(argv, {workdir!r}, limits, {{}})
else:
    p = sb.spawn_sandboxed(argv, {workdir!r}, limits)
print(p.pid, flush=True)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)  # as `timeout` or the OOM killer would end an evaluator
"""


def _survives_parent_kill(sandbox_tmp, pool: bool) -> bool:
    """Whether the child is still alive 5 s after its parent process was SIGKILLed while waiting for it (a survivor
    is killed afterwards)."""
    limits = {**LIMITS.__dict__, "wall_timeout_s": 120}
    code = PARENT_THEN_KILLED.format(paths=sys.path, limits=limits, pool=pool, workdir=str(sandbox_tmp / "w"))
    parent = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert parent.returncode == -signal.SIGKILL, parent.stderr[-2000:]
    child = types.SimpleNamespace(pid=int(parent.stdout.split()[0]))  # gpu_pool._alive reads /proc for it
    deadline = time.monotonic() + 5
    while gpu_pool._alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = gpu_pool._alive(child)
    if alive:
        os.kill(child.pid, signal.SIGKILL)
    return alive


def test_pool_worker_dies_with_a_killed_evaluator(sandbox_tmp):
    """A run cut by `timeout` left its GPU worker unwatched (the job timeout lives in the evaluator), and
    the next run on that GPU measured every kernel ~9x slower. Pool workers now die with their slot thread."""
    assert not _survives_parent_kill(sandbox_tmp, pool=True), "a worker outlived its killed evaluator"


def test_a_plain_spawn_outlives_its_parent_so_the_pool_must_ask(sandbox_tmp):
    """The control: without die_with_parent_thread the child runs on after its parent is killed (which is why the
    test above can fail)."""
    assert _survives_parent_kill(sandbox_tmp, pool=False)


def test_runs_in_parallel_threads_release_the_gil(sandbox_tmp):
    out = []
    threads = [threading.Thread(target=lambda i=i: out.append(run(sandbox_tmp / str(i), "import time; time.sleep(1)")))
               for i in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 4 and all(r["exit_code"] == 0 for r in out)
    assert time.monotonic() - t0 < 3.5


def test_bad_arguments_are_clear_errors(sandbox_tmp):
    with pytest.raises(ValueError, match="cpu_seconds"):
        sb.SandboxLimits(cpu_seconds=-1)
    with pytest.raises(ValueError, match="unknown limit 'bogus'"):
        _native.run(["true"], env={"PATH": "/usr/bin:/bin"}, cwd="/", timeout_s=5, limits={"bogus": 1},
                    output_cap_bytes=10)
    with pytest.raises(RuntimeError, match="not found on the sandbox PATH"):
        sb.run_sandboxed(["definitely-not-a-program-xyz"], str(sandbox_tmp / "w"), LIMITS)
    with pytest.raises(RuntimeError, match="chdir"):
        _native.run(["true"], env={"PATH": "/usr/bin:/bin"}, cwd=str(sandbox_tmp / "missing"), timeout_s=5, limits={},
                    output_cap_bytes=10)
    with pytest.raises(TypeError, match="SandboxLimits"):
        sb.run_sandboxed(["true"], str(sandbox_tmp / "w"), {"wall_timeout_s": 1})


def test_session_runs_concurrent_processes_under_one_uid(sandbox_tmp):
    with sb.SandboxSession(str(sandbox_tmp / "s")) as session:
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            session.run(py("import os, time; time.sleep(0.5); print(os.getuid())"), LIMITS))) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        uids = {r["stdout"] for r in results}
        assert len(uids) == 1 and all(r["exit_code"] == 0 for r in results)
    with pytest.raises(RuntimeError, match="closed"):
        session.run(["true"], LIMITS)


def test_cuda_timer_imports_without_a_gpu_and_fails_clearly():
    timer = _native.CudaTimer(None)  # nothing loaded yet
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU is present: the GPU tests cover the timer")
    with pytest.raises(RuntimeError, match="cuda|CUDA"):
        timer.time(lambda: None, warmup=1, reps=1)
    with pytest.raises(RuntimeError):
        _native.device_properties()


def test_cuda_timer_rejects_a_missing_library():
    timer = _native.CudaTimer("/nonexistent/libcudart.so")
    with pytest.raises(RuntimeError, match="cannot load libcudart"):
        timer.time(lambda: None, warmup=0, reps=1)


# --- fail closed ------------------------------------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: not root, our own uid is the sandbox identity")
def test_running_candidates_as_root_is_refused(sandbox_tmp, monkeypatch):
    monkeypatch.setattr(sandbox_config.IDENTITY, "mode", "same")
    with pytest.raises(sandbox_config.SandboxUnavailable, match="refused as root"):
        run(sandbox_tmp, "open('ran', 'w')")
    with pytest.raises(sandbox_config.SandboxUnavailable):
        sandbox_identity.identity_mode()
    assert not (sandbox_tmp / "work" / "ran").exists()


UNUSABLE_UID = """
import os, sys
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import sweeps as sandbox_sweeps
from cuda_eval.sandbox import runner as sb
try:
    res = sb.run_sandboxed([sys.executable, "-c", "open('ran', 'w')"], {work!r}, sb.SandboxLimits(wall_timeout_s=30))
    print("RAN", res["uid"], res["stderr"][-500:])
except sandbox_config.SandboxUnavailable as e:
    print("UNAVAILABLE", e)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only")
def test_an_unusable_sandbox_uid_fails_closed_with_the_fix_in_the_message(sandbox_tmp):
    """A checkout in a private folder must be staged for the sandbox uid; when that cannot be done (here: the runtime
    dir belongs to someone else) nothing runs, as root or otherwise, and the error says what and how."""
    private = sandbox_tmp / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    shutil.copytree(os.path.join(sandbox_environment.PACKAGE_PARENT, "cuda_eval"), private / "cuda_eval",
                    ignore=shutil.ignore_patterns("__pycache__"))
    foreign = sandbox_tmp / "runtime"
    foreign.mkdir()
    os.chown(foreign, 60999, 60999)
    work = sandbox_tmp / "work"
    env = {**os.environ, "PYTHONPATH": str(private), "CUDA_EVAL_SANDBOX_RUNTIME_DIR": str(foreign)}
    out = subprocess.run([sys.executable, "-c", UNUSABLE_UID.format(work=str(work))], capture_output=True, text=True,
                         env=env, cwd=str(sandbox_tmp), timeout=120)
    assert out.stdout.startswith("UNAVAILABLE"), out.stdout + out.stderr[-2000:]
    assert f"{private} (mode 0700) lacks o+x" in out.stdout
    assert "CUDA_EVAL_SANDBOX_RUNTIME_DIR" in out.stdout and "never run as root" in out.stdout
    assert not (work / "ran").exists()


# --- network, descriptors --------------------------------------------------------------------------------------
CONNECT = """
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
    print("connected")
except OSError as e:
    print("blocked", e)
"""


@needs_dedicated
def test_no_network_for_sandboxed_processes(sandbox_tmp):
    info = sandbox_identity.isolation()
    if info["network"] != "isolated":
        pytest.skip(f"no network namespace here: {info['network_note']}")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        code = CONNECT.format(port=port)
        res = run(sandbox_tmp, code)
        assert res["stdout"].startswith(b"blocked"), res
        p = sb.spawn_sandboxed(py(code), str(sandbox_tmp / "spawned"), LIMITS)
        assert p.wait(30)["stdout"].startswith(b"blocked")
        # The control: the same uid without a namespace of its own reaches the listener.
        with sb.SandboxSession(str(sandbox_tmp / "control")) as session:
            assert session.network_isolated
            argv, kwargs = session._kwargs(py(code), LIMITS, None, None)
            kwargs["new_netns"] = False
            res = _native.run(argv, timeout_s=30, **kwargs)
        assert res["stdout"] == b"connected\n", res
    finally:
        listener.close()


FD_PROBE = """
import os, socket
leaked = []
for fd in range(4, 1024):
    try:
        os.fstat(fd)
        leaked.append(fd)
    except OSError:
        pass
s = socket.socket(fileno=3)
s.sendall(("hello %r" % leaked).encode())
"""


def test_pass_fds_arrive_as_fd_3_and_nothing_else_leaks(sandbox_tmp):
    ours, theirs = socket.socketpair()
    decoy = open(sandbox_tmp / "decoy", "w")  # an fd of ours that must not be inherited
    try:
        os.set_inheritable(decoy.fileno(), True)
        p = sb.spawn_sandboxed(py(FD_PROBE), str(sandbox_tmp / "w"), LIMITS, pass_fds=[theirs.fileno()])
        theirs.close()
        ours.settimeout(30)
        got = ours.recv(4096)
        res = p.wait(30)
    finally:
        ours.close()
        decoy.close()
    assert res["exit_code"] == 0, res["stderr"][-2000:]
    assert got == b"hello []"


# --- world-writable dirs -----------------------------------------------------------------------------------------
def test_world_writable_dirs_are_discovered():
    dirs = sandbox_sweeps.world_writable_dirs()
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue", "/run/shm"):
        if os.path.isdir(d) and os.stat(d).st_mode & stat.S_IWOTH:
            assert os.path.realpath(d) in dirs, d
    assert len(dirs) == len(set(dirs))


@needs_dedicated
def test_every_world_writable_place_is_swept(sandbox_tmp):
    """Files the uid leaves in any world-writable dir are removed with its lease, also inside a world-writable dir
    that someone else owns (here: one the test makes in /tmp, with a nested one), and only the uid's own."""
    shared = tempfile.mkdtemp(prefix="cuda_eval_test_ww_")
    nested = os.path.join(shared, "nested")
    os.mkdir(nested)
    for d in (shared, nested):
        os.chmod(d, 0o1777)
    ours = os.path.join(nested, "root_file")
    open(ours, "w").close()
    targets = [os.path.join(shared, "a"), os.path.join(nested, "b"), os.path.join(nested, "tree/c")]
    run_lock = "/run/lock" if os.path.isdir("/run/lock") and os.stat("/run/lock").st_mode & stat.S_IWOTH else None
    if run_lock:
        targets.append(f"{run_lock}/cuda_eval_test_{os.getpid()}")
    code = ("import os, sys\n"
            "for t in sys.argv[1:]:\n"
            "    os.makedirs(os.path.dirname(t), exist_ok=True)\n"
            "    open(t, 'w').write('left behind')\n"
            "print('ok')\n")
    try:
        res = sb.run_sandboxed([sys.executable, "-c", code, *targets], str(sandbox_tmp / "work"), LIMITS)
        assert res["stdout"] == b"ok\n", res
        for t in targets:
            assert not os.path.exists(t), t
        assert not os.path.exists(os.path.join(nested, "tree"))
        assert os.path.exists(ours)  # not the uid's
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# --- disk quota ----------------------------------------------------------------------------------------------------
FILL = """
import os, sys, time
where, how = sys.argv[1], sys.argv[2]
chunk = b"x" * (4 << 20)
os.makedirs(where, exist_ok=True)
if how == "deleted":
    f = open(os.path.join(where, "hidden"), "wb")
    os.unlink(f.name)
for i in range(500):  # 2 GB unless stopped
    if how != "deleted":
        f = open(os.path.join(where, f"f{i}"), "wb")
    f.write(chunk)
    f.flush()
    time.sleep(0.02)
print("wrote everything")
"""


@pytest.mark.parametrize("where", ["workdir", "tmp", "deleted"])
def test_disk_quota_kills_the_session(sandbox_tmp, where):
    if where == "tmp" and not DEDICATED:
        pytest.skip("files in /tmp count for a dedicated uid only")
    limits = sb.SandboxLimits(**{**LIMITS.__dict__, "disk_bytes": 48 << 20, "file_size_bytes": 4 << 30,
                                 "wall_timeout_s": 60})
    target = {"workdir": "out", "tmp": f"/tmp/cuda_eval_test_fill_{os.getpid()}", "deleted": "."}[where]
    t0 = time.monotonic()
    with sb.SandboxSession(str(sandbox_tmp / "work")) as session:
        res = session.run(py(FILL) + [target, where], limits)
        assert session.disk_quota_exceeded
    assert res["disk_quota_exceeded"] and res["signal"] == signal.SIGKILL, res
    assert b"wrote everything" not in res["stdout"]
    assert time.monotonic() - t0 < 30
    assert sb.describe(res, limits).startswith("killed: over the disk quota")
    assert not os.path.exists(f"/tmp/cuda_eval_test_fill_{os.getpid()}") or not DEDICATED


def test_no_quota_flag_for_a_quiet_process(sandbox_tmp):
    res = run(sandbox_tmp, "open('small', 'w').write('x' * 1000)", disk_bytes=1 << 20)
    assert res["exit_code"] == 0 and res["disk_quota_exceeded"] is False


SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ipc_private, ipc_creat = 0, 0o1000
ids = [libc.shmget(ipc_private, 1 << 20, ipc_creat | 0o600), libc.semget(ipc_private, 1, ipc_creat | 0o600),
       libc.msgget(ipc_private, ipc_creat | 0o600)]
print(*ids)
"""


def _sysv_ids(kind: str) -> set[int]:
    with open(f"/proc/sysvipc/{kind}") as f:
        next(f)
        return {int(line.split()[1]) for line in f if line.strip()}


@needs_dedicated
@pytest.mark.skipif(not os.path.exists("/proc/sysvipc/shm"), reason="no SysV IPC")
def test_sysv_ipc_objects_do_not_outlive_the_lease(sandbox_tmp):
    res = run(sandbox_tmp, SYSV)
    shm, sem, msg = map(int, res["stdout"].split())
    assert min(shm, sem, msg) >= 0, res
    assert shm not in _sysv_ids("shm") and sem not in _sysv_ids("sem") and msg not in _sysv_ids("msg")
