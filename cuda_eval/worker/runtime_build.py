"""A build reached only at run time (a load_inline call the recorder never saw, e.g. inside forward), from the
candidate's worker: the worker's narrow entry to the build. It starts `python -m cuda_eval.compile.runtime_build`
(the compile stage's cache, else our Builder) as a child process inside the worker's own sandbox and reads back the
product's path; the worker imports nothing of the compile stage or the sandbox. The product serves that worker alone.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

import cuda_eval
from cuda_eval.protocol.extension_spec import ExtensionSpec

# What the child may take beyond the build's own deadline (its start-up, the cache lookup, its answer).
CHILD_SLACK_S = 60.0
# The child imports the same cuda_eval as this process (its directory first on the child's PYTHONPATH).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cuda_eval.__file__)))


class RuntimeBuildError(RuntimeError):
    """A run-time build failed: the message is the build's (the cleaned compiler log), as a load_inline call that
    failed to build would raise it."""


class RuntimeBuilder:
    """builder(spec) -> so_path for extension_loader.install_prebuilt in the GPU worker: a hit in the compile stage's
    cache (`cache_dir` as in CompileConfig; read only), else our build in a fresh dir under `work_dir`. `toolchain` is
    the compile stage's Toolchain as a dict and `path_map` where this sandbox uid reads its files (protocol.job.
    RuntimeBuild). Raises RuntimeBuildError if the build fails.

        install_prebuilt(modules, builder=RuntimeBuilder(cache_dir, work_dir, toolchain=runtime.toolchain))
    """

    def __init__(self, cache_dir: str | None, work_dir: str, *, toolchain: Mapping, timeout_s: float = 300.0,
                 path_map: Sequence[Sequence[str]] = ()):
        self.cache_dir, self.work_dir, self.timeout_s = cache_dir, work_dir, timeout_s
        self.toolchain, self.path_map = dict(toolchain), [list(e) for e in path_map]
        self.builds: list[dict] = []   # the summary of each build run (not of cache hits)

    def __call__(self, spec: ExtensionSpec) -> str:
        request = json.dumps({"spec": spec.to_dict(), "toolchain": self.toolchain, "cache_dir": self.cache_dir,
                              "work_dir": self.work_dir, "timeout_s": self.timeout_s, "path_map": self.path_map})
        os.makedirs(self.work_dir, exist_ok=True)
        path = [PACKAGE_PARENT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}
        # A session of its own, so that a child past its deadline is killed with its compilers.
        child = subprocess.Popen([sys.executable, "-m", "cuda_eval.compile.runtime_build"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.work_dir, env=env,
                                 start_new_session=True)
        try:
            out, err = child.communicate(request.encode(), timeout=self.timeout_s + CHILD_SLACK_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise RuntimeBuildError(f"Error building extension {spec.name!r}: the run-time build did not end within "
                                    f"{self.timeout_s + CHILD_SLACK_S:g} s") from None
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise
        try:
            answer = json.loads(out)
        except ValueError:
            raise RuntimeBuildError(f"Error building extension {spec.name!r}: the run-time build exited with "
                                    f"{child.returncode}: {err.decode(errors='replace')[-2000:]}") from None
        if answer.get("build"):
            self.builds.append(answer["build"])
        if "error" in answer:
            raise RuntimeBuildError(answer["error"])
        return answer["so_path"]
