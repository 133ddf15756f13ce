"""Test-time beam search over refinement turns, as in the Kevin-32B blog: run N trajectories per task; after every
block of turns keep the `beam_width` whose fastest correct kernel so far is fastest, copy each N / beam_width times,
and continue refining from the copies (sampling makes them diverge). Same kernel budget as N parallel trajectories
x T turns; the best kernel of the search is the best of the final beams (the best trajectory is always kept).

The rounds are the environment's own loop (kevin_jax.env.episode.EpisodeRunner.play, all tasks in one group: one
policy call and one evaluation per round for every live trajectory, the same prompts, parse and scores); the pruning
is its `after_round` step. Ranking uses the turn's own words (kevin_jax.env.trajectory.Turn.ok and .speedup): a
trajectory with a correct (compile-only: compiled) kernel beats one without; among those, the faster best kernel
wins; ties are broken by a seeded random order.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import numpy as np

from kevin_jax.env.episode import EpisodeRunner, Live, RoundStats, round_seed
from kevin_jax.env.trajectory import Trajectory
from kevin_jax.tasks.kernelbench import Task

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BeamConfig:
    """beam_width: trajectories kept per task at each pruning (must divide env.num_trajectories).
    block_turns: turns between prunings (Kevin's blog: prune after every block of refinement turns)."""
    beam_width: int
    block_turns: int = 1

    def check(self, num_trajectories: int, num_turns: int) -> None:
        if self.beam_width < 1 or self.block_turns < 1:
            raise ValueError(f"beam_width and block_turns must be >= 1, got {self.beam_width}, {self.block_turns}")
        if num_trajectories % self.beam_width:
            raise ValueError(f"beam_width={self.beam_width} must divide the trajectories per task "
                             f"({num_trajectories}): each kept trajectory is copied the same number of times")
        if self.block_turns >= num_turns:
            log.warning("beam search with block_turns=%d >= num_turns=%d never prunes: plain parallel sampling",
                        self.block_turns, num_turns)


@dataclasses.dataclass
class _Beam(Live):
    origin: int = 0             # index of the first-round trajectory this one descends from

    def clone(self, index: int) -> "_Beam":
        copy = self.traj.copy()
        copy.traj_index = index
        return _Beam(copy, self.task, list(self.attempts), over_budget=self.over_budget, origin=self.origin)


@dataclasses.dataclass
class BeamResult:
    trajectories: list[Trajectory]   # the final beams: N per task, each with its whole history (scored turns)
    pruned: list[Trajectory]         # every trajectory dropped at a pruning, as it was then
    selections: list[dict]           # per task and pruning: which were kept, with their rank keys
    rounds: list[RoundStats]


class BeamSearch:
    def __init__(self, runner: EpisodeRunner, config: BeamConfig, mode: str = "full"):
        config.check(runner.env.num_trajectories, runner.env.num_turns)
        if runner.env.early_stop != "never":
            raise ValueError("beam search runs every trajectory for every turn: set env.early_stop='never'")
        self.runner = runner
        self.config = config
        self.mode = mode

    def rank_key(self, beam: _Beam) -> tuple[bool, float]:
        oks = [t for t in beam.traj.turns if t.ok(self.mode)]
        return bool(oks), max((t.speedup or 0.0 for t in oks), default=0.0)

    def run(self, tasks: Sequence[Task], step: int = 0, seed: int = 0) -> BeamResult:
        if not tasks:
            raise ValueError("no tasks to run")
        r, env = self.runner, self.runner.env
        first = {t.task_id: r.renderer.first_turn(t.source) for t in tasks}
        beams = {t.task_id: [_Beam(Trajectory(t.task_id, j, step, seed), t, origin=j)
                             for j in range(env.num_trajectories)] for t in tasks}
        pruned: list[Trajectory] = []
        selections: list[dict] = []

        def prune(going_on: list[Live], round_index: int) -> list[Live]:
            """After every block of turns: each task's best beam_width trajectories, copied; the rest dropped."""
            done = round_index + 1
            if done % self.config.block_turns == 0 and done < env.num_turns:
                rng = np.random.default_rng(round_seed(seed, step, 1000 + round_index))
                for task in tasks:
                    beams[task.task_id], dropped, record = self._prune(beams[task.task_id], rng)
                    pruned.extend(dropped)
                    selections.append({"task_id": task.task_id, "after_turns": done, **record})
            return [b for task in tasks for b in beams[task.task_id] if not b.over_budget]

        group = [b for task in tasks for b in beams[task.task_id]]
        played = r.play([group], first, step, seed, request_prefix="beam/", after_round=prune)
        final = [b.traj for task in tasks for b in beams[task.task_id]]
        return BeamResult(final, pruned, selections, played.rounds)

    def _prune(self, group: list[_Beam], rng: np.random.Generator) -> tuple[list[_Beam], list[Trajectory], dict]:
        order = rng.permutation(len(group))          # random tie-break
        keys = [self.rank_key(b) for b in group]
        ranked = sorted(order, key=lambda i: keys[i], reverse=True)   # stable: ties keep the random order
        keep = ranked[:self.config.beam_width]
        copies = len(group) // self.config.beam_width
        new = [group[i].clone(c * self.config.beam_width + rank) for c in range(copies)
               for rank, i in enumerate(keep)]
        dropped = [group[i].traj for i in ranked[self.config.beam_width:]]
        record = {"kept": [{"traj_index": int(group[i].traj.traj_index), "origin": group[i].origin,
                            "has_correct": keys[i][0], "best_speedup": keys[i][1]} for i in keep],
                  "copies": copies}
        return new, dropped, record


def beam_summary(result: BeamResult) -> dict[str, Any]:
    """How the search went: prunings, and which first-round trajectories the final beams descend from, per task."""
    survivors = {}
    for sel in result.selections:   # in order: the last pruning of each task wins
        survivors[sel["task_id"]] = sorted({k["origin"] for k in sel["kept"]})
    return {"prunings": len(result.selections), "pruned_trajectories": len(result.pruned),
            "surviving_origins": survivors}
