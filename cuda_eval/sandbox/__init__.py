"""Isolation of every process that runs foreign code (started from the trainer's process; trusted): the Python face
of the native runner (uids, limits, sessions, sweeps, disk quota), the staging of what a sandbox uid cannot read,
the directories we trust, memory cgroups. The C++ half is cuda_eval._native (native_src/).
"""
