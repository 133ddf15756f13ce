"""Where candidate code runs (UNTRUSTED processes). Every module here is imported by a sandboxed process that executes
a candidate program: the candidate's worker (`python -m cuda_eval.worker`, __main__.py) and the compile stage's
recorder (`python -m cuda_eval.worker.record`). The candidate can patch anything in such a process, so nothing
computed here is trusted: what the verdict needs, the judge checks itself (outputs against its own reference, the
digests, the wall-clock bound of the time); the checks in dynamic_checks.py are a net, not a proof (docs/EVALUATOR.md,
"Trust boundary"). The trainer's process and the judge never import this package.
"""
