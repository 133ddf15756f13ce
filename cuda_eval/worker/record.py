"""Stage-1 subprocess: run a candidate on the CPU and record every extension it asks to build.

    python -m cuda_eval.worker.record <dir>        # reads <dir>/task.py and <dir>/candidate.py, writes <dir>/record.json

Runs inside the sandbox (cuda_eval.sandbox) with load_inline/load replaced by a recorder (candidate.record_extensions):
 1. compile the candidate (a syntax error is a verdict), check it defines class ModelNew;
 2. execute the task source as a module (get_inputs/get_init_inputs read its module-level constants);
 3. execute the candidate as a module: most programs call load_inline here;
 4. build ModelNew(*get_init_inputs()) on the meta device (no memory, no init cost; falls back to the CPU), because
    some programs call load_inline in __init__;
 5. call forward once on meta inputs, because a few build lazily inside forward (the recorded module raises as soon
    as one of its functions is called, which ends the probe).
Failures in 2-5 are recorded, not fatal: on a CPU-only machine `.cuda()` and friends fail, and what was recorded
before still counts. record.json is rewritten after every phase, so a candidate that hangs in step 4 or 5 still
leaves the specs of step 3 behind. Its content is plain data; the compile pool reads only that file (the candidate
owns stdout/stderr).
"""
from __future__ import annotations

import ast
import json
import os
import sys
import time
import traceback
import types

from cuda_eval.protocol.extension_spec import CANDIDATE_FILE, RECORD_FILE, TASK_FILE

TASK_MODULE = "kernelbench_task"
CANDIDATE_MODULE = "kernelbench_candidate"
MAX_ERROR_CHARS = 3000


def _write(path: str, record: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def format_exception(exc: BaseException, filename: str) -> str:
    """The exception with only the frames of `filename` (the candidate's own lines), trimmed."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    lines = [f"  line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in frames[-5:]]
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    out = ("\n".join(lines) + "\n" if lines else "") + text
    return out[-MAX_ERROR_CHARS:]


def syntax_error_message(e: SyntaxError) -> str:
    where = f"line {e.lineno}" + (f", column {e.offset}" if e.offset else "")
    line = (e.text or "").rstrip("\n")
    return f"SyntaxError: {e.msg} ({where})" + (f"\n    {line}" if line.strip() else "")


def defines_model_new(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree))


def _exec_module(name: str, source: str, filename: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # dataclasses, pickling and typing look the module up by name
    exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # not our __future__ imports
    return module


def record(workdir: str) -> dict:
    out_path = os.path.join(workdir, RECORD_FILE)
    with open(os.path.join(workdir, CANDIDATE_FILE)) as f:
        candidate_source = f.read()
    with open(os.path.join(workdir, TASK_FILE)) as f:
        task_source = f.read()
    cand_filename = os.path.join(workdir, CANDIDATE_FILE)
    task_filename = os.path.join(workdir, TASK_FILE)
    result: dict = {"ok": False, "error_kind": None, "error": None, "specs": [], "phases": {}, "done": False}

    def phase(name: str, t0: float, error: str | None = None, **extra) -> None:
        result["phases"][name] = {"ok": error is None, "error": error, "s": round(time.monotonic() - t0, 4), **extra}
        _write(out_path, result)

    t0 = time.monotonic()
    try:
        tree = ast.parse(candidate_source, cand_filename)
        compile(tree, cand_filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        result.update(error_kind="syntax", error=syntax_error_message(e), done=True)
        phase("parse", t0, result["error"])
        return result
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, absurd nesting
        result.update(error_kind="syntax", error=f"{type(e).__name__}: {e}", done=True)
        phase("parse", t0, result["error"])
        return result
    if not defines_model_new(tree):
        result.update(error_kind="no_model_new", error="the program does not define class ModelNew", done=True)
        phase("parse", t0, result["error"])
        return result
    phase("parse", t0)

    t0 = time.monotonic()
    import torch  # noqa: F401 - timed on its own: it is most of this process' start-up
    from cuda_eval.worker.extension_loader import record_extensions
    phase("import_torch", t0, torch_version=torch.__version__)

    def sync_specs() -> None:
        result["specs"] = [s.to_dict() for s in specs]

    class _Specs(list):
        """Written to record.json at every load_inline call: a program that dies right after (os._exit, a hang
        killed by the timeout) still leaves its recorded builds behind."""

        def append(self, spec) -> None:
            super().append(spec)
            sync_specs()
            _write(out_path, result)

    specs: list = _Specs()
    recorder = record_extensions(specs)

    t0 = time.monotonic()
    task = None
    try:
        task = _exec_module(TASK_MODULE, task_source, task_filename)
        phase("task", t0)
    except BaseException as e:  # noqa: BLE001 - includes SystemExit from a task
        phase("task", t0, f"the reference program failed on the CPU: {format_exception(e, task_filename)}")

    t0 = time.monotonic()
    candidate = None
    try:
        candidate = _exec_module(CANDIDATE_MODULE, candidate_source, cand_filename)
        sync_specs()
        phase("import", t0, n_specs=len(specs))
    except BaseException as e:  # noqa: BLE001
        sync_specs()
        phase("import", t0, format_exception(e, cand_filename), n_specs=len(specs),
              exception=type(e).__name__)

    model = None
    model_cls = getattr(candidate, "ModelNew", None) if candidate is not None else None
    if model_cls is not None and task is not None and hasattr(task, "get_init_inputs"):
        t0 = time.monotonic()
        errors = []
        n_before = len(specs)
        for device in ("meta", "cpu"):
            try:
                with torch.device(device):
                    init_inputs = task.get_init_inputs()
                    model = model_cls(*init_inputs)
                break
            except BaseException as e:  # noqa: BLE001
                errors.append(f"[{device}] {format_exception(e, cand_filename)}")
                if len(specs) > n_before:
                    break  # what __init__ builds is recorded: no need to retry
        sync_specs()
        phase("construct", t0, None if model is not None else "\n".join(errors), n_specs=len(specs))

    if model is not None and hasattr(task, "get_inputs"):
        t0 = time.monotonic()
        try:
            with torch.device("meta"), torch.no_grad():
                inputs = task.get_inputs()
                model(*inputs)
            error = None
        except BaseException as e:  # noqa: BLE001 - expected: the recorded extension raises when called
            error = format_exception(e, cand_filename)
        sync_specs()
        phase("forward", t0, error, n_specs=len(specs))

    recorder.uninstall()
    sync_specs()
    result["done"] = True
    if specs:
        result["ok"] = True
    else:
        imp = result["phases"].get("import", {})
        if not imp.get("ok", False):
            result.update(error_kind="record_error",
                          error=f"the program raised before building any extension:\n{imp.get('error')}")
        else:
            result.update(error_kind="no_load_inline",
                          error="the program never calls torch.utils.cpp_extension.load_inline (or load)")
    _write(out_path, result)
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m cuda_eval.worker.record <dir>", file=sys.stderr)
        return 2
    record(os.path.abspath(argv[1]))
    # os._exit: threads or atexit handlers a candidate left behind must not keep this process alive.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
