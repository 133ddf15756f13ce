"""Isolation of every process that runs foreign code (started from the trusted side).

What every sandboxed process gets:
- its own session and process group, rlimits (`SandboxLimits`), a wall-clock timeout after which the whole group is
  killed, stdout/stderr captured up to a byte cap, stdin from a pipe (closed at once by run() unless given);
- an environment built from an allow-list (`DEFAULT_ENV_ALLOW`) plus HOME/TMPDIR = its work dir, the directory that
  holds this package on PYTHONPATH, and whatever the caller adds (`extra_env`);
- oom_score_adj 1000 (under host memory pressure the kernel kills it before the trainer) and, where the machine
  offers one, a memory cgroup of its own bounded like one of its processes (cgroups.py);
- a disk quota per session (`SandboxLimits.disk_bytes`): a watchdog thread adds up the session's work dir, the uid's
  files in the world-writable dirs, files its processes hold open after deleting them and its SysV shared memory,
  and kills the session's processes when the total passes the quota (the result then has disk_quota_exceeded=True).

Its identity (IdentityConfig, set by `configure()`; `isolation()` reports what is in force):
- as root ("dedicated"): a dedicated unprivileged uid/gid leased for the process' lifetime (a configurable range,
  60000-60999 by default, no /etc/passwd entry needed). Leases are flock'ed files in one root-owned directory for the
  whole machine (LEASE_DIR), so concurrent evaluators never share a uid, and a uid is leased only if the system's
  user database has no user or group with it and, the first time since boot, no process, file or IPC object uses
  it. RLIMIT_NPROC then holds (not for root: a fork bomb would take the machine down), the uid cannot write
  anywhere but its work dir and the world-writable dirs (`world_writable_dirs()`: /tmp, /var/tmp, /dev/shm,
  /run/lock, ... found at first use; swept of its files when its lease ends), "kill every process of this uid" also
  ends setsid'ed escapees, it gets an empty network namespace (no network, not even loopback) and an IPC namespace of
  its own (its SysV IPC and POSIX message queues die with it) when the kernel lets us create them (else message
  queues are refused to it and its IPC objects swept). What the uid cannot read (an interpreter under /root, a clone
  in a private folder with its .venv) is staged for it (sandbox/runtime.py). Fail closed: if a dedicated uid cannot be
  used, nothing runs (`SandboxUnavailable`); candidates never run as root;
- not root ("namespaces", where the kernel gives unprivileged processes user namespaces): our own uid, in new user,
  mount, PID, network and IPC namespaces: every mount read-only except its work dir, a /proc that shows its own
  processes only (ours, the trainer's included, can be neither seen nor signalled), a private /dev/shm, no network.
  It is PID 1 of its namespace, so everything it starts dies with it. It can still read what our uid can read;
- not root, without user namespaces: refused (`SandboxUnavailable`, saying what isolation would be lost) unless the
  user opts in (`allow_unsandboxed`, CUDA_EVAL_ALLOW_UNSANDBOXED=1): then our own uid, RLIMIT_NPROC = our current
  task count + `limits.processes`, and the candidate can read and write whatever we can, signal our processes, reach
  the network, and processes it setsid's away from its group are not swept. Sandboxes started from inside a
  sandboxed process (a worker's run-time build) run as that process, confined by the outer sandbox.

Files: runner.py (limits, sessions, processes: the face callers use), config.py (the identity settings, the uid
range, SandboxUnavailable), identity.py (who a process runs as; isolation()), leases.py (dedicated uids), probes.py
(what this machine allows), environment.py (env, work dir, staged paths), sweeps.py (what a uid leaves behind),
quota.py (the disk quota), runtime.py (staging what a uid cannot read), safe_dirs.py (directories we trust),
cgroups.py (memory cgroups). The C++ half is cuda_eval._native (native_src/).
"""
