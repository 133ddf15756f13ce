"""One evaluation, start to finish (launch/eval.py parses flags and calls `run`).

Where the trajectories come from (exactly one):
  policy       sample the policy (a training checkpoint, a Hugging Face checkpoint directory, or the config's
               starting policy) on the selected tasks: env.num_trajectories x env.num_turns per task (or the
               options' counts; Kevin's protocol: 16 x 8), optionally as a beam search (BeamConfig)
  rescore      saved trajectories: metrics from their saved verdicts, scores recomputed under config.reward
  reevaluate   saved trajectories: every response evaluated again by cuda_eval (e.g. after changing its tolerance)
  external     responses produced elsewhere (external.py's JSONL)
Then Kevin's metrics (metrics.py) and every output into `out_dir`: trajectories.jsonl (Contract 4), metrics.json
(every number, the input report, the config), table.txt (what the console showed), tensorboard/, turns.png,
best_at_k.png, fixed_budget.png (and beam.json / beam_pruned.jsonl for a beam search).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from cuda_eval.api import EvalConfig, Evaluator, visible_gpu_count
from kevin_jax.env import episode
from kevin_jax.env.submissions import share_gpus_with_evaluator
from kevin_jax.env.trajectory import InputReport, Trajectory, read_trajectories, write_trajectories
from kevin_jax.evaluation import external as external_lib
from kevin_jax.evaluation import metrics as metrics_lib
from kevin_jax.evaluation import report
from kevin_jax.evaluation.beam import BeamConfig, BeamSearch, beam_summary
from kevin_jax.placement import require_gpu_for_kernels, shared_gpus
from kevin_jax.rl import advantages
from kevin_jax.run_config import RunSpec, as_dict, parse_config
from kevin_jax.tasks import Split, Task, check_known_tasks, load_split, load_tasks, resolve_split, select

log = logging.getLogger(__name__)

PARTS = ("holdout", "train", "all")
NO_GPU_MESSAGE = (
    "evaluating kernels needs an NVIDIA GPU (correctness and speed are measured by running them), and none is "
    "visible here. On a machine without one, ask for compile-only verdicts explicitly (nvcc compiles each kernel, "
    "nothing runs, and the report says 'compiled' instead of 'correct'): --config.eval.mode=compile_only, e.g. "
    "with --config=configs/tiny_cpu.py")


@dataclasses.dataclass
class EvalOptions:
    """What an evaluation does beyond the run config (launch/eval.py's flags).

    out_dir: where every output goes.
    checkpoint: a training workdir (or its checkpoints/ dir) whose policy to evaluate, or a Hugging Face checkpoint
      directory (policy_source.hf_checkpoint_config); "" = the config's starting policy (config.model.hf_checkpoint,
      or model.shape's init + the configured warm start).
    step: checkpoint step (-1 = the newest).
    part: which tasks of the split: "holdout" (default; the checkpoint's own split when it has one), "train", "all".
    tasks: explicit task ids (overrides part).
    seed: sampling seed (sampling seeds are a function of seed, checkpoint step and round).
    ks: best@k values (default 1, 2, 4, ..., n). budgets: fixed-budget kernel counts (default n).
    rescore / reevaluate / external: a JSONL file to score instead of sampling a policy (see the module doc).
    beam_width, beam_block_turns: test-time beam search (beam_width 0 = off).
    torch_compile_baseline: also time torch.compile(reference) and report speedups over it side by side.
    export_prompts: write the selected tasks' first-turn prompts to this JSONL and stop (for --external runs).
    title: the report's title (default: describes the source).
    num_trajectories, num_turns: trajectories per task and turns per trajectory (0 = the config's env values).
    """
    out_dir: str
    checkpoint: str = ""
    step: int = -1
    part: str = "holdout"
    tasks: tuple[str, ...] = ()
    seed: int = 0
    ks: tuple[int, ...] = ()
    budgets: tuple[int, ...] = ()
    rescore: str = ""
    reevaluate: str = ""
    external: str = ""
    beam_width: int = 0
    beam_block_turns: int = 1
    torch_compile_baseline: bool = False
    export_prompts: str = ""
    title: str = ""
    num_trajectories: int = 0
    num_turns: int = 0

    def __post_init__(self):
        if self.num_trajectories < 0 or self.num_turns < 0:
            raise ValueError("num_trajectories and num_turns must be >= 0 (0 = the config's env values)")
        if self.part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {self.part!r}")
        sources = [name for name in ("rescore", "reevaluate", "external") if getattr(self, name)]
        if len(sources) > 1:
            raise ValueError(f"choose one of --rescore, --reevaluate, --external (got {sources})")
        if sources and (self.checkpoint or self.beam_width):
            raise ValueError(f"--{sources[0]} scores a file: it takes no --checkpoint or --beam_width")
        if self.beam_width < 0 or self.beam_block_turns < 1:
            raise ValueError("beam_width must be >= 0 (0 = off) and beam_block_turns >= 1")
        if not self.out_dir and not self.export_prompts:
            raise ValueError("an output directory is required (--out)")

    @property
    def source(self) -> str:
        return next((n for n in ("rescore", "reevaluate", "external") if getattr(self, n)), "policy")


@dataclasses.dataclass
class EvalOutcome:
    metrics: dict
    out_dir: Path
    files: dict[str, Path]
    table: str


# ------------------------------------------------------------------------------------------------ pieces
def pick_tasks(all_tasks: Sequence[Task], options: EvalOptions, split: Split | None) -> list[Task]:
    by_id = {t.task_id: t for t in all_tasks}
    if options.tasks:
        check_known_tasks(options.tasks, by_id, "--tasks")
        chosen = [by_id[i] for i in dict.fromkeys(options.tasks)]
    else:
        chosen = select(all_tasks, split, options.part)
    if not chosen:
        raise ValueError(f"no tasks to evaluate: the split's {options.part!r} part is empty ({len(all_tasks)} tasks "
                         f"loaded); use --part=all, name tasks with --tasks, or load more tasks")
    return chosen


def resolve_eval_split(all_tasks: Sequence[Task], spec: RunSpec, checkpoint_split: Split | None,
                       run_dir: Path | None) -> tuple[Split, str]:
    """The split to take holdout/train from: the checkpoint's own, the run's split.json, or the config's."""
    if checkpoint_split is not None:
        return checkpoint_split, "the checkpoint's split"
    if run_dir is not None and (run_dir / "split.json").is_file():
        return load_split(run_dir / "split.json"), f"{run_dir / 'split.json'}"
    return resolve_split(all_tasks, spec.tasks), ("config.tasks.split_file" if spec.tasks.split_file else
                                                 "the config's default split")


def check_can_evaluate(config: EvalConfig) -> None:
    """No GPU and no explicit compile-only request is an error (never a silent compile-only report)."""
    require_gpu_for_kernels(config, visible_gpu_count(), NO_GPU_MESSAGE)


def make_evaluator(config: EvalConfig) -> Evaluator:
    check_can_evaluate(config)
    return Evaluator(config)


def _evaluator_mode(evaluator: Any) -> str | None:
    mode = getattr(evaluator, "mode", None)
    return mode if mode in metrics_lib.MODES else None


def _gpu_names(trajectories) -> list[str]:
    return sorted({str(t.verdict.get("meta", {}).get("gpu_name")) for tr in trajectories for t in tr.turns
                   if isinstance(t.verdict.get("meta"), Mapping) and t.verdict["meta"].get("gpu_name")})


def _times(rounds) -> dict[str, float]:
    return {"sampling_s": float(sum(r.generate_s for r in rounds)),
            "evaluation_s": float(sum(r.evaluate_s for r in rounds)),
            "rounds": [dataclasses.asdict(r) for r in rounds]}


# ------------------------------------------------------------------------------------------------ sampling
def sample_policy(spec: RunSpec, options: EvalOptions, all_tasks: Sequence[Task],
                  get_evaluator: Callable[[], Any], policy: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Rolls out the policy on the selected tasks. `policy`/`tokenizer` may be given (tests); otherwise they are
    built from the config and the checkpoint. The evaluator is asked for (`get_evaluator()`) only once the policy
    and the tasks are known to be fine, so that bad input fails before any worker starts."""
    from kevin_jax import policy_init

    if tokenizer is None:
        tokenizer = policy_init.run_tokenizer(spec)
    description, step, checkpoint_split, run_dir = "policy given by the caller", 0, None, None
    training_checkpoint = bool(options.checkpoint) and not _is_hf_checkpoint(options.checkpoint)
    if training_checkpoint:
        from kevin_jax.evaluation.policy_source import checkpoints_dir
        directory = checkpoints_dir(options.checkpoint)
        run_dir = directory.parent if directory.name == "checkpoints" else None
    if policy is None:
        from kevin_jax import parallel
        from kevin_jax.evaluation import policy_source
        from kevin_jax.sampler import SamplerPolicy

        policy_init.check_vocabulary(tokenizer, policy_init.architecture(spec))
        mesh = parallel.make_mesh(spec.mesh)
        if training_checkpoint:
            loaded = policy_source.restore_checkpoint(spec, mesh, options.checkpoint,
                                                      None if options.step < 0 else options.step)
            checkpoint_split = loaded.split
        else:
            split, _ = resolve_eval_split(all_tasks, spec, None, None)
            warm_tasks = select(all_tasks, split, "train") if spec.warm_start.steps else []
            loaded = policy_source.starting_policy(spec, mesh, warm_tasks, tokenizer)
        description, step = loaded.description, loaded.step
        policy = SamplerPolicy(loaded.model, spec.sampler, tokenizer=tokenizer, mesh=mesh)
    split, split_from = resolve_eval_split(all_tasks, spec, checkpoint_split, run_dir)
    tasks = pick_tasks(all_tasks, options, split)
    env_config = dataclasses.replace(spec.env, max_response_tokens=spec.max_response_tokens(step),
                                     num_trajectories=options.num_trajectories or spec.env.num_trajectories,
                                     num_turns=options.num_turns or spec.env.num_turns)
    if options.beam_width:
        BeamConfig(options.beam_width, options.beam_block_turns).check(env_config.num_trajectories,
                                                                       env_config.num_turns)
    evaluator = get_evaluator()
    # overlapped rounds (env.overlap): on a GPU it shares with the evaluator, the sampler yields to kernel timing
    share_gpus_with_evaluator(policy, evaluator, shared_gpus(spec.gpu.jax_devices, spec.eval.devices,
                                                             visible_gpu_count()))
    runner = episode.EpisodeRunner(policy, evaluator, tokenizer, env_config, spec.reward)
    log.info("evaluating %s on %d task(s) (%s, %s): %d trajectories x %d turns", description, len(tasks),
             "--tasks" if options.tasks else f"part {options.part!r}", split_from, env_config.num_trajectories,
             env_config.num_turns)
    t0 = time.perf_counter()
    trained_on = sorted({t.task_id for t in tasks} & set(split.train)) if checkpoint_split is not None else []
    if trained_on:
        log.warning("%d of the %d evaluated task(s) are in the checkpoint's training split (e.g. %s): these numbers "
                    "are not held-out numbers", len(trained_on), len(tasks), trained_on[:3])
    out: dict[str, Any] = {"source": description, "step": step, "tasks": [t.task_id for t in tasks],
                           "split": "--tasks" if options.tasks else f"{options.part} of {split_from}",
                           "tasks_in_training_split": len(trained_on)}
    if options.beam_width:
        search = BeamSearch(runner, BeamConfig(options.beam_width, options.beam_block_turns),
                            _evaluator_mode(evaluator) or "full")
        result = search.run(tasks, step=step, seed=options.seed)
        out.update(trajectories=result.trajectories, beam=result, rounds=result.rounds)
    else:
        result = runner.run(tasks, step=step, seed=options.seed)
        out.update(trajectories=result.trajectories, rounds=result.rounds)
    advantages.assign_returns(out["trajectories"], spec.reward, spec.advantage)
    out["wall_s"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------------------------------------ the run
def export_prompts(config: Any, options: EvalOptions) -> Path:
    """Writes the selected tasks' first-turn prompts to options.export_prompts (JSONL {task_id, prompt}): what
    another model must answer for its responses to be comparable with ours (then --external)."""
    spec = parse_config(config)
    all_tasks = list(load_tasks(spec.tasks).tasks)
    split, _ = resolve_eval_split(all_tasks, spec, None, None)
    tasks = pick_tasks(all_tasks, options, split)
    path = external_lib.write_prompts(tasks, options.export_prompts,
                                      episode.resolve_gpu_name(spec.env.gpu_name, spec.eval), spec.env.one_shot)
    log.info("wrote the first-turn prompts of %d task(s) to %s", len(tasks), path)
    return path


def run(config: Any, options: EvalOptions, *, evaluator: Any = None, policy: Any = None,
        tokenizer: Any = None) -> EvalOutcome:
    """Runs one evaluation (see the module doc) and writes every output; returns what it computed. `evaluator`,
    `policy` and `tokenizer` may be passed in (tests, notebooks); by default they are built from the config."""
    if not options.out_dir:
        raise ValueError("an output directory is required (--out)")
    if options.checkpoint and not Path(options.checkpoint).is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {Path(options.checkpoint).absolute()}")
    if options.checkpoint and _is_hf_checkpoint(options.checkpoint):
        from kevin_jax.evaluation.policy_source import hf_checkpoint_config
        config = hf_checkpoint_config(config, options.checkpoint)      # before any device work: a bad one fails here
    spec = parse_config(config)
    if options.torch_compile_baseline:
        spec.eval = dataclasses.replace(spec.eval, ref_compile=True)
    all_tasks = list(load_tasks(spec.tasks).tasks)
    by_id = {t.task_id: t for t in all_tasks}
    out_dir = Path(options.out_dir).absolute()
    if evaluator is None and not options.rescore:
        check_can_evaluate(spec.eval)     # before loading a policy for nothing
    input_report: InputReport | None = None
    meta: dict[str, Any] = {"created": datetime.datetime.now().isoformat(timespec="seconds"),
                            "source_kind": options.source, "options": dataclasses.asdict(options)}
    with contextlib.ExitStack() as stack:
        def evaluator_or_default():
            nonlocal evaluator
            if evaluator is None:
                evaluator = stack.enter_context(make_evaluator(spec.eval))
            return evaluator

        beam, dependent = None, False     # dependent: beam-search trajectories, not independent samples
        if options.rescore:
            trajectories, input_report = read_trajectories(options.rescore, one_evaluation=True)
            check_known_tasks({t.task_id for t in trajectories}, by_id, options.rescore)
            trajectories = advantages.rescore(trajectories, spec.reward, spec.advantage)
            meta.update(source=f"saved verdicts of {options.rescore}", step=trajectories[0].step)
            mode = None
            dependent = is_beam_search(trajectories)
        elif options.reevaluate:
            trajectories, input_report = read_trajectories(options.reevaluate, one_evaluation=True)
            check_known_tasks({t.task_id for t in trajectories}, by_id, options.reevaluate)
            dependent = is_beam_search(trajectories)
            t0 = time.perf_counter()
            trajectories = episode.replay(trajectories, evaluator_or_default(), by_id, spec.reward,
                                              spec.env.max_summary_chars)
            advantages.assign_returns(trajectories, spec.reward, spec.advantage)
            meta.update(source=f"responses of {options.reevaluate}, evaluated again", step=trajectories[0].step,
                        times={"evaluation_s": time.perf_counter() - t0})
            mode = _evaluator_mode(evaluator)
        elif options.external:
            responses, input_report = external_lib.load_external(options.external, by_id)
            t0 = time.perf_counter()
            trajectories = external_lib.evaluate_external(responses, by_id, evaluator_or_default(), spec.reward,
                                                          spec.advantage, spec.env.max_summary_chars)
            meta.update(source=f"external responses {options.external}", step=0,
                        times={"evaluation_s": time.perf_counter() - t0})
            mode = _evaluator_mode(evaluator)
        else:
            sampled = sample_policy(spec, options, all_tasks, evaluator_or_default, policy, tokenizer)
            trajectories, beam = sampled.pop("trajectories"), sampled.pop("beam", None)
            dependent = beam is not None
            times = {**_times(sampled.pop("rounds")), "wall_s": sampled.pop("wall_s")}
            meta.update(sampled, times=times)
            mode = _evaluator_mode(evaluator)
        if mode == "compile_only":
            log.warning("[compile-only] kernels were compiled but never run: 'compiled' stands in for 'correct' "
                        "and there is no performance")
        metrics = metrics_lib.compute_metrics(trajectories, ks=options.ks or None, budgets=options.budgets or None,
                                              mode=mode, parallel_samples=not dependent)
    meta.update(gpu_names=_gpu_names(trajectories), config=as_dict(config), num_trajectories=len(trajectories))
    return write_outputs(out_dir, metrics, trajectories, meta, input_report, beam, options.title or _title(meta))


def _is_hf_checkpoint(path: str) -> bool:
    from kevin_jax.model.hf import is_checkpoint_dir
    return is_checkpoint_dir(path)


def is_beam_search(trajectories: Sequence[Trajectory]) -> bool:
    """Trajectories written by a beam search (their request ids say so): not independent samples."""
    return any(str(t.verdict.get("request_id", "")).startswith("beam/") for tr in trajectories for t in tr.turns)


def _title(meta: Mapping[str, Any]) -> str:
    kind = meta.get("source_kind")
    if kind == "policy":
        return f"{meta.get('source')}" + (" [beam search]" if meta["options"].get("beam_width") else "")
    return str(meta.get("source"))


def write_outputs(out_dir: Path, metrics: dict, trajectories: Sequence[Trajectory], meta: dict,
                  input_report: InputReport | None, beam: Any, title: str) -> EvalOutcome:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"trajectories": out_dir / "trajectories.jsonl", "metrics": out_dir / "metrics.json",
             "table": out_dir / "table.txt", "tensorboard": out_dir / "tensorboard"}
    write_trajectories(files["trajectories"], trajectories)
    payload = {"title": title, "meta": meta, "input": input_report.to_dict() if input_report else None,
               "metrics": metrics}
    if beam is not None:
        payload["beam"] = beam_summary(beam)
        files["beam"] = report.write_json(out_dir / "beam.json", {"selections": beam.selections,
                                                                  **beam_summary(beam)})
        files["beam_pruned"] = write_trajectories(out_dir / "beam_pruned.jsonl", beam.pruned)
    for path in report.plot_all(metrics, out_dir, title):
        files[path.stem] = path
    report.write_tensorboard(files["tensorboard"], int(meta.get("step") or 0), report.scalars(metrics))
    notes = []
    if input_report is not None:
        notes.append(input_report.describe())
        notes += [f"  note: {n}" for n in input_report.notes]
    notes.append(f"outputs in {out_dir}: " + ", ".join(sorted(p.name for p in files.values())))
    payload["files"] = {k: str(v) for k, v in files.items()}
    report.write_json(files["metrics"], payload)
    table = report.render(metrics, title, notes)
    files["table"].write_text(table)
    return EvalOutcome(metrics, out_dir, files, table)
