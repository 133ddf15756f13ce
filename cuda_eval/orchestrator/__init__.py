"""The trainer's side of the evaluator (trusted; in the trainer's process, no torch): the pipeline that turns requests
into verdicts (evaluator.py), the facts about the GPUs it runs on (devices.py), the GPU pool that starts the judge
and worker processes (gpu_pool.py), the evaluation profiles, the reference-timing cache, the feedback text and the
host's memory as the OS reports it. Users reach it through cuda_eval.api.
"""
