"""The Ray backend, the evaluator's side: pools that look like CompilePool and GpuPool to api.Evaluator.

RayCluster joins the cluster (EvalConfig.ray_address) and keeps, per kind of worker, a Dispatcher: it starts one actor
per GPU offered (resource cuda_eval_gpu, plus num_gpus=1 on CUDA) and one compile actor per node offering
cuda_eval_compile, pinned to their node; registers them (a node whose sandbox or judge cannot start is logged and takes
no work); looks for nodes that joined every few seconds; and hands queued jobs to registered actors with free
capacity (one GPU job per GPU at a time, `cuda_eval_compile` builds per compile node). Ray does the placement, the
transport and the failure detection:
- a job whose actor died (its node was lost, the process was killed) is run again on another worker, up to
  EvalConfig.ray_max_attempts runs; an actor of a node still alive is started again;
- a job on a worker longer than the candidate deadline gets EvaluatorTimeout (where it stopped); its worker stays busy
  until it answers (a hung worker gets no more work);
- a batch (one Evaluator.submit) past ray_batch_deadline_s: every verdict still out is evaluator_timeout.
A build's products travel as Ray objects from the compile node to the GPU node that runs it (never through this
process), with their sha256 checked there (actors.py). This process runs no evaluation: nodes without the resources
(the trainer's) get no worker.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
import types
from typing import Any, Callable

import ray

from cuda_eval.cluster import COMPILE_RESOURCE, GPU_RESOURCE, EvaluatorTimeout
from cuda_eval.cluster.actors import CompileWorker, GpuWorker, NodeSettings

log = logging.getLogger(__name__)
DISCOVER_EVERY_S = 2.0          # how often joined nodes are looked for
WAIT_POLL_S = 0.05              # the dispatcher's wait for answers (also how soon a new job is handed out)
STAGE_MARGIN_S = 120.0          # candidate deadline beyond a stage's own timeouts (ray_candidate_deadline_s = 0)
PRODUCT_REFS = 65536            # build products remembered (by spec hash) for the GPU jobs that name them


@dataclasses.dataclass
class _Slot:
    """A registered actor: `capacity` jobs at once."""
    key: str
    handle: Any
    node_id: str
    facts: dict
    capacity: int
    busy: int = 0
    alive: bool = True


@dataclasses.dataclass
class _Job:
    call: Callable               # (actor handle) -> ObjectRef answered by the actor (or a tuple: first is waited on)
    finish: Callable             # (value, slot, job) -> the future's result
    future: concurrent.futures.Future
    stage: str                   # "compile" | "gpu"
    deadline_s: float
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    attempts: int = 0
    lost_on: list = dataclasses.field(default_factory=list)
    slot: _Slot | None = None
    ref: Any = None
    extra: Any = None
    dispatched: float = 0.0
    recover: Callable | None = None   # (job) -> None: make a lost argument again, then requeue the job


class Dispatcher:
    """Jobs queued here run on the registered actors of one kind; see the module docstring."""

    def __init__(self, name: str, resource: str, make_actors: Callable[[dict], list], capacity: int,
                 max_attempts: int):
        self.name, self.resource, self._make_actors = name, resource, make_actors
        self.capacity, self.max_attempts = capacity, max_attempts
        self._lock = threading.RLock()
        self._queue: collections.deque[_Job] = collections.deque()
        self._slots: dict[str, _Slot] = {}
        self._registering: dict = {}          # register ref -> (key, handle, node_id)
        self._nodes: set[str] = set()         # nodes that have (or are starting) our actors
        self._refused: dict[str, str] = {}    # actor key -> why it takes no work
        self._inflight: dict = {}             # ref -> job
        self._zombies: dict = {}              # ref -> slot: jobs past their deadline still occupying their worker
        self._last_discover = 0.0
        self._closed = False
        self.registered = threading.Event()   # at least one actor took work
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"cuda_eval-ray-{name}")
        self._thread.start()

    # --- public -----------------------------------------------------------------------------------------------
    def submit(self, job: _Job) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError(f"the Ray {self.name} pool is closed")
        with self._lock:
            self._queue.append(job)
        return job.future

    def slots(self) -> list[dict]:
        with self._lock:
            return [dict(s.facts, busy=s.busy, capacity=s.capacity, alive=s.alive) for s in self._slots.values()]

    def refused(self) -> dict:
        with self._lock:
            return dict(self._refused)

    def where(self, future) -> dict | None:
        """Where the job of `future` is: queued (since), or on which worker (since)."""
        now = time.monotonic()
        with self._lock:
            jobs = [j for j in list(self._queue) + list(self._inflight.values()) if j.future is future]
        if not jobs:
            return None
        job = jobs[0]
        if job.slot is None:
            return {"stage": job.stage, "state": "queued", "seconds": round(now - job.submitted, 1),
                    "attempts": job.attempts, "lost_on": list(job.lost_on)}
        return {"stage": job.stage, "state": "running", "seconds": round(now - job.dispatched, 1),
                "attempts": job.attempts, "lost_on": list(job.lost_on), **_short(job.slot.facts)}

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=30)
        with self._lock:
            handles = [s.handle for s in self._slots.values()] + [h for _, h, _ in self._registering.values()]
            jobs = list(self._queue) + list(self._inflight.values())
            self._queue.clear()
            self._inflight.clear()
        for job in jobs:
            _fail(job.future, RuntimeError("the evaluator was closed"))
        for h in handles:
            try:
                ray.get(h.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - its node may be gone
                pass
            ray.kill(h)

    # --- the loop ---------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            if not ray.is_initialized():   # shut down under us: any Ray call would start a new one
                self._abort("Ray was shut down before the evaluator was closed")
                return
            try:
                self._step()
            except Exception:  # noqa: BLE001 - the loop must survive anything; the log says what
                log.exception("cuda_eval ray %s dispatcher", self.name)
                time.sleep(0.5)

    def _abort(self, why: str) -> None:
        with self._lock:
            jobs = list(self._queue) + list(self._inflight.values())
            self._queue.clear()
            self._inflight.clear()
        for job in jobs:
            _fail(job.future, RuntimeError(why))

    def _step(self) -> None:
        now = time.monotonic()
        if now - self._last_discover > DISCOVER_EVERY_S:
            self._last_discover = now
            self._discover()
        self._assign()
        refs = list(self._inflight) + list(self._registering) + list(self._zombies)
        if not refs:
            time.sleep(WAIT_POLL_S)
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=WAIT_POLL_S)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if ref in self._registering:
                self._registered(ref)
            elif ref in self._zombies:
                with self._lock:
                    slot = self._zombies.pop(ref)
                    slot.busy -= 1
            else:
                self._answered(ref)
        self._deadlines()

    def _discover(self) -> None:
        for node in ray.nodes():
            node_id = node.get("NodeID")
            if not node.get("Alive") or node_id in self._nodes or not node.get("Resources", {}).get(self.resource):
                continue
            self._nodes.add(node_id)
            for key, handle in self._make_actors(node):
                self._registering[handle.register.remote()] = (key, handle, node_id)

    def _registered(self, ref) -> None:
        key, handle, node_id = self._registering.pop(ref)
        try:
            facts = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - the actor died while starting (its node went away)
            facts = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        if not facts.get("ok"):
            why = str(facts.get("error"))
            log.warning("cuda_eval: the %s worker %s on node %s takes no work: %s", self.name, key, node_id, why)
            with self._lock:
                self._refused[key] = why
            ray.kill(handle)
            return
        facts = {k: v for k, v in facts.items() if k != "ok"}
        with self._lock:
            self._slots[key] = _Slot(key, handle, node_id, facts, self.capacity if self.capacity else
                                     int(facts.get("workers") or 1))
        log.info("cuda_eval: %s worker registered on %s", self.name, _short(facts))
        self.registered.set()

    def _assign(self) -> None:
        failed = []
        with self._lock:
            while self._queue:
                free = [s for s in self._slots.values() if s.alive and s.busy < s.capacity]
                if not free:
                    break
                slot = min(free, key=lambda s: s.busy / s.capacity)
                job = self._queue.popleft()
                if job.future.done():   # cancelled, or a deadline answered it
                    continue
                job.slot, job.attempts, job.dispatched = slot, job.attempts + 1, time.monotonic()
                try:
                    answer = job.call(slot.handle)
                except Exception as e:  # noqa: BLE001 - a bad argument: this job's failure alone
                    failed.append((job, e))
                    continue
                job.ref, job.extra = (answer[0], answer[1:]) if isinstance(answer, (list, tuple)) else (answer, ())
                slot.busy += 1
                self._inflight[job.ref] = job
        for job, e in failed:   # outside the lock: the future's callbacks may submit more work
            _fail(job.future, e)

    def _answered(self, ref) -> None:
        with self._lock:
            job = self._inflight.pop(ref)
            slot = job.slot
            slot.busy -= 1
        try:
            value = ray.get(ref)
        except (ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError) as e:
            # an argument (a build product) was lost with the node that made it: the worker is fine
            job.slot, job.ref = None, None
            if job.recover is not None and job.attempts < self.max_attempts:
                job.recover(job)
            else:
                _fail(job.future, RuntimeError(f"a build product of the {job.stage} stage was lost with its node: "
                                               f"{type(e).__name__}: {str(e)[:300]}"))
            return
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError) as e:
            self._lost(job, slot, e)
            return
        except ray.exceptions.RayTaskError as e:   # the actor raised: this job's failure
            _fail(job.future, e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e)
            return
        except Exception as e:  # noqa: BLE001
            _fail(job.future, e)
            return
        if job.future.done():
            return
        try:
            result = job.finish(value, slot, job)
        except Exception as e:  # noqa: BLE001
            _fail(job.future, e)
            return
        if not job.future.done():
            try:
                job.future.set_result(result)
            except concurrent.futures.InvalidStateError:   # cancelled meanwhile (a batch deadline)
                pass

    def _lost(self, job: _Job, slot: _Slot, error: Exception) -> None:
        """The job's worker died before answering: the worker is dropped (its node may get a new one at the next
        discovery) and the job runs again elsewhere, unless it ran out of attempts."""
        with self._lock:
            if slot.alive:
                slot.alive = False
                self._slots.pop(slot.key, None)
                self._nodes.discard(slot.node_id)
                log.warning("cuda_eval: the %s worker on %s died (%s): its jobs run elsewhere", self.name,
                            _short(slot.facts), type(error).__name__)
            job.lost_on.append(_short(slot.facts))
            job.slot, job.ref = None, None
            if job.future.done():
                return
            if job.attempts < self.max_attempts:
                self._queue.appendleft(job)
                return
        _fail(job.future, RuntimeError(f"the {job.stage} stage was lost with its worker {job.attempts} times "
                                       f"({job.lost_on}): {type(error).__name__}: {str(error)[:300]}"))

    def requeue(self, job: _Job) -> None:
        """A job back at the head of the queue (its inputs were made again)."""
        with self._lock:
            self._queue.appendleft(job)

    def _deadlines(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [(r, j) for r, j in self._inflight.items() if j.deadline_s and now - j.dispatched > j.deadline_s]
            for ref, job in late:
                self._inflight.pop(ref)
                self._zombies[ref] = job.slot
        for ref, job in late:
            where = {"stage": job.stage, "state": "running", "seconds": round(now - job.dispatched, 1),
                     "deadline": "candidate", "deadline_s": job.deadline_s, "attempts": job.attempts,
                     **_short(job.slot.facts)}
            _fail(job.future, EvaluatorTimeout(
                f"the {job.stage} stage ran {where['seconds']:.0f} s on {_describe(where)}, past the candidate "
                f"deadline of {job.deadline_s:.0f} s (EvalConfig.ray_candidate_deadline_s)", where))


def _short(facts: dict) -> dict:
    keys = ("node_id", "node_ip", "hostname", "gpu", "gpu_name")
    return {k: facts[k] for k in keys if k in facts}


def _describe(where: dict) -> str:
    node = f"node {where.get('hostname', '?')} ({where.get('node_ip', '?')}, {str(where.get('node_id', ''))[:12]})"
    return f"GPU {where['gpu']} of {node}" if where.get("stage") == "gpu" and "gpu" in where else node


def _fail(future: concurrent.futures.Future, error: BaseException) -> None:
    if not future.done():
        try:
            future.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass


class RayCompilePool:
    """CompilePool's face: submit(task_source, code) -> Future[CompileOutcome] (with .placement: its node)."""

    def __init__(self, cluster: "RayCluster", arch: str):
        """Compile workers for `arch`, one per node offering cuda_eval_compile."""
        self.cluster, self.arch = cluster, arch
        self.toolchain = None   # each GPU node uses its own for run-time builds (actors.GpuWorker)
        cache_dir = cluster.config.cache_dir or os.environ.get("CUDA_EVAL_CACHE_DIR", "/var/tmp/cuda_eval_cache")
        # the reference-timing cache stays with the evaluator (api.Evaluator reads config.resolved_cache_dir)
        self.config = types.SimpleNamespace(resolved_cache_dir=lambda: os.path.abspath(cache_dir))
        self.products: collections.OrderedDict = collections.OrderedDict()   # spec hash -> ObjectRef
        self._products_lock = threading.Lock()
        self.dispatcher = Dispatcher("compile", COMPILE_RESOURCE, self._make_actors, 0, cluster.config.ray_max_attempts)

    def _make_actors(self, node: dict) -> list:
        from cuda_eval.compile.pool import CompileConfig
        cfg = self.cluster.config
        workers = int(node["Resources"][COMPILE_RESOURCE])
        compile_config = CompileConfig(   # as api.Evaluator makes the local one, with this node's build slots
            workers=workers, arch=self.arch, cache_dir=cfg.cache_dir, cache_max_bytes=cfg.cache_max_bytes,
            record_timeout_s=cfg.record_timeout_s, compile_timeout_s=cfg.compile_timeout_s,
            max_log_chars=cfg.max_log_chars, parallel_phases=cfg.compile_parallel_phases)
        actor = ray.remote(CompileWorker).options(
            num_cpus=0, resources={COMPILE_RESOURCE: workers}, max_concurrency=workers + 2,
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(compile_config, self.cluster.node_settings, self.cluster.check_arch)
        return [(f"compile@{node['NodeID'][:12]}", actor)]

    def submit(self, task_source: str, code: str) -> concurrent.futures.Future:
        if not isinstance(task_source, str) or not isinstance(code, str):
            raise TypeError("task_source and code must be strings")

        def call(handle):
            return handle.compile.options(num_returns=2).remote(task_source, code)

        job = _Job(call, self._finish, concurrent.futures.Future(), "compile", self.cluster.compile_deadline_s)
        return self.dispatcher.submit(job)

    def _finish(self, value: dict, slot: _Slot, job: _Job):
        from cuda_eval.compile.pool import CompileOutcome
        from cuda_eval.protocol.extension_spec import BuiltModule
        data = dict(value)
        placement = {k: v for k, v in (data.pop("placement", None) or {}).items() if k != "toolchain"}
        placement.update(attempts=job.attempts, **({"lost_on": job.lost_on} if job.lost_on else {}))
        data["modules"] = [BuiltModule(**m) for m in data.get("modules") or []]
        outcome = CompileOutcome(**data)
        outcome.placement = placement
        products_ref = job.extra[0]
        with self._products_lock:
            for m in outcome.modules:
                self.products[m.spec_hash] = products_ref
                self.products.move_to_end(m.spec_hash)
            while len(self.products) > PRODUCT_REFS:
                self.products.popitem(last=False)
        return outcome

    def product_refs(self, modules: list) -> list:
        with self._products_lock:
            refs = []
            for m in modules:
                ref = self.products.get(m.get("spec_hash"))
                if ref is None:
                    raise RuntimeError(f"no build product is known for extension {m.get('name')!r}")
                if ref not in refs:
                    refs.append(ref)
            return refs

    def warm(self, extra_cflags: tuple = ()) -> bool:
        return False   # each compile node warms its own (EvalConfig.compile_pch_at_start)

    def close(self) -> None:
        self.dispatcher.close()


class RayGpuPool:
    """GpuPool's face: submit(payload, timeout_s) -> Future[WorkerOutcome] (with .placement: its node and GPU)."""

    def __init__(self, cluster: "RayCluster"):
        self.cluster = cluster
        self.dispatcher = cluster.gpu_dispatcher

    def submit(self, payload: dict, timeout_s: float) -> concurrent.futures.Future:
        compile_pool = self.cluster.compile

        def call(handle):
            refs = compile_pool.product_refs(payload.get("modules") or []) if compile_pool is not None else []
            return handle.run.remote(payload, float(timeout_s), *refs)

        deadline = self.cluster.config.ray_candidate_deadline_s or (
            timeout_s + self.cluster.config.worker_start_timeout_s + 60 + STAGE_MARGIN_S)
        job = _Job(call, self._finish, concurrent.futures.Future(), "gpu", deadline)
        if compile_pool is not None and payload.get("modules"):
            job.recover = lambda j: self._rebuild(j, payload)
        return self.dispatcher.submit(job)

    def _rebuild(self, job: _Job, payload: dict) -> None:
        """The products of a job were lost with the node that built them: build them again (same spec, same
        content address), then run the job."""
        def again(f: concurrent.futures.Future) -> None:
            error = f.exception()
            if error is None and f.result().ok:
                self.dispatcher.requeue(job)
            else:
                _fail(job.future, RuntimeError(f"the build products were lost with their node and could not be "
                                               f"built again: {error or f.result().log[:300]}"))
        self.cluster.compile.submit(payload["task_source"], payload["code"]).add_done_callback(again)

    @staticmethod
    def _finish(value: dict, slot: _Slot, job: _Job):
        from cuda_eval.orchestrator.gpu_pool import WorkerOutcome
        data = dict(value)
        placement = _short(data.pop("placement", None) or slot.facts)
        placement.update(attempts=job.attempts, **({"lost_on": job.lost_on} if job.lost_on else {}))
        outcome = WorkerOutcome(**data)
        outcome.device = f"{placement.get('hostname', '?')}:{placement.get('gpu', outcome.device)}"
        outcome.placement = placement
        return outcome

    def device_info(self, timeout_s: float | None = None) -> dict | None:
        if timeout_s:
            self.dispatcher.registered.wait(timeout_s)
        slots = self.dispatcher.slots()
        return {"gpu_name": slots[0].get("gpu_name"), "torch_version": slots[0].get("torch_version")} \
            if slots else None

    def share(self, device: str):
        import contextlib
        return contextlib.nullcontext()   # the pool's GPUs are never the caller's

    def close(self) -> None:
        pass   # the cluster closes the dispatcher (it outlives a pool built before the compile pool)


class RayCluster:
    """The evaluator's connection to the Ray cluster and its two kinds of workers."""

    def __init__(self, config, pool_config, check_arch: Callable | None = None):
        """`config`: the EvalConfig; `pool_config`: the PoolConfig each GPU worker runs (one device);
        `check_arch(arch)`: raises where a compile node's nvcc cannot build for the GPUs' arch."""
        self.config, self.pool_config, self.check_arch = config, pool_config, check_arch
        self.node_settings = NodeSettings(
            sandbox={"uid_range": config.sandbox_uids, "allow_unsandboxed": config.allow_unsandboxed},
            cache_dir=config.cache_dir, cache_max_bytes=config.cache_max_bytes, device_type=config.device_type,
            arch=config.arch, compile_timeout_s=config.compile_timeout_s, auto_spares=not config.spare_workers,
            pch_at_start=config.compile_pch_at_start)
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            ray.init(address=config.ray_address, namespace="cuda_eval", log_to_driver=False,
                     logging_level=logging.WARNING)
        self.compile: RayCompilePool | None = None
        self.compile_deadline_s = config.ray_candidate_deadline_s or (
            config.record_timeout_s + config.compile_timeout_s + STAGE_MARGIN_S)
        self.gpu_dispatcher = Dispatcher("gpu", GPU_RESOURCE, self._make_gpu_actors, 1, config.ray_max_attempts)
        self._watch_lock = threading.Lock()
        self._batches: list = []
        self._closed = False
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="cuda_eval-ray-deadlines")
        self._watcher.start()

    def _make_gpu_actors(self, node: dict) -> list:
        n = int(node["Resources"][GPU_RESOURCE])
        gpus = 1 if self.config.device_type == "cuda" else 0
        actors = []
        for i in range(n):
            actor = ray.remote(GpuWorker).options(
                num_cpus=0, num_gpus=gpus, resources={GPU_RESOURCE: 1}, max_concurrency=4,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node["NodeID"], soft=False),
            ).remote(self.pool_config, self.node_settings)
            actors.append((f"gpu{i}@{node['NodeID'][:12]}", actor))
        return actors

    # --- what api.Evaluator asks ------------------------------------------------------------------------------
    def device_slots(self) -> int:
        """Device slots the cluster offers now (joined nodes add theirs later)."""
        return int(sum(n.get("Resources", {}).get(GPU_RESOURCE, 0) for n in ray.nodes() if n.get("Alive")))

    def arch(self) -> str:
        """EvalConfig.arch, or the arch of the cluster's GPUs (waits for the first GPU worker to register)."""
        from cuda_eval.compile.toolchain import DEFAULT_ARCH, normalize_arch
        if self.config.arch != "auto":
            return normalize_arch(self.config.arch)
        if self.config.device_type != "cuda" or not self.device_slots():
            return DEFAULT_ARCH
        if not self.gpu_dispatcher.registered.wait(self.config.worker_start_timeout_s + 60):
            raise RuntimeError(f"no GPU worker of the Ray cluster registered within "
                               f"{self.config.worker_start_timeout_s + 60:.0f} s (refused: "
                               f"{self.gpu_dispatcher.refused() or 'none'}); or set EvalConfig.arch")
        archs = {s.get("arch") for s in self.gpu_dispatcher.slots() if s.get("arch")}
        if len(archs) > 1:
            raise ValueError(f"the Ray cluster's GPUs are of different architectures ({sorted(archs)}): one "
                             "evaluator builds for one; set EvalConfig.arch")
        return archs.pop() if archs else DEFAULT_ARCH

    def compile_pool(self, arch: str) -> RayCompilePool:
        self.compile = RayCompilePool(self, arch)
        return self.compile

    def gpu_pool(self) -> RayGpuPool:
        return RayGpuPool(self)

    def workers(self) -> dict:
        """The registered workers and those that refused, by kind (for tests, benchmarks and logs)."""
        return {"gpu": self.gpu_dispatcher.slots(), "gpu_refused": self.gpu_dispatcher.refused(),
                "compile": self.compile.dispatcher.slots() if self.compile else [],
                "compile_refused": self.compile.dispatcher.refused() if self.compile else {}}

    def where(self, future) -> dict | None:
        for d in (self.gpu_dispatcher, self.compile.dispatcher if self.compile else None):
            found = d.where(future) if d is not None else None
            if found:
                return found
        return None

    # --- the batch deadline ---------------------------------------------------------------------------------
    def watch_batch(self, evaluator, states: list) -> None:
        if self.config.ray_batch_deadline_s and states:
            with self._watch_lock:
                self._batches.append((time.monotonic() + self.config.ray_batch_deadline_s, evaluator, states))

    def _watch(self) -> None:
        while not self._closed:
            time.sleep(0.2)
            now = time.monotonic()
            with self._watch_lock:
                due = [b for b in self._batches if b[0] <= now]
                self._batches = [b for b in self._batches if b[0] > now and
                                 not all(s.future.done() for s in b[2])]
            for _, evaluator, states in due:
                for state in states:
                    if state.future.done():
                        continue
                    where = self.where(state.stage_future) or {"stage": "pipeline", "state": "between stages"}
                    where.update(deadline="batch", deadline_s=self.config.ray_batch_deadline_s)
                    text = (f"the batch deadline of {self.config.ray_batch_deadline_s:.0f} s "
                            f"(EvalConfig.ray_batch_deadline_s) passed while the {where['stage']} stage was "
                            + (f"queued for a worker for {where['seconds']:.0f} s" if where.get("state") == "queued"
                               else f"running on {_describe(where)} for {where.get('seconds', 0):.0f} s"
                               if where.get("state") == "running" else where["state"]))
                    try:
                        evaluator._evaluator_timeout(state, EvaluatorTimeout(text, where))
                    except Exception:  # noqa: BLE001 - the watcher must go on
                        log.exception("cuda_eval: batch deadline")
                    if state.stage_future is not None:
                        state.stage_future.cancel()   # a queued job is dropped; a running one's answer ignored

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.compile is not None:
            self.compile.close()
        self.gpu_dispatcher.close()
        self._watcher.join(timeout=5)
        if self._own_ray:
            ray.shutdown()
