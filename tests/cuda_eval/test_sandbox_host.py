"""What the sandbox leaves of the host to a candidate: IPC objects, the OOM killer's choice and memory cgroups,
the machine-wide uid leases, uids that belong to someone else, and the isolation an evaluator gets without root."""
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile

import pytest

from cuda_eval import _native
from cuda_eval.orchestrator import gpu_pool
from cuda_eval.sandbox import cgroups
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import leases as sandbox_leases
from cuda_eval.sandbox import probes as sandbox_probes
from cuda_eval.sandbox import sweeps as sandbox_sweeps
from cuda_eval.sandbox import runner as sb
from sandbox_fixtures import sandbox_tmp  # noqa: F401 - fixture

DEDICATED = sandbox_identity.identity_mode() == "dedicated"
needs_dedicated = pytest.mark.skipif(not DEDICATED, reason="needs root and a usable dedicated sandbox uid")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="as root only")

LIMITS = sb.SandboxLimits(address_space_bytes=4 << 30, cpu_seconds=30, open_files=256, file_size_bytes=64 << 20,
                          processes=64, wall_timeout_s=30, output_cap_bytes=64 << 10)


def py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


# --- (a) IPC: no message queue survives its candidate ------------------------------------------------------------
MQ = """
import ctypes, ctypes.util, os, sys
try:
    libc = ctypes.CDLL(None, use_errno=True)
    mq_open = libc.mq_open                     # glibc >= 2.34
except AttributeError:
    mq_open = ctypes.CDLL(ctypes.util.find_library("rt"), use_errno=True).mq_open
name, create = sys.argv[1].encode(), sys.argv[2] == "create"
if create:
    os.umask(0)                                # a queue any uid may read and write
fd = mq_open(name, os.O_RDWR | (os.O_CREAT if create else 0), 0o666, None)
print("opened" if fd >= 0 else "failed " + os.strerror(ctypes.get_errno()))
"""


def _host_can_open(name: str) -> bool:
    out = subprocess.run(py(MQ, name, "open"), capture_output=True, text=True, timeout=60)
    return out.stdout.strip() == "opened"


@needs_dedicated
def test_a_message_queue_does_not_outlive_its_candidate(sandbox_tmp):
    """A candidate makes a world-writable POSIX message queue; once its lease ends, the next candidate (another uid)
    cannot open it, nor can anyone on the host: it lived in the candidate's own IPC namespace (or, without one, it
    could not be made)."""
    name = f"/cuda_eval_test_mq_{os.getpid()}"
    first = sb.run_sandboxed(py(MQ, name, "create"), str(sandbox_tmp / "a"), LIMITS)
    assert first["exit_code"] == 0, first["stderr"][-2000:]
    assert first["stdout"].strip() == b"opened" or not sandbox_identity.isolation()["ipc"] == "isolated", first
    later = sb.run_sandboxed(py(MQ, name, "open"), str(sandbox_tmp / "b"), LIMITS)
    assert later["stdout"].startswith(b"failed No such file"), later
    assert not _host_can_open(name)


SHMGET = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
print(*[libc.shmget(0, int(size), 0o1600) >= 0 for size in sys.argv[1:]])  # IPC_PRIVATE, IPC_CREAT | 0600
"""


@needs_dedicated
def test_sysv_shared_memory_is_bounded_in_the_candidates_namespace(sandbox_tmp):
    """SysV shared memory is RAM no rlimit counts, and in the candidate's own IPC namespace the disk-quota watchdog
    cannot see it: that namespace's shmmax/shmall are set to the sandbox's shared-memory budget."""
    if sandbox_identity.isolation()["ipc"] != "isolated":
        pytest.skip("no IPC namespaces here: SysV IPC is swept and counted in the quota instead")
    res = sb.run_sandboxed(py(SHMGET, str(64 << 20), str(sandbox_config.SHM_BYTES + 1)), str(sandbox_tmp / "w"), LIMITS)
    assert res["stdout"] == b"True False\n", res


@contextlib.contextmanager
def _mqueue_mount():
    where = tempfile.mkdtemp(prefix="cuda_eval_test_mqueue_")
    if subprocess.run(["mount", "-t", "mqueue", "none", where], capture_output=True).returncode != 0:
        os.rmdir(where)
        pytest.skip("cannot mount an mqueue filesystem here")
    try:
        yield where
    finally:
        subprocess.run(["umount", where], capture_output=True)
        os.rmdir(where)


@needs_dedicated
def test_without_an_ipc_namespace_message_queues_are_refused_and_swept(sandbox_tmp, monkeypatch):
    """Where no IPC namespace can be made (a container without CAP_SYS_ADMIN: simulated here by the probe's
    answer), a candidate gets RLIMIT_MSGQUEUE 0, so it cannot make a queue at all; and one made by another route (the
    control: the same uid without that limit) is removed with the lease, like its SysV IPC."""
    monkeypatch.setitem(sandbox_probes._ns_results, "ipc", "simulated for the test: no CAP_SYS_ADMIN")
    name = f"/cuda_eval_test_mq_fallback_{os.getpid()}"
    with _mqueue_mount() as mounted:
        with sb.SandboxSession(str(sandbox_tmp / "s")) as session:
            assert not session.ipc_isolated
            refused = session.run(py(MQ, name, "create"), LIMITS)
            assert refused["stdout"].startswith(b"failed Too many open files"), refused  # EMFILE: over the rlimit
            argv, kwargs = session._kwargs(py(MQ, name, "create"), LIMITS, None, None)
            del kwargs["limits"]["msgqueue_bytes"]
            control = _native.run(argv, timeout_s=60, **kwargs)
            assert control["stdout"].strip() == b"opened", control
            assert os.stat(os.path.join(mounted, name[1:])).st_uid == session.uid
        assert not os.path.exists(os.path.join(mounted, name[1:]))
    assert not _host_can_open(name)


# --- (d) the OOM killer and memory cgroups -------------------------------------------------------------------------
def test_sandboxed_processes_are_the_oom_killers_first_pick(sandbox_tmp):
    with open("/proc/self/oom_score_adj") as f:
        ours = f.read()
    res = sb.run_sandboxed(["cat", "/proc/self/oom_score_adj"], str(sandbox_tmp / "w"), LIMITS)
    assert res["stdout"] == b"1000\n", res
    with open("/proc/self/oom_score_adj") as f:
        assert f.read() == ours  # the evaluator's own process (the trainer's) is untouched


FILL_SHM = """
import os, sys
chunk, total, done = b"x" * (1 << 20), int(sys.argv[1]), 0
for line in open("/proc/self/cgroup"):
    print("cgroup", line.strip(), flush=True)
path = "/dev/shm/cuda_eval_test_fill_%d" % os.getpid()
try:
    with open(path, "wb") as f:
        while done < total:
            f.write(chunk)
            f.flush()
            done += len(chunk)
finally:
    print("wrote", done, flush=True)
    os.unlink(path)
"""


@pytest.mark.skipif(bool(cgroups.available()), reason=f"no memory cgroups here: {cgroups.available()}")
def test_a_memory_cgroup_bounds_what_rlimits_do_not_see(sandbox_tmp, monkeypatch):
    """tmpfs pages count toward no rlimit; the process group's cgroup (limited like one of its processes) stops
    them. The control, the same program without cgroups, writes all of it."""
    limits = sb.SandboxLimits(address_space_bytes=None, data_bytes=160 << 20, cpu_seconds=60, open_files=64,
                              file_size_bytes=1 << 30, processes=16, wall_timeout_s=60, disk_bytes=None)
    total = 320 << 20
    res = sb.run_sandboxed(py(FILL_SHM, str(total)), str(sandbox_tmp / "a"), limits)
    out = res["stdout"].decode()
    assert "cuda_eval-" in out, out
    assert f"wrote {total}" not in out, res
    leaf = next(line.rsplit(":", 1)[1] for line in out.splitlines() if "cuda_eval-" in line)
    assert not any(os.path.isdir(os.path.join(m[0], leaf.lstrip("/")))
                   for m in cgroups._mounts() if m[2] in ("cgroup", "cgroup2"))  # removed with the session
    monkeypatch.setattr(cgroups, "_state", [(None, "disabled for the control")])
    control = sb.run_sandboxed(py(FILL_SHM, str(total)), str(sandbox_tmp / "b"), limits)
    assert f"wrote {total}" in control["stdout"].decode(), control


# --- (c) one lease of each uid for the whole machine; one pool per run dir -----------------------------------------
HOLD_LEASE = """
import os, sys
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import leases as sandbox_leases
from cuda_eval.sandbox import probes as sandbox_probes
from cuda_eval.sandbox import sweeps as sandbox_sweeps
from cuda_eval.sandbox import runner as sb
sandbox_config.configure(uid_range=sys.argv[1])
try:
    lease = sandbox_leases._lease_uid()
    print("leased", lease.uid, flush=True)
    sys.stdin.read()
    lease.release()
except sandbox_config.SandboxUnavailable as e:
    print("unavailable", e, flush=True)
"""


def _fresh_uids(n: int) -> list[int]:
    """n consecutive uids with no account that no evaluator has leased since boot (so no leftovers of ours)."""
    for _ in range(200):
        first = random.randrange(62000, 64900)
        uids = list(range(first, first + n))
        if all(not os.path.exists(os.path.join(sandbox_leases.LEASE_DIR, f"{u}.lock"))
               and sandbox_leases._account_of(u) is None
               and not sandbox_sweeps._uid_pids(u) for u in uids):
            return uids
    pytest.skip("no fresh uids found")


@needs_dedicated
def test_evaluators_with_different_lock_settings_never_share_a_uid():
    """Two evaluators (processes) that were told different lock dirs (the old per-evaluator setting) still lease
    from one machine-wide place: with one uid in the range, the second one waits for it instead of sharing it."""
    uid = _fresh_uids(1)[0]
    env = {**os.environ, "PYTHONPATH": sandbox_environment.PACKAGE_PARENT}
    first = subprocess.Popen(py(HOLD_LEASE, f"{uid}-{uid}"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**env, "CUDA_EVAL_SANDBOX_LOCK_DIR": "/tmp/cuda_eval_test_locks_a"})
    try:
        assert first.stdout.readline().split() == ["leased", str(uid)]
        second = subprocess.run(py(HOLD_LEASE, f"{uid}-{uid}"), input="", capture_output=True, text=True,
                                timeout=60, env={**env, "CUDA_EVAL_SANDBOX_LOCK_DIR": "/tmp/cuda_eval_test_locks_b"})
        assert second.stdout.startswith("unavailable no sandbox uid is free"), second.stdout + second.stderr
        assert "1 leased by running evaluators" in second.stdout
    finally:
        first.communicate("", timeout=60)
    again = subprocess.run(py(HOLD_LEASE, f"{uid}-{uid}"), input="", capture_output=True, text=True, timeout=60,
                           env=env)
    assert again.stdout.split()[:2] == ["leased", str(uid)], again.stdout + again.stderr


def test_two_pools_in_one_run_dir_get_a_clear_error(tmp_path):
    run_dir = tmp_path / "run"
    first = gpu_pool.GpuPool(gpu_pool.PoolConfig(devices=(), run_dir=str(run_dir)), spawn=lambda *a, **k: None)
    try:
        with pytest.raises(gpu_pool.RunDirInUse, match=f"in use by another evaluator \\(pid {os.getpid()}\\)"):
            gpu_pool.GpuPool(gpu_pool.PoolConfig(devices=(), run_dir=str(run_dir)), spawn=lambda *a, **k: None)
    finally:
        first.close()
    (run_dir / "dev0-0").mkdir()          # left by a pool that was killed: would collide with the next one's
    (run_dir / "notes.txt").write_text("the user's")
    gpu_pool.GpuPool(gpu_pool.PoolConfig(devices=(), run_dir=str(run_dir)), spawn=lambda *a, **k: None).close()
    assert not (run_dir / "dev0-0").exists() and (run_dir / "notes.txt").exists()


# --- (e) a uid is leased only if nobody else uses it -------------------------------------------------------------
@needs_root
def test_uids_with_an_account_are_never_leased(monkeypatch):
    import pwd
    owned = {p.pw_uid for p in pwd.getpwall()}
    uid = next(u for u in sorted(owned) if 0 < u < 65000 and u + 1 not in owned and u + 2 not in owned)
    monkeypatch.setattr(sandbox_config.IDENTITY, "uid_base", uid)
    monkeypatch.setattr(sandbox_config.IDENTITY, "slots", 1)
    name = pwd.getpwuid(uid).pw_name
    with pytest.raises(sandbox_config.SandboxUnavailable, match=f"used by someone else \\({uid}: user '{name}'"):
        sandbox_leases._lease_uid()
    monkeypatch.setattr(sandbox_config.IDENTITY, "slots", 2)
    for _ in range(6):
        lease = sandbox_leases._lease_uid()
        assert lease.uid == uid + 1
        lease.release()


@needs_root
def test_a_uid_someone_else_uses_is_skipped_and_left_alone(monkeypatch, caplog):
    """A uid in the range that a process or a file already uses (someone's, not a lease of ours since boot) is
    never leased: leasing it would kill that process and delete that file."""
    busy, owner, free = _fresh_uids(3)
    planted = tempfile.mktemp(prefix="cuda_eval_test_owned_", dir="/var/tmp")
    open(planted, "w").close()
    os.chown(planted, owner, owner)
    proc = _native.spawn(["sleep", "120"], env={"PATH": "/usr/bin:/bin"}, cwd="/", limits={}, output_cap_bytes=1024,
                         uid=busy, gid=busy, sweep_uid=False)
    monkeypatch.setattr(sandbox_config.IDENTITY, "uid_base", busy)
    monkeypatch.setattr(sandbox_config.IDENTITY, "slots", 3)
    # every scan starts at the busy uid: from a random start a scan may lease the free one before it looks at the
    # busy one (8 scans missed it 1 time in 26), and the warning this test reads would not come
    monkeypatch.setattr(sandbox_leases.random, "randrange", lambda n: 0)
    try:
        with caplog.at_level(logging.WARNING, logger="cuda_eval.sandbox.leases"):
            for _ in range(8):
                lease = sandbox_leases._lease_uid()
                assert lease.uid == free
                lease.release()
        assert proc.alive and os.path.exists(planted)
        assert f"sandbox uid {busy} is skipped: process {proc.pid}" in caplog.text
        assert f"sandbox uid {owner} is skipped: it owns {planted}" in caplog.text
    finally:
        proc.kill()
        proc.wait(10)
        os.unlink(planted)


def test_the_uid_range_is_validated():
    from cuda_eval.api import EvalConfig
    assert sandbox_config.parse_uid_range("60000-60999") == (60000, 60999)
    for bad in ("60000", "0-10", "60999-60000", "65000-66000", "a-b", "60000-"):
        with pytest.raises(ValueError, match="sandbox_uids"):
            EvalConfig(sandbox_uids=bad)
    assert EvalConfig().sandbox_uids == "60000-60999" and EvalConfig().allow_unsandboxed is False


# --- (f) without root ----------------------------------------------------------------------------------------------
UNPRIVILEGED = """
import json, logging, os, socket, sys
os.environ.pop({inside!r}, None)        # a normal user's evaluator, not a sandbox started from a sandbox
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from cuda_eval import _native
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import leases as sandbox_leases
from cuda_eval.sandbox import probes as sandbox_probes
from cuda_eval.sandbox import sweeps as sandbox_sweeps
from cuda_eval.sandbox import runner as sb
out = {{"uid": os.getuid()}}
try:  # what the kernel allows, asked directly (not through the sandbox's choice of mode)
    _native.run(["true"], env={{}}, cwd="/", timeout_s=30, limits={{}}, output_cap_bytes=1024, userns=True,
                writable_dir=os.getcwd())
    out["kernel_userns"] = "ok"
except RuntimeError as e:
    out["kernel_userns"] = str(e)
listener = socket.socket(socket.AF_UNIX)   # abstract: lives in our network namespace
listener.bind("\\0cuda_eval_test_{tag}")
listener.listen()
here = os.getcwd()
probe = '''
import json, os, socket, sys
r = {{"pid": os.getpid(), "procs": len([p for p in os.listdir("/proc") if p.isdigit()])}}
try:
    os.kill(int(sys.argv[1]), 0); r["signal_parent"] = "ok"
except OSError as e:
    r["signal_parent"] = e.strerror
try:
    open(os.path.join(sys.argv[2], "escaped"), "w"); r["write_outside"] = "ok"
except OSError as e:
    r["write_outside"] = e.strerror
open("inside", "w").write("x")
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\\\\0cuda_eval_test_{tag}"); r["connect"] = "ok"
except OSError as e:
    r["connect"] = e.strerror
r["oom"] = open("/proc/self/oom_score_adj").read().strip()
print(json.dumps(r))
'''
if {simulate_no_userns!r}:
    sandbox_probes._ns_results["user"] = "simulated for the test: this kernel refuses unprivileged user namespaces"
limits = sb.SandboxLimits(wall_timeout_s=60)
try:
    res = sb.run_sandboxed([sys.executable, "-c", probe, str(os.getpid()), here], os.path.join(here, "w"), limits)
    out["probe"] = json.loads(res["stdout"] or "null") or res["stderr"].decode()[-2000:]
except sandbox_config.SandboxUnavailable as e:
    out["refused"] = str(e)
    sandbox_config.configure(allow_unsandboxed=True)
    res = sb.run_sandboxed([sys.executable, "-c", probe, str(os.getpid()), here], os.path.join(here, "w"), limits)
    out["probe"] = json.loads(res["stdout"])
out["isolation"] = sandbox_identity.isolation()
print(json.dumps(out))
"""


def _unprivileged(sandbox_tmp, simulate_no_userns: bool) -> tuple[dict, str]:
    """Run UNPRIVILEGED as a non-root uid (a leased sandbox uid: it can run our staged interpreter)."""
    code = UNPRIVILEGED.format(inside=sandbox_config.INSIDE_SANDBOX_ENV, tag=os.getpid(),
                               simulate_no_userns=simulate_no_userns)
    with sb.SandboxSession(str(sandbox_tmp / "user")) as session:
        res = session.run(py(code), sb.SandboxLimits(wall_timeout_s=120, processes=256))
    assert res["exit_code"] == 0, res["stderr"].decode()[-3000:]
    return json.loads(res["stdout"].decode().splitlines()[-1]), res["stderr"].decode()


@needs_dedicated
def test_without_root_candidates_are_isolated_by_user_namespaces(sandbox_tmp):
    """An evaluator run by a normal user: its candidates are PID 1 of their own namespace (our processes can be
    neither seen nor signalled), everything but their work dir is read-only, no network (the evaluator's own
    abstract socket cannot be reached), and they are the OOM killer's first pick."""
    got, _ = _unprivileged(sandbox_tmp, simulate_no_userns=False)
    if got["kernel_userns"] != "ok":
        pytest.skip(f"this kernel gives no unprivileged user namespaces: {got['kernel_userns']}")
    assert got["isolation"]["identity"] == "namespaces", got
    assert got["uid"] != 0
    probe = got["probe"]
    assert probe["pid"] == 1 and probe["procs"] <= 3, probe
    assert probe["signal_parent"] == "No such process"
    assert probe["write_outside"] == "Read-only file system"
    assert probe["connect"] != "ok" and probe["oom"] == "1000", probe
    assert got["isolation"]["lost"] == ["it can read (not write) every file our uid can"]
    assert (sandbox_tmp / "user" / "w" / "inside").exists() and not (sandbox_tmp / "user" / "escaped").exists()


@needs_dedicated
def test_without_root_or_namespaces_candidates_are_refused_unless_opted_in(sandbox_tmp):
    got, stderr = _unprivileged(sandbox_tmp, simulate_no_userns=True)
    refused = got["refused"]
    assert refused.startswith("refusing to run candidates: we are not root") and "allow_unsandboxed=True" in refused
    assert "read, change and delete every file our uid can" in refused and "reach the network" in refused
    probe = got["probe"]  # opted in: our own uid, none of the isolation
    assert probe["pid"] != 1 and probe["signal_parent"] == "ok" and probe["write_outside"] == "ok", probe
    assert got["isolation"]["identity"] == "same" and len(got["isolation"]["lost"]) == 4
    assert "candidates run UNSANDBOXED" in stderr


GPU_IN_NAMESPACES = """
import os, sys
os.environ.pop({inside!r}, None)
from cuda_eval import _native
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import leases as sandbox_leases
from cuda_eval.sandbox import probes as sandbox_probes
from cuda_eval.sandbox import sweeps as sandbox_sweeps
from cuda_eval.sandbox import runner as sb
try:
    _native.run(["true"], env={{}}, cwd="/", timeout_s=30, limits={{}}, output_cap_bytes=1024, userns=True,
                writable_dir=os.getcwd())
except RuntimeError as e:
    print("no-userns", e)
    sys.exit(0)
code = "import torch; x = torch.ones(4, device='cuda'); print((2 * x).sum().item())"
res = sb.run_sandboxed([sys.executable, "-c", code], os.path.join(os.getcwd(), "w"),
                       sb.SandboxLimits(wall_timeout_s=300, address_space_bytes=None, data_bytes=32 << 30,
                                        processes=4096))
print(sandbox_identity.isolation()["identity"], res["stdout"].decode().strip(), res["stderr"].decode()[-3000:])
"""


@pytest.mark.gpu
@needs_dedicated
def test_cuda_works_inside_user_namespaces(sandbox_tmp):
    """The non-root evaluator's isolation (read-only root, fresh /proc, private /dev/shm, new namespaces) leaves a
    GPU usable."""
    with sb.SandboxSession(str(sandbox_tmp / "user")) as session:
        res = session.run(py(GPU_IN_NAMESPACES.format(inside=sandbox_config.INSIDE_SANDBOX_ENV)),
                          sb.SandboxLimits(wall_timeout_s=400, address_space_bytes=None, data_bytes=32 << 30,
                                           processes=4096))
    out = res["stdout"].decode()
    if out.startswith("no-userns"):
        pytest.skip(f"this machine gives a non-root uid no user namespaces: {out}")
    assert out.startswith("namespaces 8.0"), out + res["stderr"].decode()[-3000:]
