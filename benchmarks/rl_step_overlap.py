"""The rollout half of RL steps with the sequential and the overlapped episode runner, side by side (same seed).

    python benchmarks/rl_step_overlap.py --config configs/one_gpu.py --steps 1 --out $OUT/overlap.json     # a GPU
    python benchmarks/rl_step_overlap.py --config configs/tiny_cpu.py --steps 2 \\
        --warm-checkpoint /tmp/kevin_jax_tests/warm_tiny_v2                                          # CPU smoke

Builds the config's starting policy (its warm start, or --warm-checkpoint: an HF checkpoint dir, e.g. launch/sft.py's
output or the tests' warm tiny policy), then for each step 1..N draws the step's tasks as the trainer does and rolls
them out with each runner variant (the round loop of kevin_jax/env/episode.py):
  sequential   env.overlap=False, pipeline_groups=1: one policy call and one evaluation per round (the old runner)
  grouped      env.overlap=False, pipeline_groups=G: the overlapped runner's calls, one after the other
  overlapped   env.overlap=True,  pipeline_groups=G: a group evaluated while another samples
grouped and overlapped produce the same trajectories (the script checks it, up to verdict timing noise on a GPU); the
sequential runner draws other samples (one call per round, other seeds), so its evaluation work differs a little.
The update is left out: the runner does not change it, and the policy stays the same for every variant and step.
Each variant has its own evaluator with a fresh build cache (no variant compiles for another); they run one after
the other, in the order given, within each step. A JAX warm-up (not timed) first compiles the sampler's shapes.

Prints a table: per step and variant, the episode's wall, the policy busy (sampling), the wall time with an
evaluation outstanding (evaluation), their sum and max, wall / max (1.0 = fully overlapped), the speedup of the
wall against the sequential runner, the answers judged, and on a GPU shared by sampler and evaluator the time the
sampler waited for kernel timings (its DeviceShare; part of sampling); and writes it with each part's timestamps as
JSON (--out).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = {"sequential": (False, 1), "grouped": (False, None), "overlapped": (True, None)}

log = logging.getLogger("rl_step_overlap")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "tiny_cpu.py"), help="a config file (get_config())")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set env.num_turns=2 (repeatable)")
    p.add_argument("--steps", type=int, default=2, help="RL steps rolled out per variant")
    p.add_argument("--first-step", type=int, default=1)
    p.add_argument("--groups", type=int, default=0, help="pipeline groups of grouped/overlapped (0: the config's, "
                                                         "or 2 where the config has 1)")
    p.add_argument("--variants", default="sequential,grouped,overlapped", help="which runners, in this order")
    p.add_argument("--warm-checkpoint", default="", help="an HF checkpoint dir to start from (no warm start)")
    p.add_argument("--cache-root", default="", help="where each variant's fresh build cache goes (default: temp)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed JAX warm-up")
    p.add_argument("--out", default="", help="write the results as JSON here")
    return p.parse_args(argv)


def load_config(path: str, overrides: list[str], warm_checkpoint: str):
    spec = importlib.util.spec_from_file_location("bench_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    sets = list(overrides)
    if warm_checkpoint:
        sets = [f"model.shape=", f"model.hf_checkpoint={warm_checkpoint}", "warm_start.steps=0"] + sets
    for item in sets:
        key, _, text = item.partition("=")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        node = config
        *parents, leaf = key.split(".")
        for name in parents:
            node = node[name]
        node[leaf] = value
    return config


def warm_up(policy, runner, tasks, groups: int, max_new_tokens: int) -> float:
    """Untimed: compiles the sampler's prefill and decode shapes for first-turn prompts and longer (refinement-sized)
    ones, at the batch sizes of one call per round and of one call per group."""
    t0 = time.perf_counter()
    first = [runner.renderer.first_turn(t.source).token_ids for t in tasks]
    n = runner.env.num_trajectories
    from kevin_jax.env.submissions import split_groups
    sizes = sorted({len(tasks) * n} | {len(g) * n for g in split_groups(list(tasks), groups)})
    limit = runner.env.max_prompt_tokens
    for extra in (0, 700, 1500):        # refinement prompts: the first one and some of its tokens again
        prompts = [(list(p) + (list(p[-extra:]) if extra else []))[:limit] for p in first for _ in range(n)]
        for size in sizes:
            policy.generate(prompts[:size], max_new_tokens, seed=12345)
    return time.perf_counter() - t0


def kernel_counts(trajectories) -> dict:
    turns = [t for tr in trajectories for t in tr.turns]
    return {"answers": len(turns),
            "compiled": sum(t.verdict.get("compiled") is True for t in turns),
            "correct": sum(t.verdict.get("correct") is True and not t.verdict.get("hack_flags") for t in turns),
            "generated_tokens": sum(len(t.response_tokens) for t in turns),
            "eval_failures": sum(bool((t.verdict.get("meta") or {}).get("internal_error")) for t in turns)}


def same_trajectories(a, b) -> bool:
    """Tokens, prompts, request ids and turn order equal (verdicts may differ by timing noise on a GPU)."""
    def key(trs):
        return [(t.task_id, t.traj_index, [(u.turn, u.prompt_tokens, u.response_tokens, u.verdict.get("request_id"))
                                           for u in t.turns]) for t in trs]
    return key(a) == key(b)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = load_config(args.config, args.set, args.warm_checkpoint)

    # GPU placement before JAX starts, as launch/train.py does
    from cuda_eval.api import Evaluator, visible_gpu_count
    from kevin_jax.placement import GpuConfig, apply_gpu_placement, require_gpu_for_kernels, shared_gpus
    num_gpus = visible_gpu_count()
    apply_gpu_placement(GpuConfig(**config.gpu), config.eval.devices, num_gpus)

    import jax
    from flax import nnx

    from kevin_jax import multihost
    from kevin_jax.env.episode import EpisodeRunner
    from kevin_jax.env.submissions import share_gpus_with_evaluator
    from kevin_jax.policy_init import run_tokenizer, starting_params
    from kevin_jax.rl.task_sampler import TaskSampler
    from kevin_jax.run_config import parse_config
    from kevin_jax.sampler import SamplerPolicy
    from kevin_jax.tasks import load_tasks, resolve_split, select

    spec = parse_config(config)
    require_gpu_for_kernels(spec.eval, num_gpus, "no GPU: use a compile-only config (configs/tiny_cpu.py)")
    groups = args.groups or (spec.env.pipeline_groups if spec.env.pipeline_groups > 1 else 2)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")

    t0 = time.perf_counter()
    tokenizer = run_tokenizer(spec)
    tasks = load_tasks(spec.tasks).tasks
    train_tasks = select(tasks, resolve_split(tasks, spec.tasks), "train")
    global_mesh, local_mesh = multihost.build_meshes(spec.mesh)
    graphdef, params, warm_stats = starting_params(spec, global_mesh, train_tasks, tokenizer)
    policy = SamplerPolicy(nnx.merge(graphdef, multihost.sampling_view(params, local_mesh)), spec.sampler,
                           tokenizer=tokenizer, mesh=local_mesh)
    start_s = time.perf_counter() - t0
    log.info("policy ready in %.0f s (%s)", start_s, "warm start" if spec.warm_start.steps else "no warm start")
    sampler = TaskSampler([t.task_id for t in train_tasks], spec.rl.tasks_per_step, spec.seed)
    by_id = {t.task_id: t for t in tasks}

    # the sandbox uids must read the build cache: a 0755 folder under /var/tmp, not mkdtemp's private 0700 in /tmp
    if args.cache_root:
        cache_root = Path(args.cache_root)
    else:
        parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
        cache_root = Path(tempfile.mkdtemp(prefix="rl_step_overlap_", dir=parent))
        cache_root.chmod(0o755)
    gpus = shared_gpus(spec.gpu.jax_devices, spec.eval.devices, num_gpus)
    rows, parts = [], {}
    with contextlib.ExitStack() as stack:
        evaluators, runners = {}, {}
        for name in variants:
            overlap, g = VARIANTS[name]
            cache = cache_root / name
            cache.mkdir(mode=0o755, parents=True, exist_ok=True)
            evaluators[name] = stack.enter_context(Evaluator(dataclasses.replace(spec.eval, cache_dir=str(cache))))
            env = dataclasses.replace(spec.env, overlap=overlap, pipeline_groups=g or groups)
            runners[name] = EpisodeRunner(policy, evaluators[name], tokenizer, env, spec.reward)
        mode = getattr(next(iter(evaluators.values())), "mode", "full")
        steps = range(args.first_step, args.first_step + args.steps)
        warmup_s = 0.0
        if not args.no_warmup:
            first_tasks = [by_id[i] for i in sampler.tasks_for_step(args.first_step)]
            warmup_s = warm_up(policy, next(iter(runners.values())), first_tasks, groups,
                               2 * spec.sampler.decode_steps)
            log.info("JAX warm-up: %.0f s (not timed)", warmup_s)
        for step in steps:
            step_tasks = [by_id[i] for i in sampler.tasks_for_step(step)]
            results = {}
            for name in variants:
                shares = share_gpus_with_evaluator(policy, evaluators[name], gpus)
                waited = sum(getattr(s, "waited_s", 0.0) for s in shares)
                runner = runners[name]
                runner.env = dataclasses.replace(runner.env, max_response_tokens=spec.max_response_tokens(step))
                result = runner.run(step_tasks, step=step, seed=spec.seed)
                results[name] = result
                t = result.timing
                rows.append({"step": step, "variant": name, "overlap": t.overlap, "groups": t.groups,
                             "wall_s": t.wall_s, "sampling_s": t.sampling_s, "evaluation_s": t.evaluation_s,
                             "sum_s": t.sampling_s + t.evaluation_s, "max_s": max(t.sampling_s, t.evaluation_s),
                             "wall_over_max": t.wall_over_max, **kernel_counts(result.trajectories),
                             # the sampler's waits for kernel timings (inside sampling_s), on a shared GPU
                             "share_wait_s": sum(getattr(s, "waited_s", 0.0) for s in shares) - waited})
                parts[f"{step}/{name}"] = [dataclasses.asdict(p) for p in t.parts]
                log.info("step %d %s: wall %.1f s, sampling %.1f s, evaluation %.1f s, wall/max %.2f", step, name,
                         t.wall_s, t.sampling_s, t.evaluation_s, t.wall_over_max)
            if "grouped" in results and "overlapped" in results:
                same = same_trajectories(results["grouped"].trajectories, results["overlapped"].trajectories)
                for row in rows[-len(variants):]:
                    row["same_as_grouped"] = same
                if not same:
                    log.warning("step %d: grouped and overlapped trajectories differ (on a GPU, a verdict that "
                                "timing noise turned changes the next prompt)", step)
    base = {r["step"]: r["wall_s"] for r in rows if r["variant"] == "sequential"}
    for r in rows:
        r["speedup_vs_sequential"] = base[r["step"]] / r["wall_s"] if r["step"] in base else None

    device = jax.devices()[0].device_kind
    print(f"\nrollout of {args.steps} RL step(s) of {Path(args.config).name} on {device} ({os.cpu_count()} cores), "
          f"evaluator {mode}, {spec.rl.tasks_per_step} tasks x {spec.env.num_trajectories} trajectories x "
          f"{spec.env.num_turns} turns, {groups} pipeline groups")
    header = ("step", "variant", "groups", "wall s", "sampling s", "evaluation s", "sum s", "max s", "wall/max",
              "speedup", "answers", "compiled", "correct", "sampler waited for timing s")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows + _totals(rows, variants):
        speed = f"{r['speedup_vs_sequential']:.2f}x" if r.get("speedup_vs_sequential") else "-"
        print(f"| {r['step']} | {r['variant']} | {r['groups']} | {r['wall_s']:.1f} | {r['sampling_s']:.1f} | "
              f"{r['evaluation_s']:.1f} | {r['sum_s']:.1f} | {r['max_s']:.1f} | {r['wall_over_max']:.2f} | {speed} | "
              f"{r['answers']} | {r['compiled']} | {r['correct']} | {r.get('share_wait_s', 0.0):.1f} |")
    same = [r.get("same_as_grouped") for r in rows if "same_as_grouped" in r]
    if same:
        print(f"grouped and overlapped trajectories identical: {all(same)}")
    print(f"start-up (policy{', warm start' if spec.warm_start.steps else ''}) {start_s:.0f} s, "
          f"JAX warm-up {warmup_s:.0f} s (neither timed)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "config": args.config, "overrides": args.set, "warm_checkpoint": args.warm_checkpoint,
            "device": device, "cpu_count": os.cpu_count(), "evaluator_mode": mode, "groups": groups,
            "start_s": start_s, "warmup_s": warmup_s, "warm_start": warm_stats, "rows": rows, "parts": parts},
            indent=1, default=str))
    return 0


def _totals(rows, variants):
    out = []
    for name in variants:
        mine = [r for r in rows if r["variant"] == name]
        if len(mine) < 2:
            continue
        total = {k: sum(r[k] for r in mine) for k in ("wall_s", "sampling_s", "evaluation_s", "sum_s", "max_s",
                                                      "answers", "compiled", "correct", "share_wait_s")}
        total.update(step="all", variant=name, groups=mine[0]["groups"],
                     wall_over_max=total["wall_s"] / max(total["max_s"], 1e-9))
        seq = [r for r in rows if r["variant"] == "sequential"]
        total["speedup_vs_sequential"] = (sum(r["wall_s"] for r in seq) / total["wall_s"]) if seq else None
        out.append(total)
    return out


if __name__ == "__main__":
    sys.exit(main())
