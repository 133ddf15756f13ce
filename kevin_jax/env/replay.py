"""Replayed answers (rl.replay): a benchmark mode of the training loop that is clearly not training.

With random weights a policy writes no kernel: every answer gets a format verdict, every reward is 0, every gradient
0, and the evaluator never builds anything. In replay mode the loop runs as it does for training, except that

  - the sampler ignores its stop tokens: every response runs to env.max_response_tokens (the full-length shapes of
    sampling and of the update);
  - each response text is the sampled text, closed as a thought, followed by a real answer for the same task: one of
    the shipped solutions (kevin_jax/tasks/builtin_solutions: correct and wrong kernels) or of the warm-start corpus
    (kevin_jax/data/warm_start_corpus.jsonl: correct, wrong and non-compiling ones). That answer is parsed, judged
    by the real evaluator (cuda_eval.api.Evaluator: built, checked and timed while the policy samples), scored and
    carried into the next prompt, as the policy's own would be.

The turns keep the sampled tokens and log-probs (the text recorded is the one judged), so the rewards and
advantages are those of a mix of good and bad kernels and the update is a real update (non-zero gradient) of
full-length samples. A trajectory's answer of turn t is picked by (trajectory + turn) mod the task's answer qualities
(correct, wrong, compile error: every task's group mixes them), and within a quality by a hash of the request id.
The trainer tags every log line [replay] and every metric replay/, and writes which answer each request replayed to
<workdir>/replay/step_XXXXXX.jsonl.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from kevin_jax.env.episode import EpisodeRunner, _request_id
from kevin_jax.env.parse import THINK_CLOSE, THINK_OPEN, split_thought

log = logging.getLogger(__name__)

REPLAY_SOURCES = ("", "builtin")
QUALITIES = ("correct", "wrong", "compile_error")
CORPUS = Path(__file__).resolve().parents[1] / "data" / "warm_start_corpus.jsonl"
_TRAJ_TURN = re.compile(r"traj(\d+)/turn(\d+)$")


@dataclasses.dataclass(frozen=True)
class ReplayAnswer:
    task_id: str
    quality: str        # one of QUALITIES
    origin: str         # where it comes from: "builtin_solutions/<file>" or "warm_start_corpus:<line>"
    text: str           # the answer as the evaluator receives it (the text after the thought)


def builtin_answers() -> dict[str, dict[str, list[ReplayAnswer]]]:
    """task_id -> quality -> answers, from the shipped solutions and the warm-start corpus."""
    from kevin_jax.tasks.solutions import builtin_solutions

    out: dict[str, dict[str, list[ReplayAnswer]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for s in builtin_solutions():
        text = f"```python\n{s.source.strip()}\n```\n\nSummary: replayed {s.name}."
        out[s.task_id][s.kind].append(ReplayAnswer(s.task_id, s.kind, f"builtin_solutions/{s.name}", text))
    with open(CORPUS, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            record = json.loads(line)
            if record.get("attempts"):         # refinement records answer an earlier attempt: first turns only
                continue
            quality = record["quality"]
            if quality not in QUALITIES:
                raise ValueError(f"{CORPUS}:{line_no}: unknown quality {quality!r}")
            _, _, answer = split_thought(record["response"], True)
            out[record["task_id"]][quality].append(
                ReplayAnswer(record["task_id"], quality, f"warm_start_corpus:{line_no}", answer))
    return {task: dict(by_quality) for task, by_quality in out.items()}


def answers_for(source: str, task_ids: Iterable[str]) -> dict[str, dict[str, list[ReplayAnswer]]]:
    """The answers of `source` (rl.replay) for these tasks; every task must have some."""
    if source not in REPLAY_SOURCES or not source:
        raise ValueError(f"rl.replay must be one of {REPLAY_SOURCES[1:]} (or '' = off), got {source!r}")
    answers = builtin_answers()
    task_ids = sorted(set(task_ids))
    missing = [t for t in task_ids if t not in answers]
    if missing:
        raise ValueError(f"rl.replay={source!r} has answers for the {len(answers)} built-in tasks only; "
                         f"{len(missing)} of the run's tasks have none (e.g. {missing[:3]}): replay runs on the "
                         f"built-in tasks (leave tasks.kernelbench_dir and tasks.parquet empty)")
    return {t: answers[t] for t in task_ids}


class ReplayRunner(EpisodeRunner):
    """The episode runner whose answers are the sampled text (as a closed thought) followed by a replayed answer of
    the task: that answer is what is parsed, judged by the real evaluator, scored and carried into the next prompt;
    the turn keeps the sampled tokens and log-probs (module docstring)."""

    def __init__(self, answers: Mapping[str, Mapping[str, Sequence[ReplayAnswer]]], *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.answers = answers
        self._replayed: list[dict] = []

    def pick(self, task_id: str, request_id: str) -> ReplayAnswer:
        by_quality = self.answers.get(task_id)
        if not by_quality:
            raise ValueError(f"no replayed answer for task {task_id!r}")
        qualities = [q for q in QUALITIES if by_quality.get(q)]
        digest = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big")
        found = _TRAJ_TURN.search(request_id)
        index = int(found.group(1)) + int(found.group(2)) if found else digest
        chosen = by_quality[qualities[index % len(qualities)]]
        return chosen[digest % len(chosen)]

    def answer_texts(self, live, round_index: int, texts: list[str]) -> list[str]:
        out, counts = [], collections.Counter()
        for lv, text in zip(live, texts):
            request_id = _request_id(lv.traj, round_index)
            answer = self.pick(lv.task.task_id, request_id)
            # the sampled text stays in the record as the thought; tags in it must not end the thought early
            thought = text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "")
            out.append(f"{thought}\n{THINK_CLOSE}\n\n{answer.text}")
            self._replayed.append({"request_id": request_id, "task_id": lv.task.task_id, "quality": answer.quality,
                                   "origin": answer.origin})
            counts[answer.quality] += 1
        log.info("replayed %d answers after the sampled text: %s", len(out),
                 ", ".join(f"{counts[q]} {q}" for q in QUALITIES if counts[q]))
        return out

    def take_replayed(self) -> list[dict]:
        """The answers replayed since the last call (request id, task, quality, origin)."""
        out, self._replayed = self._replayed, []
        return out


class ReplayTag(logging.Filter):
    """Puts "[replay] " in front of every log record (installed on the root logger's handlers by the trainer)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "_replay_tagged", False):
            record.msg = "[replay] " + str(record.msg)
            record._replay_tagged = True
        return True
