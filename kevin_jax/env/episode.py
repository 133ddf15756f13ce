"""The batched multi-turn environment: tasks x trajectories x turns, one policy call and one evaluator call per round.

Round t (t = 0 .. num_turns-1), for every live trajectory:
  prompt (first turn, or refinement with the earlier attempts: code + own summary + feedback, never thoughts)
  -> policy.generate(all prompts, one call) -> decode + parse -> cuda_eval evaluate(all answers, one call)
  -> verdict, score (kevin_jax.env.reward); the attempt is carried into the next prompt.
The runner returns scored turns; their returns and advantages are the update's (kevin_jax.rl.advantages).

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

from cuda_eval.api import FEEDBACK_MODES, EvalRequest
from kevin_jax.env.parse import parse_response
from kevin_jax.env.policy import Policy
from kevin_jax.env.prompts import Attempt, PromptRenderer, PromptTooLongError, RenderedPrompt, hf_tokenizer
from kevin_jax.env.reward import RewardConfig, counts_as_correct, turn_score
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
    gpu_name: the target GPU named in the prompt.
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
    gpu_name: str = "NVIDIA H100"
    one_shot: bool = True
    max_summary_chars: int = 2000
    feedback: str = "kevin"

    def __post_init__(self):
        if self.early_stop not in EARLY_STOP_MODES:
            raise ValueError(f"env.early_stop must be one of {EARLY_STOP_MODES}, got {self.early_stop!r}")
        if self.feedback not in FEEDBACK_MODES:
            raise ValueError(f"env.feedback must be one of {FEEDBACK_MODES}, got {self.feedback!r}")
        for name in ("num_turns", "num_trajectories", "max_prompt_tokens", "max_response_tokens",
                     "max_summary_chars"):
            if getattr(self, name) <= 0:
                raise ValueError(f"env.{name} must be positive, got {getattr(self, name)}")


class Evaluator(Protocol):
    """What the runner needs of cuda_eval.api.Evaluator."""
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
    round: int
    live: int                   # trajectories that took part in this round
    prompt_tokens_mean: float
    response_tokens_mean: float
    render_s: float
    generate_s: float
    evaluate_s: float
    total_s: float


@dataclasses.dataclass
class EpisodeResult:
    trajectories: list[Trajectory]
    rounds: list[RoundStats]


@dataclasses.dataclass
class PlayedRound:
    """What one round did: the new turn of each live trajectory (in their order), and its time."""
    turns: list[Turn]
    generate_s: float
    evaluate_s: float           # decoding, parsing and the evaluator call

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

def round_seed(seed: int, step: int, round_index: int) -> int:
    """The sampling seed of one round: a function of (seed, step, round) only, so a resumed run samples the same."""
    return int(np.random.SeedSequence([seed, step, round_index]).generate_state(1)[0])


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


class EpisodeRunner:
    """Runs episodes for a policy (Contract 2) and an evaluator (Contract 1) with one tokenizer."""

    def __init__(self, policy: Policy, evaluator: Evaluator, tokenizer: Any, env_config: EnvConfig,
                 reward_config: RewardConfig):
        self.policy = policy
        self.evaluator = evaluator
        self.tokenizer = hf_tokenizer(tokenizer)
        self.env = env_config
        self.reward = reward_config
        self.renderer = PromptRenderer(self.tokenizer, env_config.max_prompt_tokens, env_config.gpu_name,
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
        if not tasks:
            raise ValueError("no tasks to run")
        first_prompts = {t.task_id: self.renderer.first_turn(t.source) for t in tasks}  # raises if over budget
        live = [_Live(Trajectory(task.task_id, j, step, seed), task)
                for task in tasks for j in range(self.env.num_trajectories)]
        trajectories = [lv.traj for lv in live]
        rounds = []
        for round_index in range(self.env.num_turns):
            t0 = time.perf_counter()
            live, prompts = self._prompts(live, round_index, first_prompts)
            if not live:
                break
            t1 = time.perf_counter()
            played = self.play_round(live, prompts, round_index, step, seed)
            next_live = []
            for lv, turn in zip(live, played.turns):
                if not self._stops(lv, turn, turn.verdict):
                    next_live.append(lv)
                lv.best_score = max(lv.best_score, turn.score)
            rounds.append(played.stats(round_index, t1 - t0, time.perf_counter() - t0))
            log.info("round %d: %d live, generate %.1fs, evaluate %.1fs, %d correct", round_index, len(live),
                     played.generate_s, played.evaluate_s, sum(counts_as_correct(t.verdict) for t in played.turns))
            live = next_live
        return EpisodeResult(trajectories, rounds)

    def play_round(self, live: Sequence[Any], prompts: Sequence[RenderedPrompt], round_index: int, step: int,
                   seed: int, request_prefix: str = "") -> PlayedRound:
        """One round for the live trajectories (anything with .traj, .task and .attempts) and their prompts: one
        policy call, decode and parse, one evaluator call. Each trajectory gets its scored turn appended, and its
        attempt (code, summary, feedback) appended to the attempts its next prompt shows."""
        t0 = time.perf_counter()
        generations = self.policy.generate([p.token_ids for p in prompts], self.env.max_response_tokens,
                                           round_seed(seed, step, round_index))
        _check_count("policy.generate", len(generations), len(prompts))
        t1 = time.perf_counter()
        texts = [self.decode(g.tokens) for g in generations]
        parsed = [parse_response(text, self.renderer.opens_thought, self.env.max_summary_chars) for text in texts]
        requests = [EvalRequest(task_id=lv.task.task_id, task_source=lv.task.source, response=p.answer,
                                request_id=request_prefix + _request_id(lv.traj, round_index),
                                feedback=self.env.feedback)
                    for lv, p in zip(live, parsed)]
        verdicts = [v.to_dict() if hasattr(v, "to_dict") else dict(v) for v in self.evaluator.evaluate(requests)]
        _check_count("evaluator.evaluate", len(verdicts), len(requests))
        t2 = time.perf_counter()
        turns = []
        for lv, prompt, gen, text, p, verdict in zip(live, prompts, generations, texts, parsed, verdicts):
            turn = Turn(round_index, list(prompt.token_ids), list(gen.tokens), [float(x) for x in gen.logprobs],
                        gen.stop_reason, text, p.to_dict(), verdict)
            turn.score = turn_score(turn.parsed, verdict, self.reward)
            lv.traj.turns.append(turn)
            lv.attempts.append(Attempt(p.code, p.summary, str(verdict.get("feedback") or "")))
            turns.append(turn)
        return PlayedRound(turns, t1 - t0, t2 - t1)

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


def _end_token_ids(tokenizer: Any) -> set[int]:
    ids = {getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None)}
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids.update(vocab.get(tok) for tok in ("<|im_end|>", "<|endoftext|>"))
    return {i for i in ids if isinstance(i, int)}
