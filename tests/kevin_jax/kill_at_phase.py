"""Kill a training run with SIGKILL at a named phase of a named step, as a crash would, to show that the same command
resumes it to the run it would have been (tests/kevin_jax/test_resume.py, test_train_e2e.py, and on a GPU node
runs/kevin32b.sh):

    python tests/kevin_jax/kill_at_phase.py --kill_at_phase=checkpoint --kill_at_step=2 \\
        --config=configs/kevin32b.py --workdir=/ckpt/run ...     # then launch/train.py with the same flags resumes

Takes launch/train.py's flags and runs its main. Phases: "sampling" (after the step's first sampler call),
"evaluation" (once the step's first batch of answers is handed to the evaluator, with it in flight), "update"
(between the step's two optimiser updates), "checkpoint" (right after the step's checkpoint write began; with
ckpt.async_save, while it is being written). The product has no kill switch: `KillAt.install` wraps the trainer's
pieces from outside (kevin_jax.train.run_episodes to know the step; SamplerPolicy.generate and its stream's advance,
the evaluator,
Updater.update and Checkpointer.save for the phases). tests/kevin_jax/trainer_driver.py uses it the same way.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PHASES = ("sampling", "evaluation", "update", "checkpoint")
log = logging.getLogger("kill_at_phase")


class KillAt:
    """SIGKILLs this process when `phase` is reached during step `step`."""

    def __init__(self, phase: str, step: int):
        if phase not in PHASES:
            raise ValueError(f"kill_at_phase must be one of {PHASES}, got {phase!r}")
        if step < 1:
            raise ValueError(f"kill_at_step must be a training step (>= 1), got {step}")
        self.phase, self.step = phase, step
        self.current_step: int | None = None

    def __call__(self, phase: str) -> None:
        if phase == self.phase and self.current_step == self.step:
            log.warning("kill_at_phase: SIGKILL during %s of step %d", phase, self.step)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        """Wraps the trainer's pieces (import after the GPU placement: this imports JAX)."""
        from kevin_jax import checkpoint, train
        from kevin_jax.rl import state
        from kevin_jax.sampler import policy

        def after(original, phase):
            def wrapped(*args, **kwargs):
                out = original(*args, **kwargs)
                self(phase)
                return out
            return wrapped

        run_episodes = train.run_episodes

        def run_episodes_of_step(runner, tasks, step, *args, **kwargs):
            self.current_step = step
            return run_episodes(runner, tasks, step, *args, **kwargs)

        make_evaluator = train.make_evaluator
        train.run_episodes = run_episodes_of_step
        train.make_evaluator = lambda spec: self.wrap_evaluator(make_evaluator(spec))
        policy.SamplerPolicy.generate = after(policy.SamplerPolicy.generate, "sampling")
        # with env.stream_rounds the rounds are decoded through the policy's stream, not `generate`
        policy.PolicyStreamOfSampler.advance = after(policy.PolicyStreamOfSampler.advance, "sampling")
        state.Updater.update = after(state.Updater.update, "update")
        checkpoint.Checkpointer.save = after(checkpoint.Checkpointer.save, "checkpoint")

    def wrap_evaluator(self, evaluator):
        return _KillingEvaluator(evaluator, self)


class _KillingEvaluator:
    """The evaluator, killing the process once a batch is handed over (`submit`) or judged (`evaluate`, for an
    evaluator without `submit`); everything else (mode, device_share, the context manager) is the evaluator's."""

    def __init__(self, evaluator, kill: KillAt):
        self._evaluator, self._kill = evaluator, kill

    def __getattr__(self, name):
        return getattr(self._evaluator, name)

    def __enter__(self):
        self._evaluator.__enter__()
        return self

    def __exit__(self, *exc):
        return self._evaluator.__exit__(*exc)

    @property
    def submit(self):
        submit = self._evaluator.submit        # AttributeError without one: the runner then calls `evaluate`

        def submit_then_kill(requests):
            futures = submit(requests)
            self._kill("evaluation")
            return futures
        return submit_then_kill

    def evaluate(self, requests):
        results = self._evaluator.evaluate(requests)
        self._kill("evaluation")
        return results


def main() -> None:
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location("launch_train", REPO / "launch" / "train.py")
    launch_train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch_train)        # defines launch/train.py's flags
    from absl import app, flags

    phase = flags.DEFINE_enum("kill_at_phase", None, list(PHASES), "The phase to SIGKILL the run in.", required=True)
    step = flags.DEFINE_integer("kill_at_step", None, "The step to SIGKILL the run in.", required=True)

    def run(argv):
        from cuda_eval.api import visible_gpu_count
        from kevin_jax.placement import place_run

        place_run(launch_train._CONFIG.value, visible_gpu_count())   # before JAX
        KillAt(phase.value, step.value).install()
        launch_train.main(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app.run(run)


if __name__ == "__main__":
    main()
