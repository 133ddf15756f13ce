"""The Ray backend's workers, one process each on the node Ray placed them on (trusted: our code only).

GpuWorker: one per GPU (or CPU-mode device slot) a node offers (resource cuda_eval_gpu). It runs today's GpuPool for
its one device (a judge and pre-started candidate workers, every sandbox and trust property of the local backend),
installs the build products a job names into this node's build cache after checking their content hash, and answers
each job with the WorkerOutcome as plain data and where it ran.

CompileWorker: one per node offering cuda_eval_compile (CPU-only nodes too). It runs today's CompilePool and answers
each candidate with its CompileOutcome and the bytes of its build products with their sha256: the products are read
from our own build cache (what the compile stage copied out of the sandbox), never from anything a candidate wrote.

Registration (`register()`) makes the sandbox and starts the pools: a node where that fails says why and takes no
work.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import socket
import tempfile

from cuda_eval.protocol.job import RuntimeBuild

MAX_PRODUCT_BYTES = 1 << 30   # one build product shipped between nodes


class ProductError(RuntimeError):
    """A build product that cannot be installed where the job runs (missing, or its bytes fail their hash)."""


def node_facts() -> dict:
    """Which node this process is on, as the verdict's meta says it."""
    import ray
    return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname()}


def _sandbox_ready(sandbox_settings: dict) -> dict:
    """The sandbox of this node as the evaluator would make it ({uid_range, allow_unsandboxed}, from EvalConfig);
    raises SandboxUnavailable (with the fix) if it cannot be made."""
    from cuda_eval.sandbox import config as sandbox_config, identity as sandbox_identity
    sandbox_config.configure(**sandbox_settings)
    identity = sandbox_identity.identity_mode()
    iso = sandbox_identity.isolation()
    return {"identity": identity, "network": iso.get("network"), "memory_cgroup": iso.get("memory_cgroup")}


def _cache_dir(cache_dir: str) -> str:
    """EvalConfig.cache_dir, or this node's $CUDA_EVAL_CACHE_DIR / default."""
    from cuda_eval.compile.pool import default_cache_dir
    return os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """What a worker needs beside its pool's config (from EvalConfig, made by the evaluator)."""
    sandbox: dict                     # sandbox.configure's arguments
    cache_dir: str                    # "" = the node's $CUDA_EVAL_CACHE_DIR or default
    cache_max_bytes: int
    device_type: str
    arch: str                         # EvalConfig.arch ("auto": the node's GPU)
    compile_timeout_s: float          # run-time builds
    auto_spares: bool                 # EvalConfig.spare_workers = 0: spares from this node's cores
    pch_at_start: bool = False


class GpuWorker:
    def __init__(self, pool_config, settings: NodeSettings):
        self.pool_config, self.settings = pool_config, settings
        self.pool = None
        self.facts: dict = {}

    def register(self) -> dict:
        """{"ok": True, facts} once the sandbox is made and the judge of this device answered; else {"ok": False,
        "error"}: this worker then takes no work."""
        try:
            return self._register()
        except Exception as e:  # noqa: BLE001 - said at registration, never a job's verdict
            return {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000], **self.facts}

    def _register(self) -> dict:
        st = self.settings
        self.facts = node_facts()
        if st.device_type == "cuda":
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")   # Ray's choice for this actor (num_gpus=1)
            self.facts["gpu"] = visible.split(",")[0] if visible else "?"
            from cuda_eval.compile import toolchain as tcmod
            self.facts["arch"] = tcmod.gpu_arch()
        else:
            self.facts["gpu"] = f"cpu-slot-{os.getpid()}"
        self.facts["sandbox"] = _sandbox_ready(st.sandbox)
        from cuda_eval.compile.cache import BuildCache
        from cuda_eval.compile.pool import usable_cpus
        from cuda_eval.orchestrator.gpu_pool import GpuPool
        from cuda_eval.sandbox import safe_dirs
        cache_dir = safe_dirs.ensure_dir(_cache_dir(st.cache_dir), 0o755, what="the build cache dir",
                                         fix=safe_dirs.fix_hint("EvalConfig.cache_dir / $CUDA_EVAL_CACHE_DIR"))
        self.cache_dir = cache_dir
        self.cache = BuildCache(os.path.join(cache_dir, "builds"), st.cache_max_bytes)
        pool_config = self.pool_config
        if st.auto_spares:   # api.auto_spare_workers' rule for one device, on this node's cores
            pool_config = dataclasses.replace(pool_config, spares=max(2, min(8, usable_cpus() // 2)))
        self.pool = GpuPool(pool_config)
        info = self.pool.device_info(timeout_s=pool_config.start_timeout_s)
        if info is None:
            raise RuntimeError(f"the judge did not start within {pool_config.start_timeout_s:.0f} s")
        self.facts.update(gpu_name=info.get("gpu_name"), torch_version=info.get("torch_version"))
        self.runtime_build = self._runtime_build()
        return {"ok": True, **self.facts}

    def _runtime_build(self) -> dict | None:
        """This node's own toolchain for an extension reached only at run time (none where it has no compiler)."""
        from cuda_eval.compile import toolchain as tcmod
        st = self.settings
        if st.device_type != "cuda" or not self.facts.get("arch"):
            return None
        try:
            tc = tcmod.detect(st.arch if st.arch != "auto" else self.facts["arch"], cache_dir=self.cache_dir)
        except Exception:  # noqa: BLE001 - the prebuilt modules still run; a run-time build then fails clearly
            return None
        from cuda_eval.sandbox.runtime import staged_path_map
        return dataclasses.asdict(RuntimeBuild(toolchain=tc.to_dict(), cache_dir=self.cache_dir,
                                               timeout_s=st.compile_timeout_s, path_map=staged_path_map()))

    def run(self, payload: dict, timeout_s: float, *products: dict) -> dict:
        """One job of the GPU pool. `products`: the compile workers' {spec_hash: {name, sha256, data}}."""
        if self.pool is None:
            raise RuntimeError("GpuWorker.run before a successful register()")
        payload = dict(payload, modules=self._install(payload.get("modules") or [], products),
                       runtime_build=self.runtime_build)
        if isinstance(payload.get("config"), dict):   # the profiler's tools: this node's
            from cuda_eval.profile import kernel_profile
            payload["config"] = dict(payload["config"], profile_tools={"cuobjdump": kernel_profile.find_cuobjdump(
                (self.runtime_build or {}).get("toolchain", {}).get("cuda_home"))})
        outcome = self.pool.submit(payload, timeout_s).result()
        out = dataclasses.asdict(outcome)
        out["placement"] = dict(self.facts)
        return out

    def _install(self, modules: list, products: tuple) -> list:
        """Each module's product into this node's build cache (content-addressed by the compile stage's key), its
        bytes checked against the sha256 the compile worker computed; the module then names the local file."""
        shipped: dict = {}
        for p in products:
            shipped.update(p)
        out = []
        for m in modules:
            key = m.get("spec_hash")
            product = shipped.get(key)
            if product is None:
                raise ProductError(f"the build product of extension {m.get('name')!r} ({key}) was not shipped")
            data, name = product["data"], product["name"]
            if hashlib.sha256(data).hexdigest() != product["sha256"]:
                raise ProductError(f"the build product {name} ({key}) failed its sha256 check on this node")
            entry = self.cache.lookup(key, required=(name,))
            if entry is None:
                incoming = tempfile.mkdtemp(prefix="incoming-", dir=self.cache_dir)   # ours, 0700
                try:
                    path = os.path.join(incoming, name)
                    with open(path, "xb") as f:
                        f.write(data)
                    os.chmod(path, 0o755)
                    entry = self.cache.publish(key, {name: path}, dict(product.get("meta") or {}, shipped=True),
                                               move=True)
                finally:
                    shutil.rmtree(incoming, ignore_errors=True)
            out.append(dict(m, so_path=entry.file(name)))
        return out

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


class CompileWorker:
    def __init__(self, compile_config, settings: NodeSettings, check_arch=None):
        self.compile_config, self.settings, self.check_arch = compile_config, settings, check_arch
        self.pool = None
        self.facts: dict = {}

    def register(self) -> dict:
        try:
            return self._register()
        except Exception as e:  # noqa: BLE001 - said at registration
            return {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000], **self.facts}

    def _register(self) -> dict:
        self.facts = node_facts()
        self.facts["sandbox"] = _sandbox_ready(self.settings.sandbox)
        if self.check_arch is not None and self.settings.device_type == "cuda":
            self.check_arch(self.compile_config.arch)   # this node's nvcc builds for the GPUs' arch, or says so
        from cuda_eval.compile.pool import CompilePool
        config = dataclasses.replace(self.compile_config, cache_dir=_cache_dir(self.compile_config.cache_dir))
        self.pool = CompilePool(config)
        if self.settings.pch_at_start:
            for extra in ((), ("-O3",)):
                self.pool.warm(extra)
        self.facts["toolchain"] = self.pool.toolchain.summary()
        self.facts["workers"] = config.workers
        return {"ok": True, **self.facts}

    def compile(self, task_source: str, code: str) -> tuple[dict, dict]:
        """(CompileOutcome as plain data with this node's facts, {spec_hash: {name, sha256, data, meta}})."""
        if self.pool is None:
            raise RuntimeError("CompileWorker.compile before a successful register()")
        outcome = self.pool.compile(task_source, code)
        products = {}
        for m in outcome.modules:
            size = os.path.getsize(m.so_path)
            if size > MAX_PRODUCT_BYTES:
                raise ProductError(f"build product {m.so_path} is {size} bytes")
            with open(m.so_path, "rb") as f:   # our cache's file (copied out of the sandbox by the compile stage)
                data = f.read()
            products[m.spec_hash] = {"name": os.path.basename(m.so_path), "sha256": hashlib.sha256(data).hexdigest(),
                                     "data": data, "meta": {"name": m.name, "header_mode": m.header_mode,
                                                            "toolchain": outcome.toolchain}}
        out = outcome.to_dict()
        out["placement"] = {k: v for k, v in self.facts.items() if k != "toolchain"}
        return out, products

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
