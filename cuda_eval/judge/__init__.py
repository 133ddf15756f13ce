"""The judge (`python -m cuda_eval.judge`): the trusted half of a GPU evaluation, a long-lived process under a
sandbox uid no candidate ever gets. It runs our code and the task's reference, never the candidate's; it imports
nothing from worker/ (tests/test_architecture.py checks it), talks to the candidate's worker only through protocol/,
and treats every answer as untrusted.
"""
