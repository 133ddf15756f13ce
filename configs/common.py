"""The full run config with Kevin-32B's recipe as the baseline; every config file starts from `base()`.

One ConfigDict per section, with exactly the field names of the dataclass that reads it (kevin_jax.run_config.SECTIONS;
tests/kevin_jax/test_configs.py checks that every field is here), so `--config.<section>.<field>=...` works for every
field and an unknown field is an error. This file must not import jax: launch/train.py sets the GPU placement
environment from the config before JAX starts.

Ablation switches are plain overrides, e.g.:
  --config.env.num_turns=1 --config.reward.aggregation=single_turn     single-turn training (configs/single_turn.py)
  --config.reward.gamma=0.8    --config.reward.aggregation=max         return discount / sum vs max of later scores
  --config.env.num_trajectories=8                                      parallel trajectories per task
  --config.reward.correct_weight=0.0 --config.reward.speedup_transform=log      score weights
  --config.reward.baseline=turn_mean                                   advantage baseline per turn (rl/advantages.py)
  --config.rl.aggregation=token_mean                                   loss aggregation (or sequence_mean)
  --config.rl.kl_coef=0.01                                             KL to the starting policy
"""
from ml_collections import ConfigDict, config_dict


def defaults() -> ConfigDict:
    """Every section with exactly the fields and default values of the dataclass that reads it. The dataclasses are
    the one source of defaults; they import jax, which a config must not, so their values are written out here and
    tests/kevin_jax/test_configs.py fails when the two differ."""
    c = ConfigDict()
    c.model = ConfigDict(dict(
        shape="tiny", hf_checkpoint="",                     # exactly one: a named shape (random init) or HF dir
        dtype="bfloat16", param_dtype="float32", remat="full", attention="auto", attention_chunk=512,
        matmul_precision="default", scan_layers=True))
    c.tokenizer = ConfigDict(dict(path=""))                 # "" = built-in, "model" = the checkpoint's own
    c.tasks = ConfigDict(dict(kernelbench_dir="", parquet="", levels=(1, 2), split_file="", holdout_fraction=0.1,
                              split_seed=0))
    c.env = ConfigDict(dict(num_turns=4, num_trajectories=16, max_prompt_tokens=8192, max_response_tokens=16384,
                            early_stop="never", gpu_name="NVIDIA H100", one_shot=True, max_summary_chars=2000,
                            feedback="kevin",   # "profile": a correct kernel's feedback adds its profile
                            # groups of tasks pipelined: one group evaluated while another samples (env/scheduler.py);
                            # overlap=False: the sequential runner, the same trajectories
                            overlap=True, pipeline_groups=2))
    c.reward = ConfigDict(dict(correct_weight=0.3, speedup_transform="identity", speedup_clip=10.0, gamma=0.4,
                               aggregation="sum", normalize_std=True, baseline="mean", std_eps=1e-6))
    c.sampler = ConfigDict(dict(
        temperature=0.9, top_p=1.0, top_k=0, stop_ids=(), stop_sequences=(), stop_strings=(), max_slots=64,
        max_seq_len=32768, page_size=16, num_pages=0, kv_cache_gb=0.0, kv_cache_fraction=0.5, tensor_parallel=0,
        decode_steps=32, refill_fraction=0.125,
        prefill_tokens=4096, prefill_chunk=1024, prefix_sharing=True, attention="auto", attention_block_tokens=0,
        attention_split_tokens=0, attention_warps=0, attention_stages=0, layer_loop="unrolled", layer_unroll=1))
    c.eval = ConfigDict(dict(
        profile="kevin",  # cuda_eval/profiles.py: "kernelbench" scores as KernelBench does
        mode="auto", device_type="cuda", devices="all", cpu_workers=1, cpu_threads=1, compile_workers=0, arch="auto",
        cache_dir="", cache_max_bytes=20 << 30, record_timeout_s=120.0, compile_timeout_s=300.0, max_log_chars=4000,
        run_timeout_s=180.0, worker_start_timeout_s=180.0, spare_workers=0, run_dir="", worker_memory_bytes=32 << 30,
        sandbox_uids="60000-60999", allow_unsandboxed=False, num_correct_trials=5,
        atol=1e-2, rtol=1e-2, strict=False, seed=42, timing_method="gated", timing_target_s=0.25,
        timing_warmup_s=0.03, timing_min_reps=20, timing_max_reps=200, timing_input_sets=4, timing_inputs_max_bytes=4 << 30,
        ref_compile=False, ref_timing_cache=True, ref_timing_cache_dir="", static_policy="auto",
        skip_run_on_static_flags=True, require_custom_kernel=True, forbid_python_torch_compute=True,
        forbid_reference_ops=True, forbid_library_heavy_ops=True, forbid_host_transfer=True, kernel_trace=True,
        kernel_trace_calls=True, flag_native_threads=False, unsynced_slack_us=50.0, retime_speedup_threshold=5.0, retime_min_ratio=0.5,
        max_feedback_chars=3000, kernel_profile=False, kernel_profile_timeout_s=30.0, share_identical=True))
    c.rl = ConfigDict(dict(
        tasks_per_step=8, updates_per_batch=2, clip_eps_low=0.2, clip_eps_high=0.28, aggregation="constant_length",
        constant_length=0, kl_coef=0.0, old_logprobs="sampler", tis_cap=0.0, skip_zero_advantage=True,
        micro_batch_tokens=65536, pack=True, row_len=0, min_row_len=256, logprob_chunk=1024,
        compile_only_score=0.3))
    c.optim = ConfigDict(dict(learning_rate=2e-6, warmup_fraction=0.03, b1=0.9, b2=0.999, eps=1e-8,
                              weight_decay=0.01, grad_clip_norm=0.05,
                              offload="none",        # "pinned_host": master weights + AdamW moments in host RAM
                              grad_dtype="float32"))
    c.mesh = ConfigDict(dict(data=1, fsdp=-1, tensor=1, coordinator_address=config_dict.placeholder(str),
                             num_processes=config_dict.placeholder(int), process_id=config_dict.placeholder(int)))
    c.gpu = ConfigDict(dict(jax_devices="all", jax_memory_fraction=0.6, preallocate=True))
    c.log = ConfigDict(dict(tensorboard=True, trajectories=True, progress=True, thought_prefix="Okay"))
    c.ckpt = ConfigDict(dict(every_steps=1, max_to_keep=3, async_save=True, enabled=True, dir="", concurrent_gb=32))
    c.holdout = ConfigDict(dict(every_steps=0, at_end=True, num_trajectories=4))
    # corpus: "" = built-in correct solutions (first turn), "builtin" = the shipped mixed-quality multi-turn corpus,
    # or a JSONL path (kevin_jax/sft.py); launch/sft.py runs this section standalone and writes an HF checkpoint.
    c.warm_start = ConfigDict(dict(steps=0, learning_rate=1e-3, batch_size=8, length_buckets=0, corpus="",
                                   solution_tasks="", answer_every_prompt=False))
    return c


def base() -> ConfigDict:
    """Kevin-32B's recipe: the defaults, and where the recipe departs from them on purpose."""
    c = defaults()
    c.seed = 0
    c.total_steps = 100
    # "step:tokens,...": env.max_response_tokens from that step on (Kevin: 16k, then 22k from step 30).
    c.response_schedule = ""
    # The recipe's policy is an HF checkpoint (QwQ-32B; --config.model.hf_checkpoint), not a random init.
    c.model.shape = ""
    # Refinement prompts carry up to three earlier attempts (code, summary, feedback) of KernelBench programs.
    c.env.max_prompt_tokens = 16384
    # The sampler sized for the recipe (the dataclass defaults suit small runs and tests): Kevin's 8 tasks x 16
    # trajectories decode together, within QwQ's 40k context (>= the prompt budget + 22k responses), long prompts
    # prefill in fewer, larger calls, and the KV pool takes a smaller share of the free GPU memory (the GPU is shared
    # with cuda_eval's workers).
    c.sampler.max_slots = 128
    c.sampler.max_seq_len = 40960
    c.sampler.prefill_tokens = 8192
    c.sampler.prefill_chunk = 2048
    c.sampler.kv_cache_fraction = 0.3
    return c
