"""Two hosts: the pinned-host pools kevin_jax.placement sizes before JAX starts must hold what each GPU of a
multi-host run really keeps of the offloaded optimiser state. Two processes on this CPU (2 fake devices each)
joined by jax.distributed build the run's meshes (kevin_jax.multihost: one parameter replica per host, so the state
is split over one host's devices, not over all of them) and the offloaded state of the tiny model; each device's
pinned-host bytes must equal placement's model of a GPU's share for that run."""
import json
import os
import socket
import subprocess
import sys
import textwrap

from kevin_jax import placement
from kevin_jax.model import shapes

import trainer_fakes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    from flax import nnx
    from kevin_jax import multihost, parallel
    from kevin_jax.model import qwen2, shapes
    from kevin_jax.rl import state as rl_state

    port, pid = sys.argv[1], int(sys.argv[2])
    mesh_config = parallel.ParallelConfig(coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid)
    parallel.initialize_distributed(mesh_config)
    global_mesh, _ = multihost.build_meshes(mesh_config)
    options = qwen2.ModelOptions(dtype="bfloat16", param_dtype="float32", remat="none", attention="xla")
    _, params = nnx.split(qwen2.init_sharded(shapes.named_config("tiny"), options, global_mesh, seed=3))
    optim = rl_state.OptimConfig(offload="pinned_host", mu_dtype="bfloat16")
    tx = rl_state.make_optimizer(optim, 10)
    state = rl_state.init_state(params, tx, rl_state.host_offload(optim, 10, options.compute_dtype))
    per_device = {}
    for leaf in jax.tree.leaves(state):
        if leaf.sharding.memory_kind == "pinned_host":
            for shard in leaf.addressable_shards:
                per_device[str(shard.device)] = per_device.get(str(shard.device), 0) + shard.data.nbytes
    print("RESULT " + json.dumps({"mesh": dict(global_mesh.shape), "per_device": per_device}), flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_hosts_pools_hold_what_each_gpu_keeps_of_the_state():
    port = _free_port()
    env = trainer_fakes.driver_env(devices=2)
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(port), str(pid)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for pid in range(2)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            trainer_fakes.reap(p)
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    results = [json.loads(out.split("RESULT ", 1)[1].splitlines()[0]) for out in outputs]
    # the run's mesh: the data axis over the hosts, the parameters (and the state) split over one host's 2 devices
    assert results[0]["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
    # what placement sizes each GPU's pool for, in the same run (2 hosts of 2 GPUs, the mesh section's default)
    mesh = placement.ParallelConfig(num_processes=2)
    shards = placement.state_shards(mesh, 2, placement.process_count(mesh))
    modelled = sum(n for n, _ in placement.state_buffers(shapes.named_config("tiny"), shards, mu_bytes=2))
    kept = [n for r in results for n in r["per_device"].values()]
    assert len(kept) == 4 and set(kept) == {modelled}, (kept, modelled, shards)
