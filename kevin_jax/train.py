"""The multi-turn RL loop (Kevin's GRPO recipe), in one readable file.

    python launch/train.py --config=configs/one_gpu.py --workdir=/tmp/kevin_run      # flags -> run(config, workdir)

Per step:
  1. draw the step's training tasks (a function of seed and step: kevin_jax.rl.task_sampler);
  2. roll out env.num_trajectories trajectories x env.num_turns turns per task (kevin_jax.env.episode, the round
     loop): the tasks in env.pipeline_groups groups, each round of a group one sampler request with the policy's own
     parameters (the groups' requests share one continuous decode batch) and one cuda_eval submission, one group's
     kernels compiled and run while another group samples;
     each turn scored as it is played (kevin_jax.reward); discounted returns and per-task advantages come from
     kevin_jax.rl.advantages;
  3. rl.updates_per_batch optimiser updates on the batch (the first on-policy, the next off-policy with importance
     ratios against the sampler's log-probs), gradients accumulated over micro-batches (kevin_jax.rl.state);
  4. scalars to TensorBoard and metrics.jsonl (kevin_jax.rl.rollout_stats), every trajectory to
     trajectories/step_XXXXXX.jsonl (kevin_jax.env.trajectory);
  5. orbax checkpoint on schedule (kevin_jax.checkpoint), held-out evaluation on schedule.

With optim.offload="pinned_host" the float32 master weights and AdamW moments live in host memory and the GPUs hold
the compute-dtype weights (kevin_jax.rl.offload). Per step the trainer logs each phase's wall time (time/sampling,
evaluation, update = gradients + optimizer, checkpoint, checkpoint_wait, and checkpoint_save / restore when they
complete), MFU of the gradient computation and of the whole update, tokens/s, and memory (mem/: peak HBM per GPU,
host RSS and its high-water mark, the node's used RAM).

All randomness is a function of (seed, step, round), and a checkpoint holds parameters, optimiser state, the step,
the task sampler's position and the split: a run killed at any point and restarted on the same workdir produces the
steps an uninterrupted run would have (bit-exact on CPU; on GPUs up to the evaluator's timing noise).
tests/kevin_jax/kill_at_phase.py kills a run at a named phase of a named step to show it.

Without a GPU, kernels cannot run: the evaluator only compiles them ("compile_only"). That mode must be asked for
(eval.mode="compile_only", as configs/tiny_cpu.py does); it scores a kernel that compiled with rl.compile_only_score
and tags every metric and log line compile_only.

rl.replay="builtin" is a benchmark mode, not training (kevin_jax.env.replay): full-length sampling, the evaluator
judging replayed real answers of each task in place of the sampled ones, a real update; every line says [replay].
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx

from cuda_eval.api import Evaluator, visible_gpu_count
from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import host_memory, logs, multihost, parallel
from kevin_jax.env import replay
from kevin_jax.env.episode import EpisodeRunner, resolve_gpu_name
from kevin_jax.env.submissions import share_gpus_with_evaluator
from kevin_jax.env.trajectory import Trajectory, step_path, write_trajectories
from kevin_jax.placement import build_gib_of, require_gpu_for_kernels, shared_gpus
from kevin_jax.policy_init import abstract_state, architecture, check_vocabulary, run_tokenizer, starting_params
from kevin_jax.rl import advantages, rollout_stats, speed_metrics
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl import offload as offload_lib
from kevin_jax.rl import state as rl_state
from kevin_jax.rl.task_sampler import TaskSampler
from kevin_jax.run_config import RunSpec, as_dict, parse_config
from kevin_jax.sampler import SamplerPolicy
from kevin_jax.tasks import Split, load_tasks, resolve_split, select

log = logging.getLogger("kevin_jax.train")

NO_GPU_MESSAGE = (
    "Kernel evaluation needs an NVIDIA GPU, and none is visible here: the reward (correctness and speed of the "
    "generated CUDA kernels) cannot be measured. To run the RL loop on this machine anyway, with compile-only "
    "verdicts (nvcc compiles each kernel, nothing runs; every metric is tagged compile_only/), use the tiny CPU "
    "config:\n  python launch/train.py --config=configs/tiny_cpu.py --workdir=/tmp/kevin_tiny")


# ---------------------------------------------------------------------------------------------------- pieces
def make_evaluator(spec: RunSpec):
    """The real evaluator (cuda_eval), refusing to pretend: no GPU and no explicit compile-only request = NoGpuError."""
    require_gpu_for_kernels(spec.eval, visible_gpu_count(), NO_GPU_MESSAGE)
    return Evaluator(evaluator_config(spec))


def evaluator_config(spec: RunSpec):
    """spec.eval, with the host memory an output buffer must leave set where the eval section leaves it to the
    evaluator: the trainer's floor, one build's worth (a build that starts right after a grant) and 1 GiB. cuda_eval's
    output buffers then never take the host under the line this run stops at, and use what is above it (its own
    default, 2% of a large host, is a guess that knows nothing of the floor)."""
    floor = host_memory.floor_bytes(spec.gpu.host_memory_floor)
    if spec.eval.host_memory_reserve_gib or not floor:
        return spec.eval
    return dataclasses.replace(spec.eval, host_memory_reserve_gib=floor / 2**30 + build_gib_of(spec.eval) + 1.0)


def _phase_times(result) -> dict[str, float]:
    """The episode's times (kevin_jax.env.submissions.StepTiming): the policy busy, the wall time with an evaluation
    outstanding, the episode's wall time, and its ratio to the larger of the two (1 = fully overlapped)."""
    t = result.timing
    return {"sampling": t.sampling_s, "evaluation": t.evaluation_s, "episode": t.wall_s,
            "wall_over_max": t.wall_over_max}


def _gather_trajectories(local: list[Trajectory]) -> list[Trajectory]:
    parts = multihost.gather_json([t.to_dict() for t in local])
    return [Trajectory.from_dict(d) for part in parts for d in part]


def run_episodes(runner: EpisodeRunner, tasks: list, step: int, seed: int,
                 advantage: advantages.AdvantageConfig) -> tuple[list[Trajectory], dict]:
    """This host's share of `tasks` rolled out (every turn scored by the runner: with compile-only verdicts, the
    proxy score of every kernel that compiled), then everyone's trajectories gathered (same order on every host) and
    their returns and advantages assigned."""
    mine = multihost.host_share(tasks)
    if jax.process_count() > 1:
        log.info("host %d/%d rolls out %d of %d tasks", jax.process_index(), jax.process_count(), len(mine),
                 len(tasks))
    result = runner.run(mine, step=step, seed=seed)
    times = _phase_times(result)
    trajectories = _gather_trajectories(result.trajectories)
    order = {t.task_id: i for i, t in enumerate(tasks)}
    trajectories.sort(key=lambda t: (order[t.task_id], t.traj_index))
    advantages.assign_returns(trajectories, runner.reward, advantage)
    return trajectories, times


def _write_replayed(path: Path, records: list[dict], is_main: bool) -> None:
    """Which answer each request replayed (rl.replay), one JSON line per request (this host's requests)."""
    if not is_main:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _holdout_seed(seed: int) -> int:
    return int(np.random.SeedSequence([seed, 0x401D]).generate_state(1)[0])


def _headline(values: Mapping[str, float], compile_only: bool) -> dict[str, str]:
    key = "rollout/compiled_rate" if compile_only else "rollout/correct_rate"
    return {"score": f"{values.get('rollout/score_mean', 0):.3f}",
            "compiled" if compile_only else "correct": f"{values.get(key, 0):.2f}",
            "loss": f"{values.get('update0/loss', 0):.2e}", "s/step": f"{values.get('time/step', 0):.0f}"}


# ---------------------------------------------------------------------------------------------------- the loop
def run(config: Any, workdir: str | os.PathLike, *, evaluator: Any = None) -> dict[str, float]:
    """Trains until config.total_steps, resuming from the newest checkpoint in `workdir` if there is one.

    evaluator: anything with cuda_eval's `evaluate(requests)` (tests pass fakes); default: cuda_eval.api.Evaluator
    built from config.eval (it must be able to run kernels, or be explicitly compile-only).
    Returns the scalars of the last step.
    """
    t_start = time.perf_counter()
    spec = parse_config(config)
    workdir = Path(workdir).absolute()
    parallel.initialize_distributed(spec.mesh)
    is_main = jax.process_index() == 0
    if spec.rl.tasks_per_step % jax.process_count():
        raise ValueError(f"rl.tasks_per_step={spec.rl.tasks_per_step} must be a multiple of the number of hosts "
                         f"({jax.process_count()}): each host rolls out its share of the tasks")
    workdir.mkdir(parents=True, exist_ok=True)

    with contextlib.ExitStack() as stack:
        # a host out of memory (an offloaded state pins most of it) stops the run with an error instead of thrashing
        stack.enter_context(host_memory.HostMemoryGuard(host_memory.floor_bytes(spec.gpu.host_memory_floor)))
        if spec.rl.replay:      # a benchmark, not training: every line it logs says so (kevin_jax.env.replay)
            tagger = replay.ReplayTag()
            for handler in logging.getLogger().handlers:
                handler.addFilter(tagger)
                stack.callback(handler.removeFilter, tagger)
            log.warning("rl.replay=%r: NOT TRAINING. The sampler ignores its stop tokens (full-length responses) and "
                        "each response is followed by a replayed answer of its task (shipped solutions, warm-start "
                        "corpus), which the evaluator judges; every metric is under replay/", spec.rl.replay)
        if evaluator is None:
            evaluator = stack.enter_context(make_evaluator(spec))
        mode = getattr(evaluator, "mode", "full")
        compile_only = mode == "compile_only"
        proxy_score = spec.rl.compile_only_score if compile_only else None
        tag = "[compile-only] " if compile_only else ""
        if compile_only:
            log.warning("%sno GPU: kernels are compiled but never run; a compiled kernel scores "
                        "rl.compile_only_score=%g and every metric is tagged compile_only/", tag,
                        spec.rl.compile_only_score)

        # --- tasks, tokenizer, model, optimiser
        tokenizer = run_tokenizer(spec)
        tasks = load_tasks(spec.tasks).tasks
        answers = replay.answers_for(spec.rl.replay, [t.task_id for t in tasks]) if spec.rl.replay else None
        global_mesh, local_mesh = multihost.build_meshes(spec.mesh)
        arch = architecture(spec)
        check_vocabulary(tokenizer, arch)
        total_updates = spec.total_steps * spec.rl.updates_per_batch
        schedule = rl_state.learning_rate_schedule(spec.optim, total_updates)
        tx = rl_state.make_optimizer(spec.optim, total_updates)
        host_offload = rl_state.host_offload(spec.optim, total_updates, spec.model_options.compute_dtype)
        checkpointer = ckpt_lib.Checkpointer(spec.ckpt.dir or workdir / "checkpoints", spec.ckpt)
        stack.callback(checkpointer.close)
        latest = checkpointer.latest_step()
        reference, start_values, restore_s = None, {}, None
        # the KL reference (kl_coef > 0): the starting weights; offloaded runs hold it in the compute dtype, like the
        # policy's own device weights (the forward casts to it anyway)
        as_reference = ((lambda x: x.astype(spec.model_options.compute_dtype)) if host_offload is not None
                        else (lambda x: x.copy()))
        if latest is None:
            split = resolve_split(tasks, spec.tasks, write_to=workdir / "split.json" if is_main else None)
            graphdef, params, start_values = starting_params(spec, global_mesh, select(tasks, split, "train"),
                                                             tokenizer)
            if spec.rl.kl_coef > 0:
                reference = jax.tree.map(as_reference, params)
            state = rl_state.init_state(params, tx, host_offload)
            del params
            start_step = 1
            log.info("%sfresh run in %s: %d steps", tag, workdir, spec.total_steps)
        else:
            graphdef, target = abstract_state(spec, global_mesh, tx)
            t0 = time.perf_counter()
            if host_offload is not None:      # the checkpoint holds the master copy, not its device cast
                state, meta = checkpointer.restore(latest, offload_lib.checkpoint_view(target))
                state = offload_lib.restore_params(state, spec.model_options.compute_dtype)
            else:
                state, meta = checkpointer.restore(latest, target)
            jax.block_until_ready(state)
            restore_s = time.perf_counter() - t0
            if meta.get("seed") != spec.seed:
                raise ValueError(f"{workdir} holds a run with seed {meta.get('seed')} but config.seed={spec.seed}: "
                                 f"resume with the same config, or use a new workdir")
            split = Split.from_dict(meta["split"])
            start_step = latest + 1
            if spec.rl.kl_coef > 0:     # the reference policy is the starting one: rebuilt, deterministically
                start = starting_params(spec, global_mesh, select(tasks, split, "train"), tokenizer)[1]
                reference = jax.tree.map(as_reference, start)
                del start
            log.info("%sresuming %s after step %d (%d updates done): checkpoint restored in %.1f s", tag, workdir,
                     latest, int(multihost.to_host(state["updates"])), restore_s)
        saved_view = offload_lib.checkpoint_view if host_offload is not None else (lambda s: s)
        placed = offload_lib.state_bytes(state)
        log.info("train state: %.1f GB on the devices, %.1f GB in host memory (optim.offload=%s)",
                 placed.get("device", 0) / 1e9, placed.get(offload_lib.HOST, 0) / 1e9, spec.optim.offload)
        if spec.ckpt.enabled:     # fail now, not after the first step, if no checkpoint can be written
            ckpt_lib.check_space(checkpointer.directory, ckpt_lib.checkpoint_bytes(saved_view(state)))
        if is_main:
            (workdir / "config.json").write_text(json.dumps(as_dict(config), indent=1, default=str) + "\n")
        train_tasks = select(tasks, split, "train")
        holdout_tasks = select(tasks, split, "holdout") if split.holdout else []
        task_by_id = {t.task_id: t for t in tasks}
        sampler_tasks = TaskSampler([t.task_id for t in train_tasks], spec.rl.tasks_per_step, spec.seed)

        # --- policy (the sampler reads the train state's own parameters), environment, update
        model = nnx.merge(graphdef, multihost.sampling_view(state["params"], local_mesh))
        sampler_config = spec.sampler
        if spec.rl.replay:      # no stop token: every response runs to env.max_response_tokens
            sampler_config = dataclasses.replace(spec.sampler, stop_ids=(), stop_sequences=(), stop_strings=())
        policy = SamplerPolicy(model, sampler_config, tokenizer=None if spec.rl.replay else tokenizer,
                               mesh=local_mesh)
        share_gpus_with_evaluator(policy, evaluator, shared_gpus(spec.gpu.jax_devices, spec.eval.devices,
                                                                 visible_gpu_count()))
        # the card the kernels run on, named in every prompt (env.gpu_name="auto"; a name overrides it)
        env = dataclasses.replace(spec.env, gpu_name=resolve_gpu_name(spec.env.gpu_name, spec.eval, evaluator))
        log.info("%sprompts name the GPU %r", tag, env.gpu_name)
        runner = (replay.ReplayRunner(answers, policy, evaluator, tokenizer, env, spec.reward,
                                      compile_only_score=proxy_score) if spec.rl.replay
                  else EpisodeRunner(policy, evaluator, tokenizer, env, spec.reward, compile_only_score=proxy_score))
        temperature = spec.sampler.temperature
        updater = rl_state.Updater(graphdef, tx, schedule, spec.rl, global_mesh, temperature, offload=host_offload,
                                   grad_dtype=rl_state.GRAD_DTYPES[spec.optim.grad_dtype])
        row_divisor = global_mesh.shape["data"] * global_mesh.shape["fsdp"]
        constant_length = spec.rl.constant_length or spec.longest_response
        max_row_len = -(-spec.sampler.max_seq_len // 256) * 256     # no sample is longer than the context
        flops = logs.FlopModel.of(arch)
        peak = logs.peak_flops(jax.devices()[0].device_kind)
        prefix = ("replay/" if spec.rl.replay else "") + ("compile_only/" if compile_only else "")
        writer = logs.MetricWriter(workdir, spec.log, prefix=prefix, is_writer=is_main)
        stack.callback(writer.close)
        if latest is not None:
            writer.restart(start_step)
        if start_values:
            writer.write(0, start_values)
        progress = logs.Progress(spec.total_steps, start_step, is_main and spec.log.progress,
                                 (" [replay]" if spec.rl.replay else "") + (" [compile-only]" if compile_only else ""))
        stack.callback(progress.close)
        last: dict[str, float] = {}
        local_devices = jax.local_devices()
        first_values = {"time/startup": time.perf_counter() - t_start}
        if restore_s is not None:
            first_values["time/restore"] = restore_s
        last_save_logged = None

        for step in range(start_step, spec.total_steps + 1):
            t_step = time.perf_counter()
            values: dict[str, float] = dict(first_values) if step == start_step else {}

            # 1-2. rollouts on this step's tasks
            runner.env = dataclasses.replace(spec.env, max_response_tokens=spec.max_response_tokens(step))
            policy.set_model(nnx.merge(graphdef, multihost.sampling_view(state["params"], local_mesh)))
            step_tasks = [task_by_id[i] for i in sampler_tasks.tasks_for_step(step)]
            t0 = time.perf_counter()
            trajectories, phase = run_episodes(runner, step_tasks, step, spec.seed, spec.advantage)
            rollout_s = time.perf_counter() - t0
            if spec.rl.replay:
                _write_replayed(step_path(workdir / "replay", step), runner.take_replayed(), is_main)
            # correctness, scores, returns, advantages, lengths; the speed of correct kernels (rollout/speed/...)
            values.update({f"rollout/{k}": v for k, v in
                           rollout_stats.rollout_scalars(trajectories, spec.env.num_turns,
                                                         spec.log.thought_prefix).items()})
            values.update({k.replace("mem/", "mem/after_sampling/"): v
                           for k, v in logs.memory_scalars(local_devices).items() if k.startswith("mem/hbm_peak")})
            if values.get("rollout/timing_contended_rate", 0.0) > 0.0:
                logging.warning("step %d: %.0f%% of the timed kernels ran while the GPU was slower than when their "
                                "reference was timed (another process on it?): their speedups are under-estimates",
                                step, 100 * values["rollout/timing_contended_rate"])
            if jax.default_backend() == "gpu":
                policy.engine.release_memory()          # the KV pool's memory goes to the update

            # 3. updates (after the last checkpoint's background write: it may read the state the update donates)
            values["time/checkpoint_wait"] = checkpointer.wait()
            if checkpointer.last_save_s is not None and checkpointer.last_save_s != last_save_logged:
                values["time/checkpoint_save"] = last_save_logged = checkpointer.last_save_s
                log.info("the last checkpoint was written in %.1f s (%.1f s waited for it)",
                         checkpointer.last_save_s, values["time/checkpoint_wait"])
            t0 = time.perf_counter()
            sample_set = rl_batch.make_samples(trajectories, spec.rl, constant_length)
            batches, layout = ([], None)
            if sample_set.samples:
                host_batches, layout = rl_batch.micro_batches(sample_set.samples, spec.rl, row_divisor,
                                                              max_row_len)
                batches = [updater.device_batch(mb) for mb in host_batches]
                if reference is not None:
                    for mb in batches:
                        mb["ref_logprobs"] = updater.logprobs(reference, mb)
            gradients_s = optimizer_s = 0.0
            for u in range(spec.rl.updates_per_batch):
                state, stats, trainer_logprobs = updater.update(state, batches, first=(u == 0))
                gradients_s += updater.last_times["gradients"]
                optimizer_s += updater.last_times["optimizer"]
                # exact values (repr): a resumed run's redone step can be compared with the killed run's line
                log.info("%sstep %d update %d: loss %r, grad_norm %r, update_norm %r; gradients %.1fs, optimizer "
                         "%.1fs", tag, step, u, stats.get("loss"), stats.get("grad_norm"), stats.get("update_norm"),
                         updater.last_times["gradients"], updater.last_times["optimizer"])
                if u == 0 and spec.rl.old_logprobs == "trainer":
                    for mb, lp in zip(batches, trainer_logprobs):
                        mb["trainer_old_logprobs"] = lp
                values.update({f"update{u}/{k}": v for k, v in stats.items()})
            update_s = time.perf_counter() - t0
            del batches

            # 4. metrics and trajectories
            lengths = [len(s) for s in sample_set.samples]
            all_lengths = [len(t.prompt_tokens) + len(t.response_tokens) for tr in trajectories for t in tr.turns]
            update_flops = spec.rl.updates_per_batch * flops.train(lengths) + (
                flops.forward(lengths) if reference is not None else 0.0)
            sample_flops = flops.forward(all_lengths)
            generated = sum(len(t.response_tokens) for tr in trajectories for t in tr.turns)
            n_dev = jax.device_count()
            values.update({
                "time/sampling": phase["sampling"], "time/evaluation": phase["evaluation"],
                "time/episode": phase["episode"], "perf/episode_wall_over_max": phase["wall_over_max"],
                "time/rollout": rollout_s, "time/update": update_s, "time/gradients": gradients_s,
                "time/optimizer": optimizer_s,
                "perf/mfu_update": logs.mfu(update_flops, update_s, n_dev, peak),
                "perf/mfu_gradients": logs.mfu(update_flops, gradients_s, n_dev, peak),
                "perf/mfu_sampling": logs.mfu(sample_flops, phase["sampling"], n_dev, peak),
                "perf/generated_tokens_per_s": generated / max(phase["sampling"], 1e-9),
                "perf/update_tokens_per_s": sum(lengths) * spec.rl.updates_per_batch / max(update_s, 1e-9),
                "batch/samples_total": float(sample_set.total), "batch/samples_trained": float(len(lengths)),
                "batch/skipped_zero_advantage": float(sample_set.skipped_zero_advantage),
                "batch/micro_batches": float(layout.num_micro if layout else 0),
                "batch/row_len": float(layout.row_len if layout else 0),      # the longest row
                "batch/shapes": float(len(set(layout.micro_shapes())) if layout else 0),
                "batch/padding_fraction": (1 - sum(lengths) / layout.padded_tokens) if layout else 0.0,
                "batch/max_response_tokens": float(runner.env.max_response_tokens),
            })
            if is_main and spec.log.trajectories:
                write_trajectories(step_path(workdir / "trajectories", step), trajectories)

            # 5. checkpoint, held-out evaluation
            t0 = time.perf_counter()
            if checkpointer.due(step, spec.total_steps):
                meta = {"step": step, "seed": spec.seed, "updates": spec.rl.updates_per_batch * step,
                        "rng": {"seed": spec.seed,
                                "rule": "sampling seed = env.episode.round_seed(seed, step, round, group)"},
                        "task_sampler": sampler_tasks.state(step), "split": split.to_dict(),
                        "compile_only": compile_only}
                checkpointer.save(step, saved_view(state), meta)
            values["time/checkpoint"] = time.perf_counter() - t0
            values["time/step"] = time.perf_counter() - t_step
            values.update(logs.memory_scalars(local_devices))
            values["perf/mfu_step"] = logs.mfu(update_flops + sample_flops, values["time/step"], n_dev, peak)
            writer.write(step, values)
            last = values
            log.info("%sstep %d/%d: score %.3f, %s %.2f, %s, sampling %.1fs (%.0f tokens/s), evaluation %.1fs, "
                     "episode %.1fs (%.2f x max), update %.1fs (gradients %.1fs, MFU %s; optimizer %.1fs), "
                     "checkpoint %.1fs, step %.1fs; peak HBM %s, host RSS %.1f GB (peak %.1f)", tag, step,
                     spec.total_steps, values.get("rollout/score_mean", 0.0),
                     "compiled" if compile_only else "correct",
                     values.get("rollout/compiled_rate" if compile_only else "rollout/correct_rate", 0.0),
                     speed_metrics.log_text(values, "rollout/speed/"),
                     phase["sampling"], values["perf/generated_tokens_per_s"], phase["evaluation"], phase["episode"],
                     phase["wall_over_max"], update_s, gradients_s,
                     f"{values['perf/mfu_gradients']:.1%}" if np.isfinite(values["perf/mfu_gradients"])
                     else "n/a (CPU)", optimizer_s, values["time/checkpoint"], values["time/step"],
                     f"{values['mem/hbm_peak_gb']:.1f} GB" if "mem/hbm_peak_gb" in values else "n/a",
                     values["mem/host_rss_gb"], values["mem/host_rss_peak_gb"])
            progress.update(_headline(values, compile_only))

            holdout_due = spec.holdout.every_steps and step % spec.holdout.every_steps == 0
            if holdout_tasks and (holdout_due or (spec.holdout.at_end and step == spec.total_steps)):
                t0 = time.perf_counter()
                policy.set_model(nnx.merge(graphdef, multihost.sampling_view(state["params"], local_mesh)))
                runner.env = dataclasses.replace(spec.env, num_trajectories=spec.holdout.num_trajectories,
                                                 max_response_tokens=spec.max_response_tokens(step))
                held, _ = run_episodes(runner, holdout_tasks, step, _holdout_seed(spec.seed), spec.advantage)
                scalars = {f"holdout/{k}": v for k, v in rollout_stats.rollout_scalars(
                    held, spec.env.num_turns, spec.log.thought_prefix).items()}
                scalars["time/holdout"] = time.perf_counter() - t0
                writer.write(step, scalars)
                if is_main and spec.log.trajectories:
                    write_trajectories(step_path(workdir / "holdout", step), held)
                if spec.rl.replay:
                    _write_replayed(step_path(workdir / "replay" / "holdout", step), runner.take_replayed(),
                                    is_main)
                log.info("%sheld-out after step %d: score %.3f on %d tasks", tag, step,
                         scalars.get("holdout/score_mean", 0.0), len(holdout_tasks))
                last.update(scalars)
        checkpointer.wait()
        if checkpointer.last_save_s is not None and checkpointer.last_save_s != last_save_logged:
            log.info("last checkpoint written in %.1f s", checkpointer.last_save_s)
    return {prefix + k: v for k, v in last.items()} if last else {}
