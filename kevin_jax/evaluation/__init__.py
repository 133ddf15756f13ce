"""Held-out evaluation and test-time scaling (launch/eval.py).

metrics.py        Kevin's metrics and the unbiased best@k estimator (plain data in, plain data out)
report.py         console tables (rich), JSON, TensorBoard scalars, PNG plots, each task's best kernel profiled
external.py       responses produced elsewhere, evaluated like ours; prompts exported for other models
beam.py           test-time beam search over refinement turns (the environment's round loop, pruned between rounds)
policy_source.py  the policy to evaluate: a training checkpoint (params only, shapes checked) or the starting policy
pipeline.py       one evaluation start to finish
"""
