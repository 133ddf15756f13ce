"""The compile stage (the trainer's process; trusted code): candidate programs in, prebuilt extension modules out.

The pool's threads run here; every compiler and the recorder run as sandboxed processes (sandbox/). The candidate's
own Python runs only in the recorder (worker/record.py), never in this package. The Builder also serves a
candidate's worker for a build reached only at run time: runtime_build.py, a process the worker starts (its narrow
entry, worker/runtime_build.py, imports none of this package), runs inside that worker's sandbox and builds for that
worker alone.
"""
