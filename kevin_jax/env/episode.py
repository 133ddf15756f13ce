"""The rollout: tasks x trajectories x turns, and every candidate kernel followed from its prompt to its reward.

Read `EpisodeRunner.play` top to bottom. The step's tasks are split into env.pipeline_groups groups (a task's
trajectories stay together); a group's round is one policy request and one evaluation:

  1. sample   one request for the group's live trajectories, seeded by (seed, step, round, group), handed to the
              policy's stream (kevin_jax.env.policy.PolicyStream); with env.stream_rounds the sampler decodes every
              request it holds in one continuous batch, so a round that becomes ready fills the slots that another
              round's finished answers free (no batch shrinking while a round's longest answer ends); without, one
              generate call per round
  2. parse    each answer decoded (the sampled tokens, kept as they are) and split into thought, code and summary
  3. submit   the answers (the text outside the thought) to cuda_eval, which compiles, checks and times them
              asynchronously (kevin_jax.env.submissions: a future per request)
  -- when the round's verdicts are all in --
  4. score    each answer becomes a Turn of its trajectory with its verdict and score (kevin_jax.reward: the
              only place a turn is scored)
  5. carry    its code, its summary and the evaluator's feedback are the attempt the next prompt shows
  6. stop     early stop (env.early_stop); beam search prunes and copies trajectories here
  7. render   the group's next prompts (earlier attempts, never thoughts); a history that cannot fit the prompt
              budget ends its trajectory

With env.overlap (the default), the loop samples whichever group's round is ready while other groups' kernels are
evaluated, and waits for verdicts only when nothing is ready or sampling; env.overlap=False awaits each evaluation
before the next policy request. A group's prompts, seeds and request ids depend only on its own history, and a
request's tokens only on its prompts and seed (never on what else shares the batch), so the trajectories are a
function of (seed, step, pipeline_groups), never of the overlap, the streaming or the order in which verdicts
arrive; only the times differ. The runner returns scored turns; their returns and advantages are the update's
(kevin_jax.rl.advantages). Trajectories are plain data (kevin_jax.env.trajectory, Contract 4). Early stop is off
by default, as in Kevin. `replay` runs responses already written (saved trajectories, another model's answers)
through the same parse, evaluator and score.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from cuda_eval.api import FEEDBACK_MODES, EvalConfig, EvalRequest, target_gpu_name
from kevin_jax.env.parse import parse_response
from kevin_jax.env.policy import Generation, Policy, open_stream
from kevin_jax.env.prompts import Attempt, PromptRenderer, PromptTooLongError, RenderedPrompt, hf_tokenizer
from kevin_jax.env.submissions import (Evaluations, PartTiming, StepTiming, interval_union, split_groups,
                                       verdict_dict)
from kevin_jax.env.trajectory import STATUSES, Trajectory, Turn
from kevin_jax.reward import RewardConfig, rescore_turns, scorer
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
    overlap: one pipeline group samples while another's kernels are evaluated (EpisodeRunner.play); False awaits each
      evaluation before the next sampler call: the same trajectories, slower.
    pipeline_groups: the step's tasks split into this many groups, each round of a group one sampler request and
      one evaluator submission; the trajectories are a function of it (see the module docstring).
    stream_rounds: the groups' rounds join one continuous decode batch as they become ready (the sampler's stream),
      so the batch stays full while a round's longest answers finish; False: one sampler call per round, which
      ends with its longest answer (the same trajectories).
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
    stream_rounds: bool = True

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
    has it (without, kevin_jax.env.submissions calls `evaluate` on a background thread)."""
    def evaluate(self, requests: Sequence[EvalRequest]) -> list[Any]: ...


@dataclasses.dataclass
class RoundStats:
    """One round over its pipeline groups (sums of their times; overlapped, the groups' rounds overlap each other
    and other rounds, so total_s may be less than generate_s + evaluate_s)."""
    round: int
    live: int                   # trajectories that took part in this round
    prompt_tokens_mean: float
    response_tokens_mean: float
    render_s: float
    generate_s: float           # from each group's request to its answers (streamed, requests share the batch)
    evaluate_s: float           # from each group's submission to its last verdict
    total_s: float              # from the round's first prompt rendering to its last scoring


@dataclasses.dataclass
class EpisodeResult:
    trajectories: list[Trajectory]
    rounds: list[RoundStats]
    timing: StepTiming | None = None    # the step's sampling, evaluation and wall times (the overlap)


@dataclasses.dataclass
class Live:
    """A trajectory being played, with what its next prompt needs."""
    traj: Trajectory
    task: Task
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    best_score: float = 0.0
    had_correct: bool = False
    over_budget: bool = False   # its history no longer fits the prompt budget: it plays no more rounds


@dataclasses.dataclass(eq=False)
class Round:
    """One pipeline group's round: its live trajectories and their prompts, then their answers and scored turns."""
    group: int
    index: int                  # the round, i.e. the turn index of the turns it adds
    live: list[Live]
    prompts: list[RenderedPrompt]
    render_start: float         # when its prompts began to be rendered (s from the episode's start)
    render_s: float
    answers: list[tuple[Generation, str, Any]] = dataclasses.field(default_factory=list)   # (sampled, text, parsed)
    turns: list[Turn] = dataclasses.field(default_factory=list)
    timing: PartTiming = dataclasses.field(init=False)

    def __post_init__(self):
        self.timing = PartTiming(self.group, self.index)


# After a group's round is scored: (the trajectories that go on, the round index) -> the trajectories that play the
# next round (beam search prunes and copies here).
AfterRound = Callable[[list[Live], int], list[Live]]


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


class EpisodeRunner:
    """Runs episodes for a policy (Contract 2) and an evaluator (Contract 1) with one tokenizer. Each turn is scored
    as it is played, by kevin_jax.reward (with `compile_only_score`, a training run on compile-only verdicts: that
    proxy score of every kernel that compiled)."""

    def __init__(self, policy: Policy, evaluator: Evaluator, tokenizer: Any, env_config: EnvConfig,
                 reward_config: RewardConfig, compile_only_score: float | None = None):
        self.policy = policy
        self.evaluator = evaluator
        self.tokenizer = hf_tokenizer(tokenizer)
        self.env = env_config
        self.reward = reward_config
        self.score = scorer(reward_config, compile_only_score)
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
        it), the tasks in env.pipeline_groups groups. Trajectories come back in (task, index) order."""
        if not tasks:
            raise ValueError("no tasks to run")
        start = time.perf_counter()
        first_prompts = {t.task_id: self.renderer.first_turn(t.source) for t in tasks}  # raises if over budget
        render_s = time.perf_counter() - start
        groups = [[Live(Trajectory(task.task_id, j, step, seed), task)
                   for task in group_tasks for j in range(self.env.num_trajectories)]
                  for group_tasks in split_groups(list(tasks), self.env.pipeline_groups)]
        return self.play(groups, first_prompts, step, seed, start=start, render_s=render_s)

    def play(self, groups: Sequence[list[Live]], first_prompts: Mapping[str, RenderedPrompt], step: int, seed: int,
             *, start: float | None = None, render_s: float = 0.0, request_prefix: str = "",
             after_round: AfterRound | None = None) -> EpisodeResult:
        """The round loop (steps 1-7 of the module docstring) for these groups of live trajectories, from their
        first prompts. `after_round` may change which trajectories play a group's next round (beam search);
        `request_prefix` starts every request id. Times count from `start` (a time.perf_counter() value)."""
        start = time.perf_counter() if start is None else start

        def clock() -> float:
            return time.perf_counter() - start

        evaluations = Evaluations(self.evaluator, getattr(self.evaluator, "mode", "full"), clock)
        stream = open_stream(self.policy, self.env.stream_rounds)
        ready = collections.deque(Round(g, 0, list(live), [first_prompts[lv.task.task_id] for lv in live], 0.0,
                                        render_s if g == 0 else 0.0) for g, live in enumerate(groups))
        played: list[Round] = []
        try:
            while ready or stream.busy or evaluations.in_flight:
                # 1. sample: each ready round is one request, seeded by its own (step, round, group), to the
                # policy's stream. Overlapped, into a continuous stream: as soon as it is ready (it fills the slots
                # that other rounds' finished answers free). Else one at a time: a policy call per round, and
                # sequential, only when no evaluation is out either.
                while ready and (self.env.overlap or not evaluations.in_flight) and (
                        not stream.busy or (self.env.overlap and stream.continuous)):
                    rnd = ready.popleft()
                    rnd.timing.sample_start = clock()
                    stream.add([p.token_ids for p in rnd.prompts], self.env.max_response_tokens,
                               round_seed(seed, step, rnd.index, rnd.group), rnd)
                progressed = stream.busy
                if progressed:
                    # Some sampling (the sampler's stream: one decode call), then the rounds whose answers are in.
                    for rnd, generations in stream.advance():
                        _check_count("policy.generate", len(generations), len(rnd.prompts))
                        self._submit(rnd, generations, evaluations, clock, request_prefix)
                # Every round whose verdicts are all in (waiting for one only when there was nothing to sample).
                while True:
                    done = evaluations.next_done(block=not progressed)
                    if done is None:
                        break
                    progressed = True
                    following = self._score(done.owner, done.verdicts, clock, len(groups), request_prefix,
                                            after_round)
                    played.append(done.owner)
                    if following is not None:
                        ready.append(following)
        finally:
            stream.close()
            evaluations.close()
        timing = _step_timing([r.timing for r in played], clock(), self.env.overlap, len(groups))
        log.info("%sepisode of step %d (%s, %d group%s): sampling %.1fs busy, evaluation %.1fs wall, episode %.1fs "
                 "wall = %.2f x max(sampling, evaluation)", request_prefix, step,
                 "overlapped" if self.env.overlap else "sequential", len(groups), "s" if len(groups) > 1 else "",
                 timing.sampling_s, timing.evaluation_s, timing.wall_s, timing.wall_over_max)
        return EpisodeResult([lv.traj for live in groups for lv in live], _round_stats(played), timing)

    def _submit(self, rnd: Round, generations: list[Generation], evaluations: Evaluations,
                clock: Callable[[], float], request_prefix: str) -> None:
        """Steps 2-3 for a round whose answers are in."""
        # 2. parse: the response text (the sampled tokens decoded), its thought, code and summary
        texts = self.answer_texts(rnd.live, rnd.index, [self.decode(g.tokens) for g in generations])
        parsed = [parse_response(text, self.renderer.opens_thought, self.env.max_summary_chars) for text in texts]
        rnd.answers = list(zip(generations, texts, parsed))
        # 3. submit: the answers (never the thoughts) to the evaluator, which compiles, checks and times them while
        # the loop goes on
        requests = [EvalRequest(task_id=lv.task.task_id, task_source=lv.task.source, response=p.answer,
                                request_id=request_prefix + _request_id(lv.traj, rnd.index), feedback=self.env.feedback)
                    for lv, p in zip(rnd.live, parsed)]
        rnd.timing.sample_end = clock()
        evaluations.submit(requests, rnd.timing, owner=rnd)

    def _score(self, rnd: Round, verdicts: list[dict], clock: Callable[[], float], groups: int, request_prefix: str,
               after_round: AfterRound | None) -> Round | None:
        """Steps 4-7 for a round whose verdicts are all in; returns the group's next round (None: the group is
        done)."""
        # 4. score: each answer becomes a Turn of its trajectory, scored from its verdict;
        # 5. carry: its code, summary and feedback are the attempt that the next prompt shows
        for lv, prompt, (generation, text, parse), verdict in zip(rnd.live, rnd.prompts, rnd.answers, verdicts):
            turn = Turn(rnd.index, list(prompt.token_ids), list(generation.tokens),
                        [float(x) for x in generation.logprobs], generation.stop_reason, text, parse.to_dict(),
                        dict(verdict))
            turn.score = self.score(turn)
            lv.traj.turns.append(turn)
            lv.attempts.append(Attempt(parse.code, parse.summary, turn.feedback))
            rnd.turns.append(turn)
        self._log_round(rnd, groups, request_prefix)
        # 6. stop: early stop; beam search prunes and copies trajectories here
        going_on = [lv for lv, turn in zip(rnd.live, rnd.turns) if not self._stops(lv, turn)]
        if after_round is not None:
            going_on = after_round(going_on, rnd.index)
        # 7. render: the group's next prompts (a history over the prompt budget ends its trajectory)
        following = self._next_round(rnd, going_on, clock, request_prefix)
        rnd.timing.scored = clock()
        return following

    def answer_texts(self, live: Sequence[Live], round_index: int, texts: list[str]) -> list[str]:
        """The response texts that are parsed, judged and carried: the decoded samples (kevin_jax.env.replay's
        runner puts replayed answers after them)."""
        return texts

    def _stops(self, lv: Live, turn: Turn) -> bool:
        """Early stop (env.early_stop) after this turn; updates the trajectory's best score and correct kernel."""
        mode = self.env.early_stop
        stop = False
        if mode == "first_correct":
            stop = turn.correct
        elif mode == "no_improvement":
            stop = lv.had_correct and turn.score <= lv.best_score
        lv.had_correct = lv.had_correct or turn.correct
        lv.best_score = max(lv.best_score, turn.score)
        return stop

    def _next_round(self, rnd: Round, going_on: list[Live], clock: Callable[[], float],
                    request_prefix: str) -> Round | None:
        """The group's next round: refinement prompts for the trajectories that go on; a history that cannot fit
        the budget even with only its latest attempt ends its trajectory."""
        index = rnd.index + 1
        if index >= self.env.num_turns or not going_on:
            return None
        render_start = clock()
        live, prompts = [], []
        for lv in going_on:
            try:
                prompts.append(self.renderer.refinement(lv.task.source, lv.attempts))
                live.append(lv)
            except PromptTooLongError as e:
                lv.over_budget = True
                log.warning("%s stops before turn %d: %s", request_prefix + _request_id(lv.traj, index), index, e)
        if not live:
            return None
        return Round(rnd.group, index, live, prompts, render_start, clock() - render_start)

    def _log_round(self, rnd: Round, groups: int, request_prefix: str) -> None:
        where = f" (group {rnd.group + 1}/{groups})" if groups > 1 else ""
        counts = collections.Counter(t.status for t in rnd.turns)
        log.info("%sround %d%s: %d live, generate %.1fs, evaluate %.1fs; %s", request_prefix, rnd.index, where,
                 len(rnd.live), rnd.timing.sample_s, rnd.timing.evaluate_s,
                 ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]))


def _step_timing(parts: list[PartTiming], wall_s: float, overlap: bool, groups: int) -> StepTiming:
    """The episode's times; an evaluator that failed every request of the step is an error (nothing to learn)."""
    total = sum(p.requests for p in parts)
    failures = sum(p.failures for p in parts)
    if total and failures == total:
        raise RuntimeError(f"the evaluator failed on all {total} requests of the step (see the errors above); "
                           "no verdict to learn from")
    return StepTiming(wall_s=wall_s, sampling_s=interval_union((p.sample_start, p.sample_end) for p in parts),
                      evaluation_s=interval_union((p.submitted, p.verdicts_in) for p in parts),
                      overlap=overlap, groups=groups, parts=parts)


def _round_stats(rounds: Sequence[Round]) -> list[RoundStats]:
    """Per round index, over its groups: live trajectories, mean prompt and response tokens, summed render,
    policy-call (generate_s) and evaluation-wait (evaluate_s) times, and total_s from the first render to the last
    scoring (overlapped, rounds of different groups overlap)."""
    out = []
    for r in sorted({rnd.index for rnd in rounds}):
        mine = [rnd for rnd in rounds if rnd.index == r]
        turns = [t for rnd in mine for t in rnd.turns]
        out.append(RoundStats(
            r, len(turns), float(np.mean([len(t.prompt_tokens) for t in turns])),
            float(np.mean([len(t.response_tokens) for t in turns])), sum(rnd.render_s for rnd in mine),
            sum(rnd.timing.sample_s for rnd in mine), sum(rnd.timing.evaluate_s for rnd in mine),
            max(rnd.timing.scored for rnd in mine) - min(rnd.render_start for rnd in mine)))
    return out


def _end_token_ids(tokenizer: Any) -> set[int]:
    ids = {getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None)}
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids.update(vocab.get(tok) for tok in ("<|im_end|>", "<|endoftext|>"))
    return {i for i in ids if isinstance(i, int)}


# ---------------------------------------------------------------------------------------------------------------------
# Replays

def replay(trajectories: Sequence[Trajectory], evaluator: Evaluator, tasks: Mapping[str, Task],
           config: RewardConfig, max_summary_chars: int = 2000, request_prefix: str = "") -> list[Trajectory]:
    """Copies of the trajectories with every turn's response (its text as written) parsed, evaluated (one evaluate
    call for all) and scored as the round loop does; returns and advantages are reset to 0 (kevin_jax.rl.advantages
    assigns them). Saved trajectories (launch/eval.py --reevaluate) and another model's answers
    (kevin_jax.evaluation.external) both come here; the responses stay as they are (later prompts are not rebuilt).
    Request ids are the round loop's, after `request_prefix`."""
    out = [t.copy() for t in trajectories]
    unknown = sorted({t.task_id for t in out} - set(tasks))
    if unknown:
        raise ValueError(f"trajectories refer to {len(unknown)} unknown task(s), e.g. {unknown[:5]}")
    requests, turns = [], []
    for traj in out:
        for turn in traj.turns:
            # A saved parse says whether the prompt had opened a thought: it has a thought although the response
            # may hold no <think> tag only in that case. A response without a parse (written elsewhere, to a prompt
            # we do not know) counts as starting outside any thought.
            opened = turn.parsed.get("thought") is not None and "<think>" not in turn.response_text
            parsed = parse_response(turn.response_text, opened, max_summary_chars)
            turn.parsed = parsed.to_dict()
            requests.append(EvalRequest(task_id=traj.task_id, task_source=tasks[traj.task_id].source,
                                        response=parsed.answer,
                                        request_id=request_prefix + _request_id(traj, turn.turn)))
            turns.append(turn)
    results = evaluator.evaluate(requests) if requests else []
    _check_count("evaluator", len(results), len(requests))
    for turn, result in zip(turns, results):
        turn.verdict = verdict_dict(result)
        turn.return_ = turn.advantage = 0.0
    rescore_turns(turns, scorer(config))
    return out
