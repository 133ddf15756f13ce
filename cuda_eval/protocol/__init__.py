"""What both sides of a process boundary speak and run. The judge and the candidate's worker both import these
modules (channel and wire the pool too; the job settings and extension specs the trainer's process too).

Shared on purpose: the judge checks the worker by doing the same things itself (the task's inputs from the same
seeds, the same group of timed calls replayed with an empty forward, the same output digest), so both must run the
same code. In the judge this code is trusted; in the worker it runs beside the candidate, which may patch it, so
every message the judge receives is validated and every claim it depends on is checked again on its side.
"""
