"""cuda_eval's workers on a Ray cluster (EvalConfig.backend = "ray"; docs/ARCHITECTURE.md, "Evaluation on a Ray
cluster"). Ray carries plain data between trusted processes of ours; every candidate still runs in the sandboxed
processes of gpu_pool and compile/ on the node that took the job.

    ray_pool.py   the evaluator's side: joins the cluster, starts and registers the workers, dispatches jobs,
                  deadlines, re-runs of the jobs of a worker that died
    actors.py     the workers' side (one Ray actor per GPU, one per compile node): today's GPU pool and compile pool,
                  build products shipped by content hash

Only this file is imported by cuda_eval.api at start-up; ray_pool (and ray) only when the Ray backend is chosen. The
workers get their settings as plain dataclasses (PoolConfig, CompileConfig) built by the evaluator: nothing here
imports cuda_eval.api.
"""
GPU_RESOURCE = "cuda_eval_gpu"          # a node offers one per GPU (or CPU-mode device slot) that evaluation may use
COMPILE_RESOURCE = "cuda_eval_compile"  # a node offers one per concurrent build


class EvaluatorTimeout(RuntimeError):
    """A candidate outlived a deadline of the Ray backend (EvalConfig.ray_candidate_deadline_s, ray_batch_deadline_s):
    its verdict says evaluator_timeout and where it stopped (`where`: stage, node, GPU, seconds); it is not judged."""

    def __init__(self, message: str, where: dict):
        super().__init__(message)
        self.where = where
