"""SamplerConfig: the `sampler` config section (docs/ARCHITECTURE.md: one plain dataclass per component)."""
from __future__ import annotations

import dataclasses

ATTENTION_IMPLS = ("auto", "pallas", "xla")
LAYER_LOOPS = ("unrolled", "scan")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """How the policy samples (config section `sampler`; build with `SamplerConfig(**config.sampler)`).

    Sampling distribution
      temperature: logits are divided by it (Kevin: 0.9); 0 = greedy (argmax).
      top_p: nucleus sampling: keep the smallest set of most likely tokens whose probability reaches top_p (1 = off).
        Exact, so it sorts the vocabulary each step: noticeably slower at large batch than top_p=1.
      top_k: keep only the k most likely tokens (0 = off). Applied before top_p.
      stop_ids: token ids that end a generation with stop_reason "eos" (they are part of the returned tokens).
        Empty = the tokenizer's stop ids when the policy has a tokenizer (<|im_end|>, <|endoftext|>).
      stop_sequences: token-id sequences that end a generation with stop_reason "stop" (matched on device against
        the generated tokens only, never the prompt; included in the returned tokens).
      stop_strings: texts that end a generation with stop_reason "stop" (checked on the host after each decode call
        by decoding the new tokens; needs a tokenizer; the tokens up to the one completing the text are kept).

    Memory and batching (continuous batching over a paged KV cache)
      max_slots: sequences decoded together (the decode batch). A finished sequence's slot is refilled at the end of
        the current decode call with the next waiting prompt.
      max_seq_len: longest prompt + generation of one sequence. A prompt must be shorter; generation is cut at this
        length (stop_reason "length").
      page_size: tokens per KV page (power of two).
      num_pages: KV pages per layer, shared by all slots (page 0 is a scratch page). 0 = sized by kv_cache_gb or
        kv_cache_fraction (kv_cache.plan_pool); the engine logs the result ("KV pool: N pages = X GB per device,
        holds Y tokens = Z sequences of 16k"). When the pool holds fewer than max_slots sequences of max_seq_len,
        sequences are admitted while pages last and the most recently admitted one is preempted (its cache
        recomputed later) when a running sequence needs a page: the slots stay busy, nothing fails.
      kv_cache_gb: pool size per device in GB (0 = use kv_cache_fraction).
      kv_cache_fraction: on a GPU, the pool takes this fraction of the device memory left when the sampler is built
        (JAX's limit, i.e. gpu.jax_memory_fraction of the card, minus what is in use then, minus the sampler's
        own weight copy and workspace); build it after the training state is allocated. Capped at the dense worst
        case (max_slots sequences of max_seq_len); 0 = the dense worst case. Ignored on CPU.
      tensor_parallel: devices that split each layer (and the KV cache, by KV heads) while sampling. 0 = the
        largest divisor of the mesh's device count that divides the KV heads, query heads, MLP width and vocabulary
        (every device for QwQ-32B on 1, 2, 4 or 8 GPUs); other devices hold replicas that split the slots.
        The sampler copies the parameters into this layout at each generate call (kevin_jax.sampler.layout).
      decode_steps: decode steps per jitted call (a device loop that returns early once `refill_fraction` of the
        slots have finished while prompts wait). Larger = fewer host round trips, later refills.
      refill_fraction: fraction of max_slots that must be free before a decode call returns early to refill them.
      prefill_tokens: tokens per prefill call (rows x chunk); bounds prefill activation memory.
      prefill_chunk: longest prompt piece one prefill row processes; longer prompts take several calls.
      prefix_sharing: share the KV pages of identical prompt prefixes (whole pages) between sequences of one
        generate call: the 16 trajectories of a task prefill their common prompt once.

    Kernels
      attention: decode attention: "pallas" (jax.experimental.pallas.ops.gpu.paged_attention: reads only the live
        pages of each sequence; in interpret mode on CPU, slow, for tests), "xla" (pure JAX, blockwise over pages up
        to the longest live sequence; runs anywhere), or "auto" (pallas on GPU if it compiles there, else xla).
        Prefill always uses the pure-JAX blockwise attention.
      attention_block_tokens, attention_split_tokens, attention_warps, attention_stages: blocking of the Pallas
        kernel (0 = automatic, see kv_cache.pallas_params): keys per compute block, keys per kernel program (the page
        table is split into table_width / split programs per sequence and KV head, combined afterwards), Triton warps
        per program, software-pipelining stages. benchmarks/sampler.py sweeps them on the GPU.
      layer_loop: how decode runs the decoder layers. "unrolled": at the start of each generate call every layer's
        weights are copied once into separate arrays in the compute dtype and the sampling layout (one extra copy of
        the weights in device memory while generating, split over the tensor-parallel devices), and the decode step
        runs the layers as straight-line code that reads those arrays in place. "scan": lax.scan over the stacked
        parameters (no extra memory when the parameters already have the sampling layout, e.g. on one device, else
        one stacked copy; XLA:GPU then copies every layer's weights out of the stack on every decode step, ~3x the
        weight traffic, and with float32 parameters converts them to the compute dtype every step too).
      layer_unroll: unroll factor of that scan (layer_loop="scan" only, and of prefill's scan; True = fully unrolled).
    """
    temperature: float = 0.9
    top_p: float = 1.0
    top_k: int = 0
    stop_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    stop_strings: tuple[str, ...] = ()
    max_slots: int = 64
    max_seq_len: int = 32768
    page_size: int = 16
    num_pages: int = 0
    kv_cache_gb: float = 0.0
    kv_cache_fraction: float = 0.5
    tensor_parallel: int = 0
    decode_steps: int = 32
    refill_fraction: float = 0.125
    prefill_tokens: int = 4096
    prefill_chunk: int = 1024
    prefix_sharing: bool = True
    attention: str = "auto"
    attention_block_tokens: int = 0
    attention_split_tokens: int = 0
    attention_warps: int = 0
    attention_stages: int = 0
    layer_loop: str = "unrolled"
    layer_unroll: int | bool = 1

    def __post_init__(self):
        # ml_collections hands lists where the dataclass wants tuples.
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        object.__setattr__(self, "stop_sequences", tuple(tuple(int(i) for i in s) for s in self.stop_sequences))
        object.__setattr__(self, "stop_strings", tuple(str(s) for s in self.stop_strings))
        if self.temperature < 0:
            raise ValueError(f"sampler.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampler.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampler.top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(i < 0 for i in self.stop_ids):
            raise ValueError(f"sampler.stop_ids must be non-negative token ids, got {self.stop_ids}")
        for seq in self.stop_sequences:
            if not seq or any(i < 0 for i in seq):
                raise ValueError(f"sampler.stop_sequences entries must be non-empty lists of token ids, got {seq}")
        if any(not s for s in self.stop_strings):
            raise ValueError("sampler.stop_strings must not contain an empty string")
        for name in ("max_slots", "max_seq_len", "page_size", "decode_steps", "prefill_tokens", "prefill_chunk"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sampler.{name} must be positive, got {getattr(self, name)}")
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"sampler.page_size must be a power of two, got {self.page_size}")
        if self.num_pages < 0:
            raise ValueError(f"sampler.num_pages must be >= 0 (0 = automatic), got {self.num_pages}")
        if self.kv_cache_gb < 0:
            raise ValueError(f"sampler.kv_cache_gb must be >= 0 (0 = use kv_cache_fraction), got {self.kv_cache_gb}")
        if self.tensor_parallel < 0:
            raise ValueError(f"sampler.tensor_parallel must be >= 0 (0 = automatic), got {self.tensor_parallel}")
        if not 0.0 <= self.kv_cache_fraction < 1.0:
            raise ValueError(f"sampler.kv_cache_fraction must be in [0, 1), got {self.kv_cache_fraction}")
        if not 0.0 < self.refill_fraction <= 1.0:
            raise ValueError(f"sampler.refill_fraction must be in (0, 1], got {self.refill_fraction}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"sampler.attention={self.attention!r}; choose one of {ATTENTION_IMPLS}")
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(f"sampler.layer_loop={self.layer_loop!r}; choose one of {LAYER_LOOPS}")
        for name in ("attention_block_tokens", "attention_split_tokens", "attention_warps", "attention_stages"):
            if getattr(self, name) < 0:
                raise ValueError(f"sampler.{name} must be >= 0 (0 = automatic), got {getattr(self, name)}")
        if self.max_seq_len < 2:
            raise ValueError(f"sampler.max_seq_len must be >= 2 (a prompt token and a generated one)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes) -> "SamplerConfig":
        return dataclasses.replace(self, **changes)
