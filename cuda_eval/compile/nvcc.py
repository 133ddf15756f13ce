"""The compiler processes of one build: one sandbox session, one deadline, every process killable when a sibling
chain fails (`Runner`); nvcc's host chain (preprocess, cudafe++) and device chain (preprocess, cicc, ptxas,
fatbinary) run in parallel from its `-dryrun` commands (`compile_cuda`; anything unexpected in the dry run: plain
nvcc); and the compilers' diagnostics cleaned for the model (`clean_log`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import re
import shlex
import threading
import time
from collections.abc import Mapping, Sequence

from cuda_eval.compile.build_dirs import write_private
from cuda_eval.compile.toolchain import Toolchain
from cuda_eval.sandbox import runner as sb


@dataclasses.dataclass
class Phase:
    name: str
    seconds: float
    ok: bool
    cpu_s: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Runner:
    """Runs compiler commands of one build in one sandbox session, with a shared deadline; every process can be
    killed when a sibling chain fails."""

    def __init__(self, session: sb.SandboxSession, limits: sb.SandboxLimits, deadline: float, cwd: str,
                 parent: Runner | None = None):
        self.session, self.limits, self.deadline, self.cwd = session, limits, deadline, cwd
        self._procs: set = set()
        self._lock = threading.Lock()
        self.cancelled = False
        self._timed_out = False
        self._parent = parent

    def group(self) -> Runner:
        """A runner for one group of processes (one nvcc compile) that can be cancelled on its own."""
        return Runner(self.session, self.limits, self.deadline, self.cwd, parent=self)

    @property
    def timed_out(self) -> bool:
        return self._timed_out

    @timed_out.setter
    def timed_out(self, value: bool) -> None:
        self._timed_out = value
        if value and self._parent is not None:
            self._parent.timed_out = True

    def run(self, argv: Sequence[str], name: str, phases: list[Phase], extra_env: Mapping[str, str] | None = None
            ) -> dict:
        left = self.deadline - time.monotonic()
        if self.cancelled or left <= 0:
            self.timed_out = self.timed_out or left <= 0
            return {"exit_code": -1, "signal": 9, "timed_out": left <= 0, "stdout": b"", "stderr": b"",
                    "wall_s": 0.0, "cancelled": True}
        limits = dataclasses.replace(self.limits, wall_timeout_s=max(0.1, left))
        t0 = time.monotonic()
        # this thread waits for the step below, so the step may die with it (no compile left running unwatched)
        proc = self.session.spawn(list(argv), limits, cwd=self.cwd, extra_env=extra_env, die_with_parent_thread=True)
        with self._lock:
            self._procs.add(proc)
        try:
            res = proc.wait(None)
        finally:
            with self._lock:
                self._procs.discard(proc)
        if res["timed_out"]:
            self.timed_out = True
        ok = res["exit_code"] == 0 and not res["timed_out"]
        phases.append(Phase(name, round(time.monotonic() - t0, 3), ok, round(res["cpu_s"], 3)))
        return res

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            procs = list(self._procs)
        for p in procs:
            p.kill()


def output_text(res: Mapping) -> str:
    return (res.get("stdout", b"") + res.get("stderr", b"")).decode("utf-8", "replace")


# --- nvcc, phase by phase ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class _NvccPlan:
    assignments: list[str]
    host: list[tuple[str, str]]      # (phase name, shell command)
    device: list[tuple[str, str]]
    final: list[tuple[str, str]]
    module_id_file: str | None


def _classify(cmds: list[str]) -> _NvccPlan | None:
    """Split nvcc's dry run into host chain / device chain / final compile, or None if it is not the plain
    one-file -c compilation we know (then plain nvcc runs instead)."""
    assignments, host, device, final = [], [], [], []
    module_id_file = None
    for cmd in cmds:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd):
            assignments.append(cmd)
            continue
        try:
            argv = shlex.split(cmd.replace("$CICC_PATH", "CICC"))
        except ValueError:
            return None
        tool = os.path.basename(argv[0])
        if tool == "rm":
            continue
        if tool == "cudafe++":
            if "--gen_module_id_file" not in argv or "--module_id_file_name" not in argv:
                return None
            module_id_file = argv[argv.index("--module_id_file_name") + 1]
            # We write the module id ourselves so that cicc need not wait for cudafe++.
            host.append(("cudafe++", cmd.replace(" --gen_module_id_file ", " ")))
        elif tool == "cicc":
            device.append(("cicc", cmd))
        elif tool in ("ptxas", "fatbinary"):
            device.append((tool, cmd))
        elif "-E" in argv:
            (device if any(a.startswith("-D__CUDA_ARCH__=") for a in argv) else host).append(
                ("device preprocess" if any(a.startswith("-D__CUDA_ARCH__=") for a in argv) else "host preprocess",
                 cmd))
        elif "-c" in argv:
            final.append(("host compile", cmd))
        else:
            return None
    if len(host) != 2 or not device or len(final) != 1 or module_id_file is None:
        return None
    return _NvccPlan(assignments, host, device, final, module_id_file)


def _script(cmd: str) -> list[str]:
    return ["/bin/sh", "-c", cmd]


def _assignments_env(assignments: list[str]) -> dict[str, str]:
    """nvcc's dry-run variable lines (`NAME=value`, value shell-quoted) as environment variables."""
    env = {}
    for a in assignments:
        name, value = a.split("=", 1)
        try:
            env[name] = " ".join(shlex.split(value))
        except ValueError:
            env[name] = value.strip()
    return env


def _module_id(source_text: str, stem: str) -> str:
    """A module id in nvcc's format (_<hash>_<len>_<file>_<hash>), unique per content."""
    h = hashlib.sha256(source_text.encode()).hexdigest()
    name = f"{stem}_cu"
    return f"_{h[:8]}_{len(name)}_{name}_{h[8:16]}"


class _ChainFailed(Exception):
    pass


_SHELL_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+-]+")


def compile_cuda(runner: Runner, cu_file: str, obj_file: str, cuda_cflags: Sequence[str], *, toolchain: Toolchain,
                 parallel: bool, host_opt_level: str | None, phases: list[Phase]) -> tuple[bool, str]:
    """Compile one .cu into an object. Returns (ok, compiler output of the failing step or all warnings).
    cu_file lies in a directory of ours (the module id is written next to it); obj_file in the runner's cwd."""
    runner = runner.group()
    nvcc = toolchain.nvcc
    base = [nvcc, *cuda_cflags, "-c", cu_file, "-o", obj_file]
    plan = None
    if parallel:
        dry = runner.run([nvcc, "-dryrun", *base[1:]], "nvcc -dryrun", phases)
        if dry["exit_code"] == 0:
            cmds = [ln[3:].strip() for ln in dry["stderr"].decode("utf-8", "replace").splitlines()
                    if ln.startswith("#$ ")]
            plan = _classify(cmds)
    src_dir = os.path.dirname(os.path.abspath(cu_file))
    stem = os.path.splitext(os.path.basename(cu_file))[0]
    # The module id goes next to the source (a directory of ours; candidate file names never start with a dot),
    # never where nvcc's dry run put it: that is the sandbox uid's directory.
    module_id_path = os.path.join(src_dir, f".{stem}.module_id")
    if plan is not None:
        old_arg, new_arg = f'"{plan.module_id_file}"', f'"{module_id_path}"'
        if not _SHELL_SAFE_PATH.fullmatch(module_id_path) or not any(old_arg in c for _, c in plan.host):
            plan = None  # not the dry run we know: plain nvcc
        else:
            plan.host = [(n, c.replace(old_arg, new_arg)) for n, c in plan.host]
            plan.device = [(n, c.replace(old_arg, new_arg)) for n, c in plan.device]
    if plan is None:
        argv = base if not host_opt_level else base + ["-Xcompiler", host_opt_level]
        res = runner.run(argv, "nvcc", phases)
        return res["exit_code"] == 0 and not res["timed_out"], output_text(res)

    with open(cu_file) as f:
        cu_text = f.read()
    write_private(src_dir, os.path.basename(module_id_path), _module_id(cu_text + " ".join(cuda_cflags), stem))

    outputs: dict[str, str] = {}
    env = _assignments_env(plan.assignments)

    def chain(steps: list[tuple[str, str]], label: str) -> None:
        for name, cmd in steps:
            res = runner.run(_script(cmd), name, phases, extra_env=env)
            outputs[label] = outputs.get(label, "") + output_text(res)
            if res["exit_code"] != 0 or res["timed_out"]:
                raise _ChainFailed(label)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        device_future = pool.submit(chain, plan.device, "device")
        host_error = None
        try:
            chain(plan.host, "host")
        except _ChainFailed:
            host_error = True
            runner.cancel()  # nvcc stops at the host front end's errors: so do we
        device_error = None
        try:
            device_future.result()
        except _ChainFailed:
            device_error = True
    # nvcc's order: host preprocess, cudafe++, then the device chain. Report what nvcc would have reported.
    if host_error:
        return False, outputs.get("host", "")
    if device_error:
        return False, outputs.get("host", "") + outputs.get("device", "")
    final_cmd = plan.final[0][1]
    if host_opt_level:
        final_cmd += f" {shlex.quote(host_opt_level)}"
    res = runner.run(_script(final_cmd), "host compile", phases, extra_env=env)
    log = outputs.get("host", "") + outputs.get("device", "") + output_text(res)
    return res["exit_code"] == 0 and not res["timed_out"], log


# --- logs ----------------------------------------------------------------------------------------------------------
_NOISE = re.compile(r"^(In file included from|                 from |compilation terminated|\d+ errors? detected in|"
                    r"Remark: The warnings can be suppressed|ninja: |\s*$|nvcc warning : .*deprecated)")
_ERROR_START = re.compile(r"(\berror\b|undefined reference|fatal error|: error:|\(\d+\): error)", re.I)
_LOCATION = re.compile(r"^(?P<file>[^:()\s]+?)(?:\((?P<eline>\d+)\)|:(?P<gline>\d+)(?::\d+)?):")


def clean_log(raw: str, *, build_dir: str | Sequence[str], toolchain: Toolchain | None, max_errors: int,
              max_chars: int) -> str:
    """The first `max_errors` diagnostics (error lines with the source/caret lines that follow), paths relative to
    the candidate's strings, torch header paths shortened, include chains and notes dropped, trimmed.
    `build_dir`: the directory (or directories) whose prefix is dropped from paths."""
    text = raw
    for d in sorted([build_dir] if isinstance(build_dir, str) else build_dir, key=len, reverse=True):
        text = text.replace(d.rstrip("/") + "/", "")
    if toolchain:
        for inc in sorted(toolchain.torch_include, key=len, reverse=True):
            text = text.replace(inc.rstrip("/") + "/", "<torch>/")
        text = text.replace(toolchain.cuda_home.rstrip("/") + "/", "<cuda>/")
    lines = [ln.rstrip() for ln in text.splitlines()]
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for ln in lines:
        if _NOISE.match(ln):
            continue
        is_error = bool(_ERROR_START.search(ln)) and "warning" not in ln.split(":", 3)[-1][:20].lower()
        is_note = re.search(r"(: note:|: warning:|\(\d+\): warning|\): remark|detected during)", ln) is not None
        if is_error and not is_note:
            current = [ln]
            blocks.append(current)
        elif is_note:
            current = None
        elif current is not None and len(current) < 6:
            current.append(ln)
    if not blocks:  # no recognisable diagnostics: the tail of the output is the best we have
        tail = "\n".join(ln for ln in lines if ln.strip())
        return tail[-max_chars:]
    out = "\n".join("\n".join(b) for b in blocks[:max_errors])
    if len(blocks) > max_errors:
        out += f"\n... ({len(blocks) - max_errors} more errors)"
    if len(out) > max_chars:
        out = out[:max_chars - 20].rstrip() + "\n... (trimmed)"
    return out
