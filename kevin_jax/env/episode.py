"""The batched multi-turn environment: tasks x trajectories x turns, played as pipelined parts.

Round t (t = 0 .. num_turns-1), for every live trajectory:
  prompt (first turn, or refinement with the earlier attempts: code + own summary + feedback, never thoughts)
  -> policy.generate (one call per pipeline group) -> decode + parse -> cuda_eval (one submission per group)
  -> verdict, score (kevin_jax.env.reward); the attempt is carried into the next prompt.
The step's tasks are split into env.pipeline_groups groups; a group's round is a *part*, and kevin_jax.env.scheduler
runs the parts: with env.overlap, one group's answers are compiled and run while another group's next turn is
generated. The trajectories depend on (seed, step, pipeline_groups), never on the overlap or on the order in which
verdicts arrive. The runner returns scored turns; their returns and advantages are the update's
(kevin_jax.rl.advantages).

Trajectories are plain data (Contract 4 in docs/ARCHITECTURE.md), saved as JSONL, loaded back, or re-evaluated
(`reevaluate`). Early stop (`EnvConfig.early_stop`) is off by default, as in Kevin.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from cuda_eval.api import FEEDBACK_MODES, EvalConfig, EvalRequest, target_gpu_name
from kevin_jax.env.parse import parse_response
from kevin_jax.env.policy import Policy
from kevin_jax.env.prompts import Attempt, PromptRenderer, PromptTooLongError, RenderedPrompt, hf_tokenizer
from kevin_jax.env.reward import RewardConfig, counts_as_correct, turn_score
from kevin_jax.env.scheduler import Part, Scheduler, StepTiming, split_groups
from kevin_jax.tasks.kernelbench import Task

log = logging.getLogger(__name__)

EARLY_STOP_MODES = ("never", "first_correct", "no_improvement")


@dataclasses.dataclass
class EnvConfig:
    """The multi-turn environment (config section `env`).

    num_turns: refinement turns per trajectory (Kevin: 4).
    num_trajectories: parallel trajectories per task (Kevin: 16).
    max_prompt_tokens: prompt budget in tokens of the tokenizer in use; earlier attempts are dropped to fit.
    max_response_tokens: max_new_tokens of each generation (Kevin: 16k, later 22k).
    early_stop: "never" (Kevin), "first_correct" (stop after the first correct kernel), or "no_improvement" (after a
      correct kernel, stop at the first turn that does not beat the trajectory's best score).
    gpu_name: the GPU named in the prompt: "auto" (the card the evaluator runs the kernels on, resolve_gpu_name) or
      a name that overrides it.
    one_shot: show the one-shot example (element-wise add) in the first turn.
    max_summary_chars: cap on the model's summary carried into later prompts.
    feedback: the evaluator's text after a correct kernel: "kevin" (time and speedup) or "profile" (also a short
      profile of its kernels and the reference's: cuda_eval, EvalRequest.feedback).
    """
    num_turns: int = 4
    num_trajectories: int = 16
    max_prompt_tokens: int = 8192
    max_response_tokens: int = 16384
    early_stop: str = "never"
    gpu_name: str = "auto"
    one_shot: bool = True
    max_summary_chars: int = 2000
    feedback: str = "kevin"
    overlap: bool = True
    pipeline_groups: int = 2

    def __post_init__(self):
        if self.early_stop not in EARLY_STOP_MODES:
            raise ValueError(f"env.early_stop must be one of {EARLY_STOP_MODES}, got {self.early_stop!r}")
        if self.feedback not in FEEDBACK_MODES:
            raise ValueError(f"env.feedback must be one of {FEEDBACK_MODES}, got {self.feedback!r}")
        for name in ("num_turns", "num_trajectories", "max_prompt_tokens", "max_response_tokens",
                     "max_summary_chars", "pipeline_groups"):
            if getattr(self, name) <= 0:
                raise ValueError(f"env.{name} must be positive, got {getattr(self, name)}")


def resolve_gpu_name(configured: str, eval_config: EvalConfig, evaluator: Any = None) -> str:
    """The GPU a prompt names: `configured` (env.gpu_name) unless "auto"; then the card the evaluator runs the kernels
    on (its `gpu_name`, from the judge's device), or, before an evaluator exists, the one its config picks
    (cuda_eval.api.target_gpu_name: the first of eval.devices, or the card of eval.arch without a GPU)."""
    if configured and configured != "auto":
        return configured
    name = getattr(evaluator, "gpu_name", None) if evaluator is not None else None
    return name if isinstance(name, str) and name else target_gpu_name(eval_config)


class Evaluator(Protocol):
    """What the runner needs of cuda_eval.api.Evaluator: `evaluate`, and `submit` (a future per request) where it
    has it (without, kevin_jax.env.scheduler calls `evaluate` on a background thread)."""
    def evaluate(self, requests: Sequence[EvalRequest]) -> list[Any]: ...


# ---------------------------------------------------------------------------------------------------------------------
# Plain data (Contract 4)

@dataclasses.dataclass
class Turn:
    turn: int
    prompt_tokens: list[int]
    response_tokens: list[int]
    response_logprobs: list[float]
    stop_reason: str
    response_text: str
    parsed: dict                # ParsedResponse.to_dict()
    verdict: dict               # EvalResult.to_dict()
    score: float = 0.0          # kevin_jax.env.reward.turn_score
    return_: float = 0.0        # "return" in the JSON; return_ and advantage: kevin_jax.rl.advantages (0 until then)
    advantage: float = 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["return"] = d.pop("return_")
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Turn":
        d = dict(d)
        d["return_"] = d.pop("return")
        return cls(**d)


@dataclasses.dataclass
class Trajectory:
    task_id: str
    traj_index: int
    step: int
    seed: int
    turns: list[Turn] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "traj_index": self.traj_index, "step": self.step, "seed": self.seed,
                "turns": [t.to_dict() for t in self.turns]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Trajectory":
        return cls(d["task_id"], d["traj_index"], d["step"], d["seed"], [Turn.from_dict(t) for t in d["turns"]])


@dataclasses.dataclass
class RoundStats:
    """One round over its pipeline groups (sums of their parts' times; in the overlapped runner the parts of a round
    overlap each other and other rounds, so total_s may be less than generate_s + evaluate_s)."""
    round: int
    live: int                   # trajectories that took part in this round
    prompt_tokens_mean: float
    response_tokens_mean: float
    render_s: float
    generate_s: float           # policy calls (with decoding and parsing)
    evaluate_s: float           # from each part's submission to its last verdict
    total_s: float              # from the round's first prompt rendering to its last scoring


@dataclasses.dataclass
class EpisodeResult:
    trajectories: list[Trajectory]
    rounds: list[RoundStats]
    timing: StepTiming | None = None    # the step's sampling, evaluation and wall times (the overlap)


@dataclasses.dataclass
class PlayedRound:
    """What one round did: the new turn of each live trajectory (in their order), and its time."""
    turns: list[Turn]
    generate_s: float           # the policy call, decoding and parsing
    evaluate_s: float           # the evaluator call

    def stats(self, round_index: int, render_s: float, total_s: float) -> RoundStats:
        return RoundStats(round_index, len(self.turns), float(np.mean([len(t.prompt_tokens) for t in self.turns])),
                          float(np.mean([len(t.response_tokens) for t in self.turns])), render_s, self.generate_s,
                          self.evaluate_s, total_s)


# ---------------------------------------------------------------------------------------------------------------------
# Replays

def reevaluate(trajectories: Sequence[Trajectory], evaluator: Evaluator, tasks: Mapping[str, Task],
               config: RewardConfig, max_summary_chars: int = 2000) -> list[Trajectory]:
    """Copies of the trajectories with every turn's response re-parsed, re-evaluated (one evaluate call for all) and
    re-scored; returns and advantages are reset to 0 (kevin_jax.rl.advantages assigns them). The responses stay as
    generated (later prompts are not rebuilt)."""
    out = [Trajectory.from_dict(t.to_dict()) for t in trajectories]
    unknown = sorted({t.task_id for t in out} - set(tasks))
    if unknown:
        raise ValueError(f"trajectories refer to {len(unknown)} unknown task(s), e.g. {unknown[:5]}")
    requests, turns = [], []
    for traj in out:
        for turn in traj.turns:
            # The saved parse says whether the prompt had opened a thought: it has a thought although the response
            # may hold no <think> tag only in that case.
            opened = turn.parsed.get("thought") is not None and "<think>" not in turn.response_text
            parsed = parse_response(turn.response_text, opened, max_summary_chars)
            turn.parsed = parsed.to_dict()
            requests.append(EvalRequest(task_id=traj.task_id, task_source=tasks[traj.task_id].source,
                                        response=parsed.answer, request_id=_request_id(traj, turn.turn)))
            turns.append(turn)
    results = evaluator.evaluate(requests) if requests else []
    _check_count("evaluator", len(results), len(requests))
    for turn, result in zip(turns, results):
        turn.verdict = result.to_dict()
        turn.score = turn_score(turn.parsed, turn.verdict, config)
        turn.return_ = turn.advantage = 0.0
    return out


def save_trajectories(path: str | Path, trajectories: Iterable[Trajectory], append: bool = False) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as f:
        for traj in trajectories:
            f.write(json.dumps(traj.to_dict()) + "\n")


def load_trajectories(path: str | Path) -> list[Trajectory]:
    out = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Trajectory.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not a trajectory record ({type(e).__name__}: {e})") from e
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The runner

def round_seed(seed: int, step: int, round_index: int, group: int = 0) -> int:
    """The sampling seed of one policy call: a function of (seed, step, round, pipeline group) only, so that a resumed
    run samples the same. Group 0 keeps the rule of one call per round (pipeline_groups=1 samples as before)."""
    entropy = [seed, step, round_index] + ([group] if group else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def _request_id(traj: Trajectory, turn: int) -> str:
    return f"step{traj.step}/{traj.task_id}/traj{traj.traj_index}/turn{turn}"


def _check_count(what: str, got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(f"{what} returned {got} results for {expected} inputs")


@dataclasses.dataclass
class _Live:
    """A trajectory still running, with what its next prompt needs."""
    traj: Trajectory
    task: Task
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    best_score: float = 0.0
    had_correct: bool = False


@dataclasses.dataclass
class SampledRound:
    """One policy call's answers for some live trajectories, parsed, with their evaluation requests (no verdict yet)."""
    live: list[Any]
    prompts: list[RenderedPrompt]
    round_index: int
    generations: list[Any]
    texts: list[str]
    parsed: list[Any]
    requests: list[EvalRequest]


@dataclasses.dataclass
class _PartState:
    """A pipeline group's round, as the environment sees it (kevin_jax.env.scheduler.Part.state)."""
    live: list[_Live]
    prompts: list[RenderedPrompt]
    render_start: float         # when its prompts began to be rendered (s from the episode's start)
    render_s: float
    sampled: SampledRound | None = None
    turns: list[Turn] = dataclasses.field(default_factory=list)


class EpisodeRunner:
    """Runs episodes for a policy (Contract 2) and an evaluator (Contract 1) with one tokenizer."""

    def __init__(self, policy: Policy, evaluator: Evaluator, tokenizer: Any, env_config: EnvConfig,
                 reward_config: RewardConfig):
        self.policy = policy
        self.evaluator = evaluator
        self.tokenizer = hf_tokenizer(tokenizer)
        self.env = env_config
        self.reward = reward_config
        eval_config = getattr(evaluator, "config", None)
        self.gpu_name = resolve_gpu_name(env_config.gpu_name,
                                         eval_config if isinstance(eval_config, EvalConfig) else EvalConfig(),
                                         evaluator)
        self.renderer = PromptRenderer(self.tokenizer, env_config.max_prompt_tokens, self.gpu_name,
                                       env_config.one_shot)
        self._end_ids = _end_token_ids(self.tokenizer)

    def decode(self, tokens: Sequence[int]) -> str:
        """The response text: the sampled tokens without the trailing end-of-turn token(s), special tokens kept as
        text (so that <think> tags survive whatever the tokenizer calls special)."""
        end = len(tokens)
        while end > 0 and tokens[end - 1] in self._end_ids:
            end -= 1
        return self.tokenizer.decode(list(tokens[:end]), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def run(self, tasks: Sequence[Task], step: int = 0, seed: int = 0) -> EpisodeResult:
        """Every trajectory of every task for env.num_turns turns (fewer where early stop or the prompt budget ends
        it), in pipeline groups run by kevin_jax.env.scheduler. Trajectories come back in (task, index) order."""
        if not tasks:
            raise ValueError("no tasks to run")
        start = time.perf_counter()
        first_prompts = {t.task_id: self.renderer.first_turn(t.source) for t in tasks}  # raises if over budget
        render_s = time.perf_counter() - start
        groups = split_groups(list(tasks), self.env.pipeline_groups)
        trajectories, parts, played = [], [], []
        for g, group_tasks in enumerate(groups):
            live = [_Live(Trajectory(task.task_id, j, step, seed), task)
                    for task in group_tasks for j in range(self.env.num_trajectories)]
            trajectories += [lv.traj for lv in live]
            parts.append(Part(g, 0, _PartState(live, [first_prompts[lv.task.task_id] for lv in live], 0.0,
                                               render_s if g == 0 else 0.0)))

        def sample(part: Part) -> list[EvalRequest]:
            state = part.state
            state.sampled = self.sample(state.live, state.prompts, part.round, step, seed, group=part.group)
            return state.sampled.requests

        def score(part: Part) -> Part | None:
            state = part.state
            state.turns = self.record(state.sampled, part.verdicts)
            played.append(part)
            next_live = []
            for lv, turn in zip(state.live, state.turns):
                if not self._stops(lv, turn, turn.verdict):
                    next_live.append(lv)
                lv.best_score = max(lv.best_score, turn.score)
            where = f" (group {part.group + 1}/{len(groups)})" if len(groups) > 1 else ""
            log.info("round %d%s: %d live, generate %.1fs, evaluate %.1fs, %d correct", part.round, where,
                     len(state.live), part.timing.sample_s, part.timing.evaluate_s,
                     sum(counts_as_correct(t.verdict) for t in state.turns))
            if part.round + 1 >= self.env.num_turns or not next_live:
                return None
            t0 = time.perf_counter()
            live, prompts = self._prompts(next_live, part.round + 1, first_prompts)
            if not live:
                return None
            return Part(part.group, part.round + 1, _PartState(live, prompts, t0 - start, time.perf_counter() - t0))

        scheduler = Scheduler(self.evaluator, self.env.overlap, getattr(self.evaluator, "mode", "full"))
        timing = scheduler.run(parts, sample, score, groups=len(groups), start=start)
        log.info("episode of step %d (%s, %d group%s): sampling %.1fs busy, evaluation %.1fs wall, episode %.1fs "
                 "wall = %.2f x max(sampling, evaluation)", step, "overlapped" if self.env.overlap else "sequential",
                 len(groups), "s" if len(groups) > 1 else "", timing.sampling_s, timing.evaluation_s, timing.wall_s,
                 timing.wall_over_max)
        return EpisodeResult(trajectories, _round_stats(played), timing)

    def sample(self, live: Sequence[Any], prompts: Sequence[RenderedPrompt], round_index: int, step: int, seed: int,
               group: int = 0, request_prefix: str = "") -> SampledRound:
        """One policy call for the live trajectories (anything with .traj and .task) and their prompts; the answers
        decoded and parsed, and their evaluation requests."""
        generations = self.policy.generate([p.token_ids for p in prompts], self.env.max_response_tokens,
                                           round_seed(seed, step, round_index, group))
        _check_count("policy.generate", len(generations), len(prompts))
        texts = [self.decode(g.tokens) for g in generations]
        parsed = [parse_response(text, self.renderer.opens_thought, self.env.max_summary_chars) for text in texts]
        requests = [EvalRequest(task_id=lv.task.task_id, task_source=lv.task.source, response=p.answer,
                                request_id=request_prefix + _request_id(lv.traj, round_index),
                                feedback=self.env.feedback)
                    for lv, p in zip(live, parsed)]
        return SampledRound(list(live), list(prompts), round_index, generations, texts, parsed, requests)

    def record(self, sampled: SampledRound, verdicts: Sequence[Mapping]) -> list[Turn]:
        """The scored turns of sampled answers given their verdicts (dicts, in order): each trajectory gets its turn
        appended, and its attempt (code, summary, feedback) appended to the attempts its next prompt shows."""
        turns = []
        for lv, prompt, gen, text, p, verdict in zip(sampled.live, sampled.prompts, sampled.generations,
                                                     sampled.texts, sampled.parsed, verdicts):
            turn = Turn(sampled.round_index, list(prompt.token_ids), list(gen.tokens),
                        [float(x) for x in gen.logprobs], gen.stop_reason, text, p.to_dict(), dict(verdict))
            turn.score = turn_score(turn.parsed, turn.verdict, self.reward)
            lv.traj.turns.append(turn)
            lv.attempts.append(Attempt(p.code, p.summary, str(verdict.get("feedback") or "")))
            turns.append(turn)
        return turns

    def play_round(self, live: Sequence[Any], prompts: Sequence[RenderedPrompt], round_index: int, step: int,
                   seed: int, request_prefix: str = "") -> PlayedRound:
        """One round for the live trajectories (anything with .traj, .task and .attempts) and their prompts, all at
        once: one policy call, decode and parse, one blocking evaluator call (beam search plays its rounds so)."""
        t0 = time.perf_counter()
        sampled = self.sample(live, prompts, round_index, step, seed, request_prefix=request_prefix)
        t1 = time.perf_counter()
        verdicts = [v.to_dict() if hasattr(v, "to_dict") else dict(v)
                    for v in self.evaluator.evaluate(sampled.requests)]
        _check_count("evaluator.evaluate", len(verdicts), len(sampled.requests))
        t2 = time.perf_counter()
        return PlayedRound(self.record(sampled, verdicts), t1 - t0, t2 - t1)

    def _prompts(self, live: list[_Live], round_index: int,
                 first_prompts: Mapping[str, RenderedPrompt]) -> tuple[list[_Live], list[RenderedPrompt]]:
        """The prompts of this round, and the trajectories that get one: a history that cannot fit the budget even
        with only its latest attempt ends the trajectory."""
        if round_index == 0:
            return live, [first_prompts[lv.task.task_id] for lv in live]
        kept, prompts = [], []
        for lv in live:
            try:
                prompts.append(self.renderer.refinement(lv.task.source, lv.attempts))
                kept.append(lv)
            except PromptTooLongError as e:
                log.warning("%s stops before turn %d: %s", _request_id(lv.traj, round_index), round_index, e)
        return kept, prompts

    def _stops(self, lv: _Live, turn: Turn, verdict: Mapping) -> bool:
        mode = self.env.early_stop
        correct = turn.parsed.get("format_error") is None and counts_as_correct(verdict)
        stop = False
        if mode == "first_correct":
            stop = correct
        elif mode == "no_improvement":
            stop = lv.had_correct and turn.score <= lv.best_score
        lv.had_correct = lv.had_correct or correct
        return stop


def _round_stats(parts: Sequence[Part]) -> list[RoundStats]:
    """Per round, over its parts (the groups that played it): live trajectories, mean prompt and response tokens,
    summed render, policy-call (generate_s) and evaluation-wait (evaluate_s) times, and total_s from the first
    render to the last scoring (in the overlapped runner, rounds of different groups overlap)."""
    out = []
    for r in sorted({p.round for p in parts}):
        mine = [p for p in parts if p.round == r]
        turns = [t for p in mine for t in p.state.turns]
        out.append(RoundStats(
            r, len(turns), float(np.mean([len(t.prompt_tokens) for t in turns])),
            float(np.mean([len(t.response_tokens) for t in turns])), sum(p.state.render_s for p in mine),
            sum(p.timing.sample_s for p in mine), sum(p.timing.evaluate_s for p in mine),
            max(p.timing.scored for p in mine) - min(p.state.render_start for p in mine)))
    return out


def _end_token_ids(tokenizer: Any) -> set[int]:
    ids = {getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None)}
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids.update(vocab.get(tok) for tok in ("<|im_end|>", "<|endoftext|>"))
    return {i for i in ids if isinstance(i, int)}
