"""cuda_eval's workers on a Ray cluster (EvalConfig.backend = "ray"; docs/ARCHITECTURE.md, "Evaluation on a Ray
cluster"). Ray carries plain data between trusted processes of ours; every candidate still runs in the sandboxed
processes of gpu_pool and compile/ on the node that took the job.

    ray_pool.py   the evaluator's side: joins the cluster, starts and registers the workers, dispatches jobs,
                  deadlines, re-runs of the jobs of a worker that died
    actors.py     the workers' side (one Ray actor per GPU, one per compile node): today's GPU pool and compile pool,
                  build products shipped by content hash

Nothing here is imported by cuda_eval.api unless the Ray backend is chosen (importing api imports no ray).
"""
GPU_RESOURCE = "cuda_eval_gpu"          # a node offers one per GPU (or CPU-mode device slot) that evaluation may use
COMPILE_RESOURCE = "cuda_eval_compile"  # a node offers one per concurrent build
