"""Profile feedback (advisory: never a verdict or a score). kernel_profile.py is the plain data and the texts (the
trainer's process, the judge); kernel_profiler.py runs forwards under the CUDA profiler once a verdict is complete
(in the judge for the reference, in the candidate's worker for the candidate).
"""
