"""KernelBench tasks: identity, loaders and train/holdout splits.

A task is one reference program in KernelBench's format: a module defining `class Model(nn.Module)`, module-level
constants, `get_inputs()` and `get_init_inputs()`. Three sources give the same `Task` objects:

- a KernelBench checkout (`load_kernelbench_dir`): folders level1/ level2/ level3/ (level4/ if present), files named
  `<id>_<Name>.py`; the name is kept verbatim (some have doubled or trailing underscores);
- the Hugging Face export (`load_kernelbench_parquet`): parquet (or arrow) files with columns problem_id, name, code
  and optionally level (otherwise the level comes from the file name, e.g. `level_1-00000-of-00001.parquet`);
- our built-in set (`load_builtin_tasks`), shipped in the package and used when nothing else is configured.

Validation at load time is static (ast): a syntax error or a missing Model/get_inputs/get_init_inputs skips the file
and is reported with its name (`LoadedTasks.skipped`, and a log line), never silently. A reference that raises when
run is the evaluator's business: its verdict says so.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

log = logging.getLogger(__name__)

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
TASK_FILE_RE = re.compile(r"^(\d+)_(.+)\.py$")
LEVEL_DIR_RE = re.compile(r"^level(\d+)$")
LEVEL_IN_PATH_RE = re.compile(r"level[_-]?(\d+)", re.IGNORECASE)
REQUIRED_COLUMNS = ("problem_id", "name", "code")


def normalise_source(source: str) -> str:
    """The text the content hash is taken of: LF line endings, no trailing whitespace, no trailing blank lines."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).rstrip("\n") + "\n"


@dataclasses.dataclass(frozen=True)
class Task:
    """One reference program. `task_id` ("L1/19_ReLU") is the key used everywhere (requests, trajectories, splits)."""
    level: int
    problem_id: int
    name: str
    source: str
    path: str = ""  # where it was read from (a file, or "file.parquet#row 3"); informational only

    @property
    def task_id(self) -> str:
        return f"L{self.level}/{self.problem_id}_{self.name}"

    @property
    def content_hash(self) -> str:
        """sha256 of the normalised source: two copies of a task with different hashes have drifted."""
        return hashlib.sha256(normalise_source(self.source).encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class SkippedTask:
    path: str
    reason: str


@dataclasses.dataclass(frozen=True)
class LoadedTasks:
    tasks: tuple[Task, ...]
    skipped: tuple[SkippedTask, ...] = ()

    def by_id(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.tasks}


def reference_problems(source: str) -> list[str]:
    """Static checks of a reference program; an empty list means it looks loadable."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"syntax error at line {e.lineno}: {e.msg}"]
    except ValueError as e:  # e.g. null bytes in the source
        return [f"cannot parse: {e}"]
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):  # e.g. `get_inputs = lambda: [...]`
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    problems = []
    for required, what in (("Model", "class Model"), ("get_inputs", "get_inputs()"),
                           ("get_init_inputs", "get_init_inputs()")):
        if required not in defined:
            problems.append(f"missing {what}")
    return problems


def _finish(tasks: list[Task], skipped: list[SkippedTask], origin: str) -> LoadedTasks:
    for s in skipped:
        log.warning("skipped task %s: %s", s.path, s.reason)
    seen: dict[tuple[int, int], str] = {}
    for t in tasks:
        other = seen.setdefault((t.level, t.problem_id), t.task_id)
        if other != t.task_id:
            log.warning("level %d problem id %d is used twice in %s: %s and %s (both kept)", t.level, t.problem_id,
                        origin, other, t.task_id)
    tasks.sort(key=lambda t: (t.level, t.problem_id, t.name))
    log.info("loaded %d tasks from %s (%d skipped)", len(tasks), origin, len(skipped))
    return LoadedTasks(tuple(tasks), tuple(skipped))


def load_kernelbench_dir(root: str | Path, levels: Iterable[int] | None = None) -> LoadedTasks:
    """Tasks of a KernelBench checkout (the repo root or its KernelBench/ folder) or any folder of level<N>/ dirs."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"KernelBench directory not found: {root}")
    base = root
    if not _level_dirs(root) and (root / "KernelBench").is_dir():
        base = root / "KernelBench"
    level_dirs = _level_dirs(base)
    if not level_dirs:
        raise ValueError(f"{root} has no level1/, level2/, ... folders (expected a KernelBench checkout)")
    wanted = None if levels is None else set(levels)
    if wanted is not None:
        missing = sorted(wanted - set(level_dirs))
        if missing:
            log.warning("%s has no folder for level(s) %s", base, missing)
    tasks, skipped = [], []
    for level, level_dir in sorted(level_dirs.items()):
        if wanted is not None and level not in wanted:
            continue
        found_before = len(tasks)
        for path in sorted(level_dir.iterdir()):
            if path.suffix != ".py" or path.name == "__init__.py" or not path.is_file():
                continue
            match = TASK_FILE_RE.match(path.name)
            if match is None:
                skipped.append(SkippedTask(str(path), "file name is not <id>_<Name>.py"))
                continue
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                skipped.append(SkippedTask(str(path), f"cannot read: {e}"))
                continue
            problems = reference_problems(source)
            if problems:
                skipped.append(SkippedTask(str(path), "; ".join(problems)))
                continue
            tasks.append(Task(level, int(match.group(1)), match.group(2), source, str(path)))
        if len(tasks) == found_before:
            log.warning("%s holds no loadable task", level_dir)
    tasks = _drop_superseded(tasks, skipped)
    return _finish(tasks, skipped, str(base))


def _drop_superseded(tasks: list[Task], skipped: list[SkippedTask]) -> list[Task]:
    """Some KernelBench commits keep `<id>_<Name>_OLD.py` beside the live `<id>_<Name2>.py`: the old version is not a
    task. An _OLD file that is the only one with its id stays (it is then the task)."""
    live = {(t.level, t.problem_id) for t in tasks if not t.name.endswith("_OLD")}
    kept = []
    for t in tasks:
        if t.name.endswith("_OLD") and (t.level, t.problem_id) in live:
            skipped.append(SkippedTask(t.path, "superseded *_OLD.py version of a task that exists under the same id"))
        else:
            kept.append(t)
    return kept


def _level_dirs(base: Path) -> dict[int, Path]:
    out = {}
    for p in base.iterdir():
        m = LEVEL_DIR_RE.match(p.name)
        if m and p.is_dir():
            out[int(m.group(1))] = p
    return out


def _read_table(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.read_table(path)
    try:  # `datasets.save_to_disk` writes the IPC stream format; plain arrow files use the file format
        with pa.OSFile(str(path), "rb") as f:
            return pa.ipc.open_stream(f).read_all()
    except pa.ArrowInvalid:
        with pa.OSFile(str(path), "rb") as f:
            return pa.ipc.open_file(f).read_all()


def load_kernelbench_parquet(path: str | Path, levels: Iterable[int] | None = None) -> LoadedTasks:
    """Tasks of the Hugging Face export: one parquet/arrow file, or a folder of them (searched recursively)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".arrow") and p.is_file())
        if not files:
            raise ValueError(f"no .parquet or .arrow files under {path}")
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(f"KernelBench parquet export not found: {path}")
    wanted = None if levels is None else set(levels)
    tasks, skipped = [], []
    for file in files:
        table = _read_table(file)
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{file}: missing column(s) {missing}; has {table.column_names}")
        file_level = None
        if "level" not in table.column_names:
            m = LEVEL_IN_PATH_RE.search(str(file.relative_to(path) if path.is_dir() else file.name))
            if m is None:
                raise ValueError(f"{file}: no 'level' column and no level<N> in the file name")
            file_level = int(m.group(1))
        for i, row in enumerate(table.to_pylist()):
            where = f"{file}#row {i}"
            try:
                level = int(row["level"]) if file_level is None else file_level
                problem_id = int(row["problem_id"])
                name, code = str(row["name"]), row["code"]
            except (TypeError, ValueError) as e:
                skipped.append(SkippedTask(where, f"bad row: {e}"))
                continue
            if wanted is not None and level not in wanted:
                continue
            where = f"{where} ({name})"
            # HF names are file stems ("19_ReLU"); keep the part after the id verbatim, as for a checkout.
            name = name[:-3] if name.endswith(".py") else name
            prefix = f"{problem_id}_"
            name = name[len(prefix):] if name.startswith(prefix) else name
            if not isinstance(code, str):
                skipped.append(SkippedTask(where, "code is not a string"))
                continue
            problems = reference_problems(code)
            if problems:
                skipped.append(SkippedTask(where, "; ".join(problems)))
                continue
            tasks.append(Task(level, problem_id, name, code, where))
    return _finish(tasks, skipped, str(path))


def load_builtin_tasks(levels: Iterable[int] | None = None) -> LoadedTasks:
    """Our own KernelBench-format tasks, shipped in the package (the default when no KernelBench is configured)."""
    return load_kernelbench_dir(BUILTIN_DIR, levels)


@dataclasses.dataclass
class TasksConfig:
    """Which tasks to use (config section `tasks`).

    kernelbench_dir: a KernelBench checkout (repo root or its KernelBench/ folder). Empty: not used.
    parquet: the Hugging Face export (a parquet/arrow file or a folder of them). Empty: not used.
      With neither set, the built-in task set is used.
    levels: which levels to load.
    split_file: a JSON split (see `save_split`). Empty: the deterministic default split below.
    holdout_fraction: share of each level held out by the default split (Kevin: 10 of 100 per level).
    split_seed: seed of the default split.
    """
    kernelbench_dir: str = ""
    parquet: str = ""
    levels: tuple[int, ...] = (1, 2)
    split_file: str = ""
    holdout_fraction: float = 0.1
    split_seed: int = 0


def load_tasks(config: TasksConfig) -> LoadedTasks:
    if config.kernelbench_dir and config.parquet:
        raise ValueError("set either tasks.kernelbench_dir or tasks.parquet, not both")
    if config.kernelbench_dir:
        loaded = load_kernelbench_dir(config.kernelbench_dir, config.levels)
    elif config.parquet:
        loaded = load_kernelbench_parquet(config.parquet, config.levels)
    else:
        loaded = load_builtin_tasks(config.levels)
    if not loaded.tasks:
        raise ValueError(f"no tasks loaded for levels {tuple(config.levels)} ({len(loaded.skipped)} skipped)")
    return loaded


# ---------------------------------------------------------------------------------------------------------------------
# Splits. Kevin trained on 180 tasks of levels 1-2 and held out 20 but never published which; our default split is
# deterministic (seeded), stratified by level, and written out as a file so that a run can be reproduced exactly.

@dataclasses.dataclass(frozen=True)
class Split:
    train: tuple[str, ...]
    holdout: tuple[str, ...]
    seed: int | None = None
    content_hashes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # task_id -> hash when written

    def __post_init__(self):
        overlap = sorted(set(self.train) & set(self.holdout))
        if overlap:
            raise ValueError(f"split has tasks in both train and holdout: {overlap[:10]}")

    def to_dict(self) -> dict:
        """Plain data (a split file, a checkpoint's record); `from_dict` reads it back."""
        return {"seed": self.seed, "train": list(self.train), "holdout": list(self.holdout),
                "content_hashes": dict(self.content_hashes)}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Split":
        return cls(tuple(data["train"]), tuple(data["holdout"]), data.get("seed"),
                   dict(data.get("content_hashes", {})))


def default_split(tasks: Sequence[Task], holdout_fraction: float = 0.1, seed: int = 0) -> Split:
    """Per level, order task ids by sha256(seed:task_id) and hold out the first round(fraction * n) (>= 1 when the
    level has >= 2 tasks and fraction > 0). A task's rank depends only on its id and the seed, not on file order."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    by_level: dict[int, list[str]] = {}
    for t in tasks:
        by_level.setdefault(t.level, []).append(t.task_id)
    train, holdout = [], []
    for level in sorted(by_level):
        ids = sorted(by_level[level], key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
        n_hold = round(holdout_fraction * len(ids))
        if holdout_fraction > 0 and len(ids) >= 2:
            n_hold = max(1, n_hold)
        holdout += ids[:n_hold]
        train += ids[n_hold:]
    hashes = {t.task_id: t.content_hash for t in tasks}
    return Split(tuple(sorted(train)), tuple(sorted(holdout)), seed, hashes)


def save_split(split: Split, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(split.to_dict(), indent=1) + "\n")


def load_split(path: str | Path) -> Split:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read split file {path}: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("train"), list) or not isinstance(
            data.get("holdout"), list):
        raise ValueError(f"split file {path} must be a JSON object with lists 'train' and 'holdout'")
    return Split.from_dict(data)


def resolve_split(tasks: Sequence[Task], config: TasksConfig, write_to: str | Path | None = None) -> Split:
    """The split a run uses: `config.split_file` if set, else the default split (written to `write_to` if given,
    e.g. the run's workdir/split.json, so that the run can be reproduced with it)."""
    if config.split_file:
        return load_split(config.split_file)
    split = default_split(tasks, config.holdout_fraction, config.split_seed)
    if write_to is not None:
        save_split(split, write_to)
        log.info("wrote the default split (%d train, %d holdout) to %s", len(split.train), len(split.holdout),
                 write_to)
    return split


def select(tasks: Sequence[Task], split: Split, part: Literal["train", "holdout", "all"]) -> list[Task]:
    """The tasks of one part of a split, in the split's order. A split naming unknown tasks is an error (it was made
    for another task set); a task whose content hash differs from the one recorded in the split is logged."""
    by_id = {t.task_id: t for t in tasks}
    named = {"train": split.train, "holdout": split.holdout, "all": split.train + split.holdout}[part]
    unknown = [i for i in split.train + split.holdout if i not in by_id]
    if unknown:
        raise ValueError(f"split names {len(unknown)} task(s) that are not loaded, e.g. {unknown[:10]}")
    not_covered = [i for i in by_id if i not in set(split.train) | set(split.holdout)]
    if not_covered:
        log.warning("%d loaded task(s) are in neither part of the split, e.g. %s", len(not_covered), not_covered[:5])
    for task_id in named:
        recorded = split.content_hashes.get(task_id)
        if recorded is not None and recorded != by_id[task_id].content_hash:
            log.warning("task %s differs from the copy the split was made with (content hash %s… vs %s…)", task_id,
                        by_id[task_id].content_hash[:12], recorded[:12])
    return [by_id[i] for i in named]


def check_known_tasks(task_ids: Iterable[str], known: Mapping[str, Any], where: str) -> None:
    """Unknown task ids are an error naming them (the input was made for another task set)."""
    unknown = sorted(set(task_ids) - set(known))
    if unknown:
        raise ValueError(f"{where} refers to {len(unknown)} task(s) that are not in the loaded task set, e.g. "
                         f"{unknown[:8]}; load the task set it was made with (--config.tasks.kernelbench_dir / "
                         f"--config.tasks.parquet / --config.tasks.levels). Known ids look like "
                         f"{sorted(known)[:3]}")
