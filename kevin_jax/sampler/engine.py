"""Continuous batching over a paged KV cache: the host-side scheduler around the jitted prefill and decode calls.

A `SamplerStream` decodes every request handed to it (`add`: a list of prompts with one seed, e.g. one pipeline
group's round) in one continuous batch; each `step`:
  1. admit waiting sequences, oldest request first, into free decode slots while KV pages last (sharing cached
     prompt-prefix pages),
  2. prefill their uncached prompt pieces (bucketed shapes, several sequences per call) and draw each first token,
  3. run one decode call: up to `decode_steps` steps on device for all slots, returning early once enough slots
     have finished while prompts wait,
  4. collect tokens, release finished sequences' pages (their slots are refilled by the next step), and return the
     requests whose sequences have all finished.
Requests may be added between steps, so a caller that has more work (the next round of a group whose verdicts are
in, another group's prompts) keeps the decode batch full instead of decoding a shrinking batch while one request's
longest response ends (kevin_jax.env.episode). `generate` is one request run to its end.
Pages are taken as sequences grow (one decode call ahead); if the pool runs dry the most recently admitted sequence
is preempted: its pages are released and it is re-admitted later by recomputing its cache (prompt pages usually
still cached). Per-sequence RNG keys (the request's seed, the sequence's index in its request, the token's index)
make the sampled tokens independent of all of this: of slots, decode calls and the other requests in the batch.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from kevin_jax.model import qwen2
from kevin_jax.sampler import kv_cache, layout, steps
from kevin_jax.sampler.config import SamplerConfig
from kevin_jax.sampler.pages import OutOfPages, PageAllocator, prefix_hashes

log = logging.getLogger(__name__)

# Prefill row lengths are rounded up to one of these (x 4 apart: few compiled shapes, at most 4x padding).
_PREFILL_BUCKET_BASE = 16

# (seq index, generated tokens so far, tokens added by the last decode call) -> tokens to keep, or None to go on.
StopCheck = Callable[[int, list[int], int], "int | None"]


@dataclasses.dataclass
class SampleResult:
    """One generated sequence. See kevin_jax.sampler.sampling for what the two log-prob lists are."""
    tokens: list[int]
    logprobs: list[float]
    policy_logprobs: list[float]
    stop_reason: str            # "eos" | "stop" | "length"
    prompt_len: int


@dataclasses.dataclass
class GenerateStats:
    sequences: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0          # prompt tokens actually computed (the rest came from shared pages)
    reused_prefix_tokens: int = 0
    generated_tokens: int = 0
    prefill_calls: int = 0
    decode_calls: int = 0
    decode_steps: int = 0
    slot_steps_active: int = 0       # sum over decode steps of the slots doing useful work
    slot_steps_total: int = 0        # sum over decode steps of max_slots
    kv_tokens_read: int = 0          # sum over decode steps and slots of the live cache tokens attended to
    live_per_step: list[int] = dataclasses.field(default_factory=list, repr=False)  # slots decoding, each step
    preemptions: int = 0
    peak_pages_in_use: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0

    @property
    def slot_occupancy(self) -> float:
        return self.slot_steps_active / max(1, self.slot_steps_total)


@dataclasses.dataclass(eq=False)
class _Sequence:
    index: int                       # unique in its stream (host bookkeeping)
    prompt: np.ndarray
    max_new: int
    seed: int = 0                    # its request's seed and its index there: its RNG (sampling.token_keys)
    rng_id: int = 0
    request: "StreamRequest | None" = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    policy_logprobs: list[float] = dataclasses.field(default_factory=list)
    reason: str | None = None
    pages: list[int] = dataclasses.field(default_factory=list)
    cached_tokens: int = 0           # context tokens whose KV came from shared pages at admission
    phase: int = 1
    slot: int | None = None
    admitted_at: int = 0

    def context(self) -> np.ndarray:
        """Tokens that must be in the cache before decoding continues (the last sampled token is fed, not cached)."""
        if not self.tokens:
            return self.prompt
        return np.concatenate([self.prompt, np.asarray(self.tokens[:-1], np.int32)])

    @property
    def max_cache(self) -> int:
        """Most tokens this sequence ever holds in the cache."""
        return len(self.prompt) + self.max_new - 1


class SamplerEngine:
    """Batched generation for one model graph. Parameters are passed to each `generate` (no copy is made)."""

    def __init__(self, model: qwen2.Qwen2ForCausalLM, config: SamplerConfig, *, mesh=None,
                 stop_ids: Sequence[int] | None = None,
                 device_guard: Callable[[], contextlib.AbstractContextManager] | None = None):
        """mesh: the devices to sample on (default: the mesh of the model's parameters, or none for one device). The
        engine runs on a mesh of its own over them (kevin_jax.sampler.layout: tensor parallelism over
        sampler.tensor_parallel devices, replicas over the rest) and copies the parameters into that layout at each
        generate call. device_guard: entered around each device call (a prefill, a decode call) until its results
        are on the host; on a GPU shared with cuda_eval it is the evaluator's device_share, so that kernel timing
        never overlaps sampling."""
        self.config = config
        self.device_guard = device_guard or contextlib.nullcontext
        self.model_config = model.config
        self.options = model.options
        self.graphdef = nnx.split(model)[0]
        self.param_mesh = mesh if mesh is not None else mesh_of(model)
        self.mesh = layout.sampling_mesh(self.param_mesh, model.config, config.tensor_parallel)
        mesh = self.mesh
        self.vocab_size = model.config.vocab_size
        self.stop_ids = tuple(int(i) for i in (config.stop_ids if stop_ids is None else stop_ids))
        for token in self.stop_ids + tuple(t for s in config.stop_sequences for t in s):
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"stop token id {token} is outside the vocabulary [0, {self.vocab_size})")
        self.dtype = model.options.compute_dtype
        # Where decode runs: the mesh's devices (tests put CPU meshes next to a GPU), else the default backend.
        devices = list(mesh.devices.flat) if mesh is not None else (
            list(self.param_mesh.devices.flat) if self.param_mesh is not None else jax.local_devices()[:1])
        self.platform = devices[0].platform
        self.tensor_axis = kv_cache.tensor_axis_for(mesh, model.config.num_key_value_heads)
        self.tensor_parts = mesh.shape[self.tensor_axis] if self.tensor_axis else 1

        page = config.page_size
        probe = kv_cache.make_geometry(model.config, pages_per_layer=2, page_size=page, max_seq_len=config.max_seq_len)
        self.weight_copy_bytes = self._weight_copy_bytes(model)
        limits = [kv_cache.memory_limits(d) for d in devices]
        known = [limit for limit, _ in limits if limit]
        self.pool_plan = kv_cache.plan_pool(
            worst_case_tokens=config.max_slots * config.max_seq_len, page_size=page,
            page_bytes_per_device=probe.bytes_per_token(self.dtype) * page // self.tensor_parts,
            num_pages=config.num_pages, kv_cache_gb=config.kv_cache_gb, fraction=config.kv_cache_fraction,
            limit_bytes=min(known) if known else None, in_use_bytes=max(used for _, used in limits),
            weight_copy_bytes=self.weight_copy_bytes,
            workspace=kv_cache.workspace_bytes(model.config, prefill_tokens=config.prefill_tokens,
                                               slots=config.max_slots, tensor=self.tensor_parts))
        pages = self.pool_plan.pages_per_layer
        self.geometry = kv_cache.make_geometry(model.config, pages_per_layer=pages, page_size=page,
                                               max_seq_len=config.max_seq_len)
        if pages - 1 < kv_cache.pages_for(config.max_seq_len, page):
            raise ValueError(f"KV pool of {pages - 1} usable pages x {page} tokens cannot hold one sequence of "
                             f"max_seq_len={config.max_seq_len}; raise num_pages / kv_cache_gb / kv_cache_fraction "
                             f"or lower max_seq_len ({self.pool_plan.rule})")
        self.pallas_params = kv_cache.pallas_params(
            self.geometry, interpret=self.platform != "gpu", block_tokens=config.attention_block_tokens,
            split_tokens=config.attention_split_tokens, warps=config.attention_warps, stages=config.attention_stages)
        self.decode_impl, self.decode_impl_reason = self._pick_decode_impl()
        self.recent_width = max([1] + [len(s) for s in config.stop_sequences])
        settings = steps.StepSettings(
            geometry=self.geometry, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
            stop_ids=self.stop_ids, stop_patterns=steps.stop_patterns(config.stop_sequences, self.recent_width),
            decode_impl=self.decode_impl, pallas=self.pallas_params if self.decode_impl == "pallas" else None,
            layer_unroll=config.layer_unroll, decode_steps=config.decode_steps, layer_loop=config.layer_loop)
        self.functions = steps.step_functions(model, settings, mesh, self.tensor_axis)
        self._pool: kv_cache.KVPool | None = None
        log.info("sampler: %s; %s", self.pool_plan.describe(config.max_slots, config.max_seq_len,
                                                           layout.describe(mesh)), self.describe_weights())
        log.info("sampler: decode attention %s (%s), layers %s", self.decode_impl, self.decode_impl_reason,
                 config.layer_loop)

    def _weight_copy_bytes(self, model) -> int:
        """Device bytes of the weight copy each generate call makes (0 when the scan reads the parameters)."""
        if self.config.layer_loop == "scan":
            weights = layout.extract(model, copy=False, unrolled=False)
            if self.mesh is None or layout.has_layout(
                    weights, layout.weight_shardings(jax.eval_shape(lambda w: w, weights), self.mesh)):
                return 0
        return layout.copy_bytes_per_device(model.config, self.dtype, self.tensor_parts)

    def describe_weights(self) -> str:
        if not self.weight_copy_bytes:
            return "weights read in place (layer_loop=scan, parameters already in the sampling layout)"
        return (f"weight copy per generate call: {self.weight_copy_bytes / 1e9:.2f} GB per device "
                f"({layout.describe(self.mesh)}, {np.dtype(self.dtype).name})")

    # ------------------------------------------------------------------ set-up
    def _pick_decode_impl(self) -> tuple[str, str]:
        choice = self.config.attention
        if choice == "xla":
            return "xla", "configured"
        if choice == "pallas":
            return "pallas", "configured" + ("" if self.platform == "gpu" else " (interpret mode)")
        if self.platform != "gpu":
            return "xla", f"auto: decode runs on {self.platform}, the Pallas kernel needs a GPU"
        ok, reason = kv_cache.pallas_available(self.geometry, self.dtype, self.pallas_params)
        if not ok:
            log.warning("Pallas paged attention unusable here (%s); decoding with the pure-JAX attention", reason)
        return ("pallas", "auto: kernel compiled") if ok else ("xla", f"auto: {reason}")

    def pool(self) -> kv_cache.KVPool:
        if self._pool is None:
            self._pool = kv_cache.init_pool(self.geometry, self.dtype,
                                            layout.sharding_of_pool(self.mesh, self.tensor_axis))
        return self._pool

    def weights(self, params) -> steps.SamplerWeights:
        """What prefill and decode read, from the model's parameters: the copy in the sampling layout, or (scan, when
        the parameters already have that layout) the parameters themselves."""
        if self.config.layer_loop == "scan":
            view = self.functions.view(params)
            if view is not None:
                return view
        return self.functions.prepare(params)

    def release_memory(self) -> None:
        """Drops the KV pool (e.g. before a training step needs the memory); the next generate re-creates it."""
        self._pool = None

    # ------------------------------------------------------------------ validation
    def _sequences(self, prompts, max_new_tokens, seed: int = 0, first_index: int = 0) -> list[_Sequence]:
        count = len(prompts)
        if isinstance(max_new_tokens, (int, np.integer)):
            limits = [int(max_new_tokens)] * count
        else:
            limits = [int(m) for m in max_new_tokens]
            if len(limits) != count:
                raise ValueError(f"max_new_tokens has {len(limits)} entries for {count} prompts")
        max_len = self.config.max_seq_len
        sequences = []
        for i, (prompt, limit) in enumerate(zip(prompts, limits)):
            ids = np.asarray(list(prompt), dtype=np.int64)
            if ids.size == 0:
                raise ValueError(f"prompt {i} is empty: generation needs at least one prompt token")
            if ids.ndim != 1:
                raise ValueError(f"prompt {i} must be a flat sequence of token ids")
            bad = (ids < 0) | (ids >= self.vocab_size)
            if bad.any():
                raise ValueError(f"prompt {i} holds token id {int(ids[bad][0])} outside the vocabulary "
                                 f"[0, {self.vocab_size})")
            if limit <= 0:
                raise ValueError(f"max_new_tokens must be positive, got {limit} for prompt {i}")
            if len(ids) >= max_len:
                raise ValueError(f"prompt {i} has {len(ids)} tokens but the context is sampler.max_seq_len="
                                 f"{max_len}: no room to generate (shorten the prompt or raise max_seq_len)")
            sequences.append(_Sequence(index=first_index + i, prompt=ids.astype(np.int32),
                                       max_new=min(limit, max_len - len(ids)), seed=int(seed) & 0xFFFFFFFF, rng_id=i))
        return sequences

    # ------------------------------------------------------------------ generate
    def generate(self, params, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], seed: int, *,
                 stop_check: StopCheck | None = None) -> tuple[list[SampleResult], GenerateStats]:
        """Samples a continuation of every prompt. `params` is the model's nnx.State (any sharding)."""
        start = time.perf_counter()
        stream = self.stream(params, stop_check=stop_check)
        try:
            request = stream.add(prompts, max_new_tokens, seed)
            while stream.busy:
                stream.step()
        finally:
            stream.close()
        stream.stats.total_s = time.perf_counter() - start
        return request.results(), stream.stats

    def stream(self, params, *, stop_check: StopCheck | None = None) -> "SamplerStream":
        """A continuous batch that requests can join between decode calls (SamplerStream)."""
        return SamplerStream(self, params, stop_check)


@dataclasses.dataclass(eq=False)
class StreamRequest:
    """One `SamplerStream.add`: its prompts' sequences, done when every one has finished."""
    owner: Any
    sequences: list[_Sequence]
    remaining: int

    @property
    def done(self) -> bool:
        return self.remaining == 0

    def results(self) -> list[SampleResult]:
        if not self.done:
            raise RuntimeError(f"{self.remaining} of the request's {len(self.sequences)} sequences are still running")
        return [SampleResult(s.tokens, s.logprobs, s.policy_logprobs, s.reason, len(s.prompt)) for s in self.sequences]


class SamplerStream:
    """Requests decoded together in one continuous batch (see the module docstring). One thread drives it: `add`
    requests, call `step` while `busy`; each step returns the requests it completed, oldest first. The weight copy
    in the sampling layout is made when work arrives and dropped whenever the stream runs dry (as between generate
    calls); the KV pool is the engine's. Statistics accumulate in `stats`."""

    def __init__(self, engine: SamplerEngine, params, stop_check: StopCheck | None = None):
        self.engine = engine
        self.params = params
        self.stats = GenerateStats()
        self._run = _Run(engine, stop_check, self.stats)
        self._pending: list[StreamRequest] = []      # added, not yet returned by step
        self._next_index = 0

    def add(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], seed: int,
            owner: Any = None) -> StreamRequest:
        """Queues the prompts (checked first: a bad prompt raises and queues nothing) behind the earlier requests."""
        sequences = self.engine._sequences(prompts, max_new_tokens, seed, self._next_index)
        self._next_index += len(sequences)
        request = StreamRequest(owner, sequences, len(sequences))
        for seq in sequences:
            seq.request = request
        self.stats.sequences += len(sequences)
        self.stats.prompt_tokens += sum(len(s.prompt) for s in sequences)
        self._run.waiting.extend(sequences)
        self._pending.append(request)
        return request

    @property
    def busy(self) -> bool:
        """Requests added and not yet returned by `step`."""
        return bool(self._pending)

    @property
    def live(self) -> int:
        """Sequences in decode slots now."""
        return int(self._run.state.active.sum())

    def step(self) -> list[StreamRequest]:
        """One admission (with its prefill) and one decode call; the requests now complete, in the order added."""
        run = self._run
        start = time.perf_counter()
        if run.waiting or run.state.active.any():
            if run.weights is None:
                # The copy in the sampling layout (tensor-parallel, compute dtype), held while there is work.
                run.weights = self.engine.weights(self.params)
            pool, self.engine._pool = self.engine.pool(), None     # donated through the calls
            self.engine._pool = run.step(pool)
            if not (run.waiting or run.state.active.any()):
                run.weights = None
        self.stats.total_s += time.perf_counter() - start
        done = [r for r in self._pending if r.done]
        self._pending = [r for r in self._pending if not r.done]
        return done

    def close(self) -> None:
        """Drops the weight copy and whatever was still queued or decoding."""
        run = self._run
        for seq in [s for s in run.slots if s is not None]:
            run.allocator.release(seq.pages)
            seq.pages = []
        run.slots = [None] * len(run.slots)
        run.state.active[:] = False
        run.waiting.clear()
        run.weights = None
        self._pending = []


class _Run:
    """The state of one stream (host mirror of the slots, page allocator, queue of waiting sequences)."""

    def __init__(self, engine: SamplerEngine, stop_check: StopCheck | None, stats: GenerateStats):
        self.engine = engine
        self.config = engine.config
        self.weights: steps.SamplerWeights | None = None
        self.stop_check = stop_check
        self.stats = stats
        self.page = engine.geometry.page_size
        self.allocator = PageAllocator(engine.geometry.pages_per_layer, self.page, self.config.prefix_sharing)
        slots, width, recent = self.config.max_slots, engine.geometry.table_width, engine.recent_width
        self.slots: list[_Sequence | None] = [None] * slots
        self.state = steps.SlotState(
            last_token=np.zeros(slots, np.int32), cache_len=np.zeros(slots, np.int32),
            gen_count=np.zeros(slots, np.int32), max_new=np.ones(slots, np.int32), active=np.zeros(slots, bool),
            sequence_ids=np.zeros(slots, np.int32), tables=np.zeros((slots, width), np.int32),
            recent=np.full((slots, recent), -1, np.int32))
        self.seeds = np.zeros(slots, np.uint32)          # each slot's request seed (not part of the device state)
        self.waiting: collections.deque[_Sequence] = collections.deque()
        self.admissions = 0

    # ------------------------------------------------------------------ main loop
    def step(self, pool):
        """Admits and prefills what fits, then one decode call (none when no slot is live)."""
        admitted = self._admit()
        if admitted:
            with self.engine.device_guard():
                pool = self._prefill(pool, admitted)
                if self.engine.device_guard is not contextlib.nullcontext:
                    jax.block_until_ready(pool)   # its work is done before the GPU is handed back
        if not self.state.active.any():
            if self.waiting and not admitted:
                raise RuntimeError("sampler made no progress: the KV pool cannot admit the next prompt")
            return pool
        self._grow_pages()
        with self.engine.device_guard():   # _decode reads its outputs back: the call is over when it returns
            pool = self._decode(pool)
        return pool

    # ------------------------------------------------------------------ admission
    def _growth_pages(self, seq: _Sequence, cache_len: int) -> int:
        want = min(cache_len + self.config.decode_steps, seq.max_cache)
        return max(0, kv_cache.pages_for(want, self.page) - len(seq.pages))

    def _admit(self) -> list[_Sequence]:
        alloc = self.allocator
        alloc.start_round()
        reserve = sum(self._growth_pages(s, int(self.state.cache_len[s.slot])) for s in self.slots if s is not None)
        admitted = []
        for slot, occupant in enumerate(self.slots):
            if occupant is not None:
                continue
            if not self.waiting:
                break
            seq = self.waiting[0]
            context = seq.context()
            n = len(context)
            full = prefix_hashes(context, self.page, n // self.page)
            matched = alloc.lookup(full[:(n - 1) // self.page])       # share so that >= 1 token is left to compute
            new_pages = kv_cache.pages_for(n, self.page) - len(matched)
            growth = max(0, kv_cache.pages_for(min(n + self.config.decode_steps, seq.max_cache), self.page)
                         - kv_cache.pages_for(n, self.page))
            if alloc.cost(matched, new_pages) + growth > alloc.available - reserve:
                break
            self.waiting.popleft()
            alloc.share(matched)
            seq.pages = matched + alloc.allocate(new_pages)
            seq.cached_tokens = len(matched) * self.page
            seq.phase = 1 + max([alloc.ready_phase(p) for p in matched], default=0)
            for i in range(len(matched), len(full)):
                alloc.register(seq.pages[i], full[i], seq.phase)
            seq.slot = slot
            seq.admitted_at = self.admissions
            self.admissions += 1
            self.slots[slot] = seq
            reserve += growth
            admitted.append(seq)
        return admitted

    # ------------------------------------------------------------------ prefill
    def _bucket(self, length: int) -> int:
        bucket = _PREFILL_BUCKET_BASE
        while bucket < length:
            bucket *= 4
        return min(bucket, self.config.prefill_chunk)

    def _prefill(self, pool, admitted: list[_Sequence]):
        start = time.perf_counter()
        chunk = self.config.prefill_chunk
        # Pieces of one sequence go in successive calls; a phase reads pages written by earlier phases.
        groups: dict[tuple[int, int], list[tuple[_Sequence, int, int]]] = collections.defaultdict(list)
        contexts = {}
        for seq in admitted:
            context = seq.context()
            contexts[seq.index] = context
            self.stats.reused_prefix_tokens += seq.cached_tokens
            self.stats.prefill_tokens += len(context) - seq.cached_tokens
            for piece, a in enumerate(range(seq.cached_tokens, len(context), chunk)):
                groups[(seq.phase, piece)].append((seq, a, min(a + chunk, len(context))))
        drawn = []
        for key in sorted(groups):
            rows = sorted(groups[key], key=lambda r: r[2] - r[1])
            by_bucket = collections.defaultdict(list)
            for row in rows:
                by_bucket[self._bucket(row[2] - row[1])].append(row)
            for width, bucket_rows in sorted(by_bucket.items()):
                per_call = max(1, self.config.prefill_tokens // width)
                for i in range(0, len(bucket_rows), per_call):
                    part = bucket_rows[i:i + per_call]
                    # Rows rounded up to a power of two, not always per_call: a refill of a few sequences (often
                    # one partial page each, the rest shared) must not pay attention over per_call padded rows.
                    rows = min(per_call, 1 << (len(part) - 1).bit_length())
                    batch = self._prefill_batch(part, contexts, width, rows)
                    seeds = np.zeros(rows, np.uint32)
                    seeds[:len(part)] = [seq.seed for seq, _, _ in part]
                    pool, sample, reasons = self.engine.functions.prefill(self.weights, pool, batch, seeds)
                    self.stats.prefill_calls += 1
                    drawn.append((part, sample, reasons))
        for part, sample, reasons in drawn:
            tokens, logprobs, policy = (np.asarray(x) for x in sample)
            reasons = np.asarray(reasons)
            for r, (seq, _, end) in enumerate(part):
                if end < len(contexts[seq.index]):
                    continue
                if not seq.tokens:                                     # fresh: the prefill drew the first token
                    self.stats.generated_tokens += 1
                    seq.tokens.append(int(tokens[r]))
                    seq.logprobs.append(float(logprobs[r]))
                    seq.policy_logprobs.append(float(policy[r]))
                    if self.stop_check is not None and self.stop_check(seq.index, seq.tokens, 1) is not None:
                        self._finish(seq, "stop")
                        continue
                    if reasons[r] != steps.RUNNING:
                        self._finish(seq, steps.REASON_NAMES[int(reasons[r])])
                        continue
                self._activate(seq, len(contexts[seq.index]))
        self.stats.prefill_s += time.perf_counter() - start
        self.stats.peak_pages_in_use = max(self.stats.peak_pages_in_use, self.allocator.in_use)
        return pool

    def _prefill_batch(self, rows, contexts, width: int, num_rows: int) -> steps.PrefillBatch:
        table_width, recent_width = self.engine.geometry.table_width, self.engine.recent_width
        tokens = np.zeros((num_rows, width), np.int32)
        positions = np.tile(np.arange(width, dtype=np.int32), (num_rows, 1))
        valid = np.zeros((num_rows, width), bool)
        tables = np.zeros((num_rows, table_width), np.int32)
        kv_lengths = np.zeros(num_rows, np.int32)
        last_index = np.zeros(num_rows, np.int32)
        sample_row = np.zeros(num_rows, bool)
        sequence_ids = np.zeros(num_rows, np.int32)
        gen_index = np.zeros(num_rows, np.int32)
        max_new = np.ones(num_rows, np.int32)
        recent = np.full((num_rows, recent_width), -1, np.int32)
        for r, (seq, a, b) in enumerate(rows):
            context = contexts[seq.index]
            tokens[r, :b - a] = context[a:b]
            positions[r] += a
            valid[r, :b - a] = True
            tables[r, :len(seq.pages)] = seq.pages
            kv_lengths[r] = b
            last_index[r] = b - a - 1
            sample_row[r] = b == len(context) and not seq.tokens
            sequence_ids[r] = seq.rng_id
            gen_index[r] = len(seq.tokens)
            max_new[r] = seq.max_new
        return steps.PrefillBatch(tokens, positions, valid, tables, kv_lengths, last_index, sample_row,
                                  sequence_ids, gen_index, max_new, recent)

    def _activate(self, seq: _Sequence, cache_len: int) -> None:
        s, slot = self.state, seq.slot
        s.last_token[slot] = seq.tokens[-1]
        s.cache_len[slot] = cache_len
        s.gen_count[slot] = len(seq.tokens)
        s.max_new[slot] = seq.max_new
        s.active[slot] = True
        s.sequence_ids[slot] = seq.rng_id
        self.seeds[slot] = seq.seed
        s.tables[slot] = 0
        s.tables[slot, :len(seq.pages)] = seq.pages
        s.recent[slot] = -1
        tail = seq.tokens[-self.engine.recent_width:]
        s.recent[slot, len(s.recent[slot]) - len(tail):] = tail

    def _finish(self, seq: _Sequence, reason: str) -> None:
        seq.reason = reason
        if seq.request is not None:
            seq.request.remaining -= 1
        self.allocator.release(seq.pages)
        seq.pages = []
        if seq.slot is not None:
            self.state.active[seq.slot] = False
            self.state.tables[seq.slot] = 0
            self.slots[seq.slot] = None
            seq.slot = None

    # ------------------------------------------------------------------ decode
    def _grow_pages(self) -> None:
        running = sorted((s for s in self.slots if s is not None), key=lambda s: s.admitted_at)
        for seq in running:
            if seq.slot is None:                                   # preempted below
                continue
            need = self._growth_pages(seq, int(self.state.cache_len[seq.slot]))
            while need > self.allocator.available:
                victims = [s for s in self.slots if s is not None and s is not seq]
                if not victims:
                    raise OutOfPages(f"one sequence needs {need} more KV pages but the pool has "
                                     f"{self.allocator.available} left (raise sampler.num_pages)")
                self._preempt(max(victims, key=lambda s: s.admitted_at))
            if need:
                old = len(seq.pages)
                seq.pages += self.allocator.allocate(need)
                self.state.tables[seq.slot, old:len(seq.pages)] = seq.pages[old:]
        self.stats.peak_pages_in_use = max(self.stats.peak_pages_in_use, self.allocator.in_use)

    def _preempt(self, seq: _Sequence) -> None:
        log.info("sampler: KV pool full, preempting sequence %d (%d tokens generated)", seq.index, len(seq.tokens))
        self.allocator.release(seq.pages)
        seq.pages = []
        self.state.active[seq.slot] = False
        self.state.tables[seq.slot] = 0
        self.slots[seq.slot] = None
        seq.slot = None
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1

    def _decode(self, pool):
        start = time.perf_counter()
        slots = self.config.max_slots
        free = sum(s is None for s in self.slots)
        if self.waiting:
            threshold = max(1, math.ceil(self.config.refill_fraction * slots) - free)
        else:
            threshold = slots + 1
        active_before = self.state.active.copy()
        cache_before = self.state.cache_len.copy()
        pool, new_state, out = self.engine.functions.decode(self.weights, pool, self.state, self.seeds,
                                                            np.int32(threshold))
        out = jax.tree.map(np.asarray, out)
        new_state = jax.tree.map(np.array, new_state)               # writable host copies
        self.state = new_state._replace(tables=self.state.tables, max_new=self.state.max_new,
                                        sequence_ids=self.state.sequence_ids)
        num_steps = int(out.steps)
        produced = (out.tokens != steps.NO_TOKEN).sum(axis=1)
        self.stats.decode_calls += 1
        self.stats.decode_steps += num_steps
        self.stats.slot_steps_total += num_steps * slots
        self.stats.slot_steps_active += int(produced.sum())
        self.stats.generated_tokens += int(produced.sum())
        self.stats.kv_tokens_read += int(np.sum(produced * cache_before + produced * (produced + 1) // 2))
        self.stats.live_per_step.extend(int((produced > j).sum()) for j in range(num_steps))
        for slot in np.flatnonzero(active_before):
            seq = self.slots[slot]
            n = int(produced[slot])
            seq.tokens.extend(out.tokens[slot, :n].tolist())
            seq.logprobs.extend(out.logprobs[slot, :n].tolist())
            seq.policy_logprobs.extend(out.policy_logprobs[slot, :n].tolist())
            reason = int(out.reasons[slot])
            keep = self.stop_check(seq.index, seq.tokens, n) if self.stop_check is not None and n else None
            # The earliest end wins: a stop string before the device's own stop, or with no device stop at all.
            if keep is not None and (keep < len(seq.tokens) or reason == steps.RUNNING):
                del seq.tokens[keep:], seq.logprobs[keep:], seq.policy_logprobs[keep:]
                self._finish(seq, "stop")
            elif reason != steps.RUNNING:
                self._finish(seq, steps.REASON_NAMES[reason])
        self.stats.decode_s += time.perf_counter() - start
        return pool


def mesh_of(model: qwen2.Qwen2ForCausalLM):
    """The mesh the model's parameters are sharded over (None when they live on one device)."""
    for leaf in jax.tree.leaves(params_of(model)):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None


def params_of(model: qwen2.Qwen2ForCausalLM):
    """The model's parameter state (the same arrays, no copy)."""
    return nnx.split(model)[1]

