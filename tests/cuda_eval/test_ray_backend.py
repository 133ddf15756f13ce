"""EvalConfig.backend="ray" on a local multi-node Ray cluster (CPU device mode): the local backend's verdicts, builds
shipped from a compile node to a timing node, a timing node killed mid-batch while another joins, the deadlines,
and a node whose sandbox cannot be made taking no work.

The cluster runs in ray_cluster_scenarios.py, started here inside a network namespace of its own (`unshare -n`, then
loopback up): Ray's servers then listen on loopback only. Needs root (as CI runs) and util-linux's unshare."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from sandbox_fixtures import run_lock, shared_dir, toolchain  # noqa: F401

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _skip_reason() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed"
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return "needs root, unshare and ip (a network namespace for the test cluster)"
    return None


@pytest.fixture(scope="module")
def seen(tmp_path_factory, shared_dir, toolchain):  # noqa: F811  (the run's build cache: toolkit builds are hits)
    why = _skip_reason()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("ray") / "out.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]),
               RAY_DISABLE_USAGE_STATS="1", RAY_USAGE_STATS_ENABLED="0")
    script = os.path.join(HERE, "ray_cluster_scenarios.py")
    proc = subprocess.run(["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$1" "$2" "$3"',
                           sys.executable, script, str(out), str(shared_dir / "cache")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500)
    log = "\n".join(line for line in (proc.stdout + proc.stderr).splitlines() if "[state-dump]" not in line)
    assert proc.returncode == 0 and out.exists(), log[-8000:]
    return json.loads(out.read_text())


def _verdict(s: dict) -> tuple:
    return s["compiled"], s["correct"], tuple(s["flags"]), s["runtime_error"] is None, s["crash"]


def test_ray_backend_gives_the_local_verdicts(seen):
    local = {s["request_id"]: s for s in seen["local"]}
    assert len(seen["ray"]) == len(local) >= 10
    for s in seen["ray"]:
        assert not s["internal_error"], s
        assert _verdict(s) == _verdict(local[s["request_id"]]), (s, local[s["request_id"]])
    assert any(s["correct"] for s in seen["ray"]) and any(s["flags"] for s in seen["ray"])
    assert any(s["crash"] for s in seen["ray"])


def test_built_on_one_node_timed_on_another(seen):
    nodes = seen["nodes"]
    for s in seen["ray"]:
        assert s["built_on"]["node_id"] == nodes["compile"], s
        assert s["timed_on"]["node_id"] == nodes["timing1"], s
    # each build was shipped: the timing node's own cache holds it, installed from the compile node's bytes
    assert seen["timing1_shipped"], seen.get("timing1_shipped")
    # no evaluation on the head (the trainer's host): it offers no worker resource
    workers = seen["workers"]
    assert {w["node_id"] for w in workers["gpu"]} == {nodes["timing1"]}
    assert {w["node_id"] for w in workers["compile"]} == {nodes["compile"]}


def test_node_without_sandbox_takes_no_work(seen):
    refused = seen["workers"]["gpu_refused"]
    assert len(refused) == 1 and "SandboxUnavailable" in next(iter(refused.values())), refused


def test_node_killed_mid_batch_and_a_joined_node_completes_it(seen):
    batch, nodes = seen["node_loss"], seen["nodes"]
    assert seen["killed_while_done"] < len(batch)
    for s in batch:
        assert s["correct"] is True and not s["flags"] and not s["internal_error"], s
    rerun = [s for s in batch if s["timed_on"].get("lost_on")]
    assert rerun, batch   # the job in flight on the killed node ran again
    assert all(s["timed_on"]["node_id"] == nodes["timing2"] for s in rerun)
    assert all(lost["node_id"] == nodes["timing1"] for s in rerun for lost in s["timed_on"]["lost_on"])
    assert any(s["timed_on"]["node_id"] == nodes["timing2"] for s in batch)


def test_candidate_deadline_gives_evaluator_timeout(seen):
    s = seen["candidate_deadline"]
    assert s["runtime_error"].startswith("evaluator_timeout"), s
    where = s["evaluator_timeout"]
    assert where["deadline"] == "candidate" and where["stage"] == "gpu" and where["state"] == "running", where
    assert where["node_id"] == seen["nodes"]["timing2"] and where["seconds"] >= 6
    assert s["internal_error"] and s["correct"] is None


def test_batch_deadline_gives_evaluator_timeout(seen):
    for s in seen["batch_deadline"]:
        assert s["runtime_error"].startswith("evaluator_timeout"), s
        where = s["evaluator_timeout"]
        assert where["deadline"] == "batch" and where["stage"] in ("compile", "gpu"), where
        assert where["state"] in ("queued", "running"), where   # the workers of a new evaluator may still start
    assert any(s["evaluator_timeout"]["state"] == "queued" for s in seen["batch_deadline"])
