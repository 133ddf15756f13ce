"""Evaluate a policy on held-out tasks with Kevin's metrics (kevin_jax.evaluation.pipeline.run with absl flags).

    # the newest checkpoint of a training run, on the held-out tasks of its own split
    python launch/eval.py --config=configs/one_gpu.py --checkpoint=/tmp/kevin_one_gpu --out=/tmp/eval_one_gpu
    # Kevin's setting: 16 trajectories x 4 turns, speedups vs eager and torch.compile side by side
    python launch/eval.py --config=configs/kevin32b.py --config.model.hf_checkpoint=/ckpt/QwQ-32B \\
        --checkpoint=/ckpt/kevin32b --out=/ckpt/kevin32b/eval --config.env.num_trajectories=16 \\
        --torch_compile_baseline
    # no sampling: recompute metrics from saved verdicts / evaluate the saved responses again / another model's
    python launch/eval.py --config=... --rescore=/tmp/eval_one_gpu/trajectories.jsonl --out=/tmp/rescored
    python launch/eval.py --config=... --reevaluate=/tmp/eval_one_gpu/trajectories.jsonl --out=/tmp/re \\
        --config.eval.atol=1e-3
    python launch/eval.py --config=... --export_prompts=/tmp/prompts.jsonl        # give these to another model
    python launch/eval.py --config=... --external=/tmp/other_model.jsonl --out=/tmp/eval_other
    # the same answers under Kevin's rules and KernelBench's (EvalConfig.profile), tables side by side
    python launch/eval.py --config=... --external=/tmp/other_model.jsonl --out=/tmp/eval_other \\
        --profiles=kevin,kernelbench
    # the per-kernel profile of each task's best kernel (kernels, launch configuration, registers, spills,
    # occupancy, bytes and FLOPs over its time; cuda_eval.api.profile_breakdown) in <out>/kernel_profiles.txt
    python launch/eval.py --config=... --checkpoint=... --out=... --profile
    # a Hugging Face checkpoint directory a user brings (Kevin-32B's float32 shards, or bf16 ones): streamed onto the
    # GPUs shard by shard, tensor by tensor, cast to bf16 on the way; Kevin's protocol: 16 trajectories x 8 turns
    python launch/eval.py --config=configs/kevin32b.py --checkpoint=/ckpt/Kevin-32B --out=/ckpt/kevin32b-eval \\
        --config.tasks.kernelbench_dir=/data/KernelBench --trajectories=16 --turns=8
    # test-time beam search: keep the 4 best of 16 trajectories after every turn, copy each 4 times
    python launch/eval.py --config=... --checkpoint=... --out=... --beam_width=4 --beam_block_turns=1

Without --checkpoint the config's starting policy is evaluated (its HF checkpoint, or its shape's seeded init and
warm start). An HF checkpoint directory as --checkpoint is evaluated as it is: its config.json is the architecture
(checked against the config's model.shape or model.hf_checkpoint when it names one; configs/kevin32b.py names none),
a bad path, a missing shard or tensor, or another architecture is an error before any device work. Trajectories,
turns (or --trajectories / --turns), sampling and evaluator settings come from the config (--config.env.*,
--config.sampler.*, --config.eval.*). Outputs in --out: table.txt, metrics.json, trajectories.jsonl, tensorboard/,
turns.png, best_at_k.png, fixed_budget.png.
"""
import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)      # configs/*.py import configs.common

from kevin_jax import run_config  # noqa: E402  (no jax: the GPU placement is set before JAX starts)

_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(REPO_ROOT, "configs", "one_gpu.py"),
                                          "Run config (the one the policy was trained with).", lock_config=True)
_OUT = flags.DEFINE_string("out", "", "Output directory.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Training workdir (or its checkpoints/ dir), or a Hugging Face "
                                  "checkpoint directory, to evaluate; empty: the config's starting policy.")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step (-1: the newest).")
_PART = flags.DEFINE_enum("part", "holdout", ["holdout", "train", "all"], "Which tasks of the split.")
_TASKS = flags.DEFINE_list("tasks", [], "Explicit task ids, e.g. L1/1_LeakyReLU (overrides --part).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_KS = flags.DEFINE_list("ks", [], "best@k values (default 1, 2, 4, ..., trajectories per task).")
_BUDGETS = flags.DEFINE_list("budgets", [], "Kernel budgets of the fixed-budget comparison (default: the "
                             "trajectories per task).")
_RESCORE = flags.DEFINE_string("rescore", "", "Trajectories JSONL: recompute metrics from its saved verdicts.")
_REEVALUATE = flags.DEFINE_string("reevaluate", "", "Trajectories JSONL: evaluate its responses again.")
_EXTERNAL = flags.DEFINE_string("external", "", "JSONL of {task_id, turn, response[, trajectory]} from elsewhere.")
_BEAM_WIDTH = flags.DEFINE_integer("beam_width", 0, "Test-time beam search: trajectories kept per task (0: off).")
_BEAM_BLOCK = flags.DEFINE_integer("beam_block_turns", 1, "Beam search: turns between prunings.")
_COMPILE = flags.DEFINE_bool("torch_compile_baseline", False, "Also report speedups over torch.compile(reference).")
_EXPORT = flags.DEFINE_string("export_prompts", "", "Write the selected tasks' first-turn prompts here and stop.")
_TITLE = flags.DEFINE_string("title", "", "Report title.")
_TRAJECTORIES = flags.DEFINE_integer("trajectories", 0, "Trajectories per task (0: the config's "
                                     "env.num_trajectories; Kevin's evaluation: 16).", lower_bound=0)
_TURNS = flags.DEFINE_integer("turns", 0, "Turns per trajectory (0: the config's env.num_turns; Kevin trains with 4 "
                              "and evaluates with 8).", lower_bound=0)
_PROFILE = flags.DEFINE_bool("profile", False, "Profile every correct kernel after its verdict (advisory, never a "
                              "score) and report the per-kernel breakdown of each task's best kernel: "
                              "<out>/kernel_profiles.txt, also appended to table.txt.")
_PROFILES = flags.DEFINE_list("profiles", [], "Score under each of these evaluation profiles (cuda_eval.api.EvalConfig.profile, "
                              "e.g. kevin,kernelbench): one evaluation per profile in <out>/<profile>/, their tables "
                              "printed side by side. With --external or --reevaluate (the same answers each time).")


def _ints(values, name):
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        raise app.UsageError(f"--{name} takes comma-separated integers, got {values}") from None


def _run_profiles(config, options, names):
    """The same answers scored under each profile, then the tables side by side."""
    import copy
    import dataclasses

    from cuda_eval.api import EvalConfig
    from kevin_jax.evaluation import pipeline, report
    for name in names:
        EvalConfig(profile=name)               # an unknown name fails before any work
    if not (options.external or options.reevaluate):
        raise ValueError("--profiles scores saved answers: give --external or --reevaluate")
    if not options.out_dir:
        raise ValueError("an output directory is required (--out)")
    tables = {}
    for name in names:
        cfg = copy.deepcopy(config)
        cfg.eval.profile = name
        out_dir = os.path.join(options.out_dir, name)
        pipeline.run(cfg, dataclasses.replace(options, out_dir=out_dir))
        if _PROFILE.value:
            _write_profile_report(out_dir)
        with open(os.path.join(out_dir, "table.txt")) as f:
            tables[f"profile {name}"] = f.read()
    text = report.side_by_side(tables)
    with open(os.path.join(options.out_dir, "profiles.txt"), "w") as f:
        f.write(text)
    print(text)


def _write_profile_report(out_dir):
    """--profile: each task's best kernel, kernel by kernel, from the saved verdicts (meta.kernel_profile)."""
    from kevin_jax.env.trajectory import read_trajectories
    from kevin_jax.evaluation.report import best_kernel_report
    trajectories, _ = read_trajectories(os.path.join(out_dir, "trajectories.jsonl"))
    text = best_kernel_report(trajectories)
    text = "Per-kernel profile of each task's best kernel (GPU time per forward)\n\n" + text + "\n"
    with open(os.path.join(out_dir, "kernel_profiles.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "table.txt"), "a") as f:
        f.write("\n" + text)
    print(text)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    # GPU placement goes into the environment before anything imports jax (shared GPU: JAX capped).
    from cuda_eval.api import visible_gpu_count
    from kevin_jax.placement import GpuConfig, NoGpuError, apply_gpu_placement
    apply_gpu_placement(GpuConfig(**config.gpu), config.eval.devices, visible_gpu_count())
    if _PROFILE.value:
        config.eval.kernel_profile = True

    from kevin_jax.evaluation import pipeline
    try:
        options = pipeline.EvalOptions(
            out_dir=_OUT.value, checkpoint=_CHECKPOINT.value, step=_STEP.value, part=_PART.value,
            tasks=tuple(_TASKS.value), seed=_SEED.value, ks=_ints(_KS.value, "ks"),
            budgets=_ints(_BUDGETS.value, "budgets"), rescore=_RESCORE.value, reevaluate=_REEVALUATE.value,
            external=_EXTERNAL.value, beam_width=_BEAM_WIDTH.value, beam_block_turns=_BEAM_BLOCK.value,
            torch_compile_baseline=_COMPILE.value, export_prompts=_EXPORT.value, title=_TITLE.value,
            num_trajectories=_TRAJECTORIES.value, num_turns=_TURNS.value)
        if options.export_prompts:
            pipeline.export_prompts(config, options)
        elif _PROFILES.value:
            _run_profiles(config, options, _PROFILES.value)
        else:
            pipeline.run(config, options)
            if _PROFILE.value and not options.export_prompts:
                _write_profile_report(options.out_dir)
    except (ValueError, FileNotFoundError) as e:      # bad input: the message says what to change
        logging.debug("traceback", exc_info=True)
        logging.error("%s", e)
        sys.exit(2)
    except NoGpuError as e:
        logging.error("%s", e)
        sys.exit(2)


if __name__ == "__main__":
    run_config.launch(main)
