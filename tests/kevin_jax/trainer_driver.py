"""Runs the RL loop in its own process for the trainer tests (resume after SIGKILL, multi-host).

    python trainer_driver.py <workdir> '<json {"dotted.key": value}>' [--real-evaluator] [--kill-at=<phase>:<step>]
    python trainer_driver.py --make-warm-checkpoint <dir>

configs/tiny_cpu.py with the overrides; the evaluator is ParseOnlyEvaluatorFake unless --real-evaluator (cuda_eval,
compile-only with nvcc); --kill-at SIGKILLs the run at that phase of that step (kill_at_phase.py). Prints
"RESULT <json of the last step's scalars>" at the end.
"""
import json
import logging
import os
import shutil
import sys


def make_warm_checkpoint(target: str) -> None:
    from flax import nnx

    import trainer_fakes
    from kevin_jax import multihost, policy_init, run_config
    from kevin_jax.model import hf
    from kevin_jax.model.tokenizer import BUILTIN_DIR, load_tokenizer
    from kevin_jax.tasks import load_tasks, resolve_split, select

    spec = run_config.parse_config(trainer_fakes.tiny_config())
    tasks = load_tasks(spec.tasks).tasks
    split = resolve_split(tasks, spec.tasks)
    mesh, _ = multihost.build_meshes(spec.mesh)
    graphdef, params, stats = policy_init.starting_params(spec, mesh, select(tasks, split, "train"), load_tokenizer())
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    hf.save_hf_checkpoint(nnx.merge(graphdef, params), tmp, dtype=None, tokenizer_dir=BUILTIN_DIR)
    with open(os.path.join(tmp, "warm_start.json"), "w") as f:
        json.dump(stats, f)
    os.replace(tmp, target)
    print("WARM", json.dumps(stats))


def main(argv):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if argv[1] == "--make-warm-checkpoint":
        make_warm_checkpoint(argv[2])
        return
    import trainer_fakes
    from kill_at_phase import KillAt
    from kevin_jax import train

    workdir, overrides = argv[1], json.loads(argv[2])
    config = trainer_fakes.tiny_config(**overrides)
    evaluator = None if "--real-evaluator" in argv else trainer_fakes.ParseOnlyEvaluatorFake()
    kill_at = [a.split("=", 1)[1] for a in argv if a.startswith("--kill-at=")]
    if kill_at:
        phase, step = kill_at[0].split(":")
        kill = KillAt(phase, int(step))
        kill.install()
        evaluator = evaluator and kill.wrap_evaluator(evaluator)
    result = train.run(config, workdir, evaluator=evaluator)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv)
