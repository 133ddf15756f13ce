"""A Ray cluster for cuda_eval on one machine, for as long as a command runs:

    python runs/ray_cluster.py --gpus 1,2,3 --cores-per-gpu 16 -- <command ...>

starts a head that offers no evaluation resources (the trainer's host: the command runs there, with RAY_ADDRESS
set) and one node per listed GPU (CUDA_VISIBLE_DEVICES=<gpu>, num_gpus=1, cuda_eval_gpu=1,
cuda_eval_compile=--cores-per-gpu), runs the command, and stops the cluster. With eval.backend="ray" the command's
Evaluator joins it ("auto"): its kernels are built and timed on those GPUs' nodes only. Several machines: start the
head and the nodes with `ray start` instead (README, "Evaluation on a cluster").
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys


def add_gpu_node(cluster, gpu: str, cores: int):
    """A node of `cluster` that gives evaluation GPU `gpu` and `cores` build slots. CUDA_VISIBLE_DEVICES is set for
    the node's processes and, while the node starts, in this process too: Ray reads the node's GPU ids from it."""
    with _visible(gpu):
        return cluster.add_node(num_cpus=cores, num_gpus=1, env_vars={"CUDA_VISIBLE_DEVICES": gpu},
                                resources={"cuda_eval_gpu": 1, "cuda_eval_compile": cores})


@contextlib.contextmanager
def _visible(gpu: str):
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", default="1,2,3", help="GPUs given to evaluation, one node each")
    p.add_argument("--cores-per-gpu", type=int, default=max(1, (os.cpu_count() or 4) // 4))
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given (after --)")
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0,
                                                             "include_dashboard": False})
    for gpu in [g.strip() for g in args.gpus.split(",") if g.strip()]:
        add_gpu_node(cluster, gpu, args.cores_per_gpu)
    cluster.wait_for_nodes()
    print(f"ray cluster at {cluster.address}: head (no evaluation) + GPUs {args.gpus}", flush=True)
    try:
        return subprocess.call(command, env=dict(os.environ, RAY_ADDRESS=cluster.address))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
