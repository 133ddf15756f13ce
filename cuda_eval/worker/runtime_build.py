"""A build reached only at run time (a load_inline call the recorder never saw, e.g. inside forward), in the
candidate's worker: the compile stage's cache when it holds the product (read only), else our Builder in the
worker's own directory, its compilers sandboxed inside the worker's sandbox. The product serves that worker alone.
"""
from __future__ import annotations

import os
import tempfile

from cuda_eval.compile.builder import BuildConfig, Builder, BuildError, BuildResult
from cuda_eval.compile.toolchain import Toolchain
from cuda_eval.protocol.extension_spec import ExtensionSpec


class RuntimeBuilder:
    """builder(spec) -> so_path for candidate.install_prebuilt in the GPU worker: a hit in the compile stage's cache
    (`cache_dir` as in CompileConfig; read only), else our build in a fresh dir under `work_dir` (never written into
    the cache: sandboxed processes only read it). Raises BuildError with the cleaned log if the build fails.

        install_prebuilt(modules, builder=RuntimeBuilder(cache_dir, work_dir, arch="sm_90"))
    """

    def __init__(self, cache_dir: str | None, work_dir: str, *, arch: str = "auto", timeout_s: float = 300.0,
                 toolchain: Toolchain | None = None,
                 config: BuildConfig = BuildConfig(use_pch=False, object_cache=False)):
        from cuda_eval.compile import toolchain as tcmod
        self.cache_dir, self.work_dir, self.timeout_s, self.config = cache_dir, work_dir, timeout_s, config
        self.toolchain = toolchain or tcmod.detect(arch, cache_dir=cache_dir)
        self.builds: list[BuildResult] = []

    def __call__(self, spec: ExtensionSpec) -> str:
        key = spec.content_hash(self.toolchain.ident())
        if self.cache_dir:
            so = os.path.join(self.cache_dir, "builds", "entries", key[:2], key, f"{spec.name}.so")
            if os.path.exists(so):
                return so
        os.makedirs(self.work_dir, exist_ok=True)
        builder = Builder(self.toolchain, None, config=self.config, work_root=self.work_dir)
        build_dir = tempfile.mkdtemp(prefix=f"rt-{spec.name}-", dir=self.work_dir)
        result = builder.build(spec, build_dir, self.timeout_s)
        self.builds.append(result)
        if not result.ok:
            raise BuildError(result)
        return result.so_path
