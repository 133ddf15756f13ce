"""The build toolchain: versions that address the cache, and compiler flags taken from the installed torch.

Flags are never hard-coded: a helper subprocess (`python -m cuda_eval.compile.toolchain`, trusted code only: the
caller's process must not import torch) asks torch.utils.cpp_extension itself to write the ninja file it would use for a
template extension whose user flags are placeholders, for each combination of the two conditional rules torch applies
(user arch flags suppress torch's -gencode; a user -std= suppresses torch's). Per candidate, the template is filled in
with its name and flags (`Toolchain.flags`). The helper's answer is cached in-process and on disk (keyed by the torch
install, nvcc, the C++ compiler and the arch), so it runs once per machine.

Also gathered once: the header facts the light-header build needs (the `namespace torch {...}` block of
torch/types.h, the list of ATen/ops headers), and whether any torch header mentions TORCH_EXTENSION_NAME (if none
does, main.cpp can define it after the precompiled header instead of on the command line, so one PCH serves every
extension name).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence

import cuda_eval
from cuda_eval.sandbox import safe_dirs
from cuda_eval.static import flag_policy

# Bump when the build (builder.py and its parts) changes what it produces for the same inputs (it addresses the cache).
RECIPE_VERSION = "5"
DEFAULT_ARCH = "sm_90"

NAME = "KJNAMEPLACEHOLDER"
CFLAGS = "@@KJ_CFLAGS@@"
CUDA_CFLAGS = "@@KJ_CUDA_CFLAGS@@"
ARCH_MARK = "@@kj_arch@@"          # contains "arch": torch then adds no -gencode of its own
STD_MARK = "-std=@@KJ_STD@@"        # torch then adds no -std of its own
LDFLAGS = "@@KJ_LDFLAGS@@"
INCLUDE = "/@@KJ_INCLUDE@@"


@dataclasses.dataclass(frozen=True)
class Toolchain:
    arch: str                      # "sm_90"
    arch_source: str               # "flag" | "gpu" | "default"
    torch_version: str
    torch_include: tuple[str, ...]
    torch_lib_dir: str
    cuda_home: str
    nvcc: str
    nvcc_version: str
    cxx: str
    cxx_version: str
    python_ext_suffix: str
    templates: Mapping[str, Mapping[str, list[str]]]   # "<cuda>/<arch>/<std>" -> {cflags, cuda_cflags, ldflags}
    torch_namespace_block: str     # "namespace torch { ... }" of torch/types.h
    aten_ops: tuple[str, ...]      # names with an ATen/ops/<name>.h header
    headers_use_extension_name: bool
    missing_torch_libs: tuple[str, ...]   # e.g. ("c10_cuda", "torch_cuda") with a CPU-only torch
    recipe_version: str = RECIPE_VERSION

    def ident(self) -> dict:
        """What addresses built products: everything that changes the bytes of a build."""
        return {"arch": self.arch, "torch": self.torch_version, "nvcc": self.nvcc_version, "cxx": self.cxx_version,
                "python": self.python_ext_suffix, "recipe": self.recipe_version,
                "torch_include": list(self.torch_include)}

    def summary(self) -> dict:
        """For CompileOutcome.toolchain / EvalResult.meta."""
        return {"arch": self.arch, "arch_source": self.arch_source, "torch_version": self.torch_version,
                "nvcc_version": self.nvcc_version, "cxx": f"{self.cxx} {self.cxx_version}",
                "recipe_version": self.recipe_version}

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["templates"] = {k: dict(v) for k, v in self.templates.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Toolchain:
        kw = dict(d)
        for k in ("torch_include", "aten_ops", "missing_torch_libs"):
            kw[k] = tuple(kw[k])
        return cls(**kw)

    # --- flags of one extension ---------------------------------------------------------------------------------
    def flags(self, name: str, *, with_cuda: bool, extra_cflags: Sequence[str] = (),
              extra_cuda_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
              extra_include_paths: Sequence[str] = ()) -> dict[str, list[str]]:
        """cflags (g++), cuda_cflags (nvcc) and ldflags as torch's load_inline would use them. The candidate's
        flags must pass the allow-list (flag_policy.FlagRejected, a ValueError, otherwise); blank include paths
        are dropped (torch would add the current directory)."""
        flag_policy.check(extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, target_arch=self.arch)
        extra_cflags, extra_cuda_cflags, extra_ldflags = (_shell_words(f) for f in (extra_cflags, extra_cuda_cflags,
                                                                                    extra_ldflags))
        includes = [os.path.abspath(p.strip()) for p in extra_include_paths if p.strip()]
        user_arch = any("arch" in f for f in extra_cuda_cflags if "TORCH_EXTENSION_NAME" not in f)
        user_std = any(f.startswith("-std=") for f in extra_cuda_cflags)
        t = self.templates[f"{int(with_cuda)}/{int(user_arch)}/{int(user_std)}"]

        def fill(tokens: list[str]) -> list[str]:
            out: list[str] = []
            for tok in tokens:
                if tok == CFLAGS:
                    out += extra_cflags
                elif tok == CUDA_CFLAGS:
                    out += extra_cuda_cflags
                elif tok in (ARCH_MARK, STD_MARK):
                    continue
                elif tok == LDFLAGS:
                    out += extra_ldflags
                elif tok == f"-I{INCLUDE}":
                    out += [f"-I{p}" for p in includes]
                else:
                    out.append(tok.replace(NAME, name))
            return out
        return {"cflags": fill(t["cflags"]), "cuda_cflags": fill(t["cuda_cflags"]) if with_cuda else [],
                "ldflags": self.link_existing(fill(t["ldflags"]))}

    def link_existing(self, ldflags: list[str]) -> list[str]:
        """Drop -l flags of torch libraries this torch does not ship (CPU-only torch has no c10_cuda/torch_cuda:
        CI only compiles; on a GPU machine every library exists and nothing is dropped)."""
        return [f for f in ldflags if not (f.startswith("-l") and f[2:] in self.missing_torch_libs)]


_shell_words = flag_policy.shell_words


# --- detection --------------------------------------------------------------------------------------------------
_lock = threading.Lock()
_memo: dict[tuple, Toolchain] = {}


def normalize_arch(arch: str) -> str:
    """"sm_90", "90", "9.0", "sm_90a" -> "sm_90"/"sm_90a"."""
    a = arch.strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)\.?(\d)?([a-z]?)", a)
    if not m:
        raise ValueError(f"bad CUDA arch {arch!r} (expected e.g. 'sm_90', '9.0', 'auto')")
    major_minor = m.group(1) + (m.group(2) or "")
    if len(major_minor) < 2:
        raise ValueError(f"bad CUDA arch {arch!r}")
    return f"sm_{major_minor}{m.group(3)}"


def gpu_arch() -> str | None:
    """Compute capability of the first visible GPU via nvidia-smi (no CUDA context), e.g. "sm_90"; None if none."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    if out.returncode != 0 or not lines:
        return None
    try:
        return normalize_arch(lines[0])
    except ValueError:
        return None


def _torch_origin() -> str:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise RuntimeError("torch is not installed")
    return spec.origin


def _stamp(path: str | None) -> str:
    if not path:
        return "-"
    path = os.path.realpath(path)  # a staged sandbox runtime reaches the same files through symlinks
    try:
        st = os.stat(path)
        return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return f"{path}:missing"


def resolve_arch(arch: str) -> tuple[str, str]:
    if arch == "auto":
        found = gpu_arch()
        return (found, "gpu") if found else (DEFAULT_ARCH, "default")
    return normalize_arch(arch), "flag"


def detect(arch: str = "auto", *, cache_dir: str | None = None, python: str | None = None,
           timeout_s: float = 300.0) -> Toolchain:
    """The toolchain for `arch` ("auto": the GPU's, else sm_90). Runs the helper subprocess at most once per
    machine (cached in `cache_dir`/toolchain, if given) and once per process."""
    arch, arch_source = resolve_arch(arch)
    python = python or sys.executable
    nvcc = shutil.which("nvcc") or ""
    key_src = "|".join([RECIPE_VERSION, _stamp(os.path.abspath(__file__)), arch, sys.version, _stamp(_torch_origin()), _stamp(nvcc), os.environ.get("CXX", ""),
                        _stamp(shutil.which(os.environ.get("CXX", "c++"))), os.environ.get("CUDA_HOME", "")])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
    with _lock:
        if (key, arch_source) in _memo:
            return _memo[(key, arch_source)]
    record_dir = os.path.join(cache_dir, "toolchain") if cache_dir else None
    data = _read_record(record_dir, f"{key}.json") if record_dir else None
    if data is None:
        proc = subprocess.run([python, "-m", "cuda_eval.compile.toolchain", "--arch", arch], capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ, "PYTHONPATH": _pythonpath()})
        if proc.returncode != 0:
            raise RuntimeError("toolchain detection failed (python -m cuda_eval.compile.toolchain):\n"
                               f"{proc.stderr[-3000:]}")
        data = json.loads(proc.stdout)
        if record_dir:
            _write_record(record_dir, f"{key}.json", data)
    data["arch_source"] = arch_source
    tc = Toolchain.from_dict(data)
    with _lock:
        _memo[(key, arch_source)] = tc
    return tc


_RECORD_FIX = safe_dirs.fix_hint("CompileConfig.cache_dir / $CUDA_EVAL_CACHE_DIR")


def _read_record(record_dir: str, name: str) -> dict | None:
    """The remembered toolchain, or None. Its compiler templates run in every build, so it is read only from a
    directory and a file that nobody but root or we could have written (safe_dirs): anything else is refused."""
    try:
        raw = safe_dirs.read_trusted_file(record_dir, name, max_bytes=64 << 20, what="the toolchain record",
                                          fix=_RECORD_FIX)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None  # torn or stale: detected again and replaced
    return data if isinstance(data, dict) else None


def _write_record(record_dir: str, name: str, data: dict) -> None:
    try:
        safe_dirs.ensure_dir(record_dir, 0o755, what="the toolchain record dir", fix=_RECORD_FIX)
    except safe_dirs.NotOurs:  # root's cache seen from a sandboxed GPU worker: just not remembered
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=record_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(record_dir, name))
    except OSError:  # a read-only filesystem: just not remembered
        pass


def _pythonpath() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(cuda_eval.__file__)))   # what holds cuda_eval/
    return os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


# --- the helper (runs with torch imported) ------------------------------------------------------------------------
def _cuda_home() -> str:
    """The CUDA toolkit root: torch's choice when it has one, else the first candidate that holds bin/nvcc and
    include/cuda_runtime.h (nvcc on PATH may be a wrapper script outside the toolkit)."""
    import torch.utils.cpp_extension as ce
    candidates = [ce.CUDA_HOME, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(nvcc)))
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
        try:  # a wrapper script: ask nvcc where its own files are
            out = subprocess.run([nvcc, "-dryrun", "--version"], capture_output=True, text=True, timeout=60).stderr
            m = re.search(r"^#\$ TOP=(.+)$", out, re.M)
            if m:
                candidates.append(os.path.realpath(m.group(1).strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    candidates.append("/usr/local/cuda")
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "bin", "nvcc")) and \
                os.path.exists(os.path.join(c, "include", "cuda_runtime.h")):
            return c
    raise RuntimeError(f"no CUDA toolkit found (tried {[c for c in candidates if c]}; set CUDA_HOME)")


def _ninja_flags(ce, with_cuda: bool, user_arch: bool, user_std: bool, workdir: str) -> dict[str, list[str]]:
    import inspect
    extra_cuda = [CUDA_CFLAGS] + ([ARCH_MARK] if user_arch else []) + ([STD_MARK] if user_std else [])
    sources = [os.path.join(workdir, "main.cpp")] + ([os.path.join(workdir, "cuda.cu")] if with_cuda else [])
    for s in sources:
        open(s, "w").close()
    prep = inspect.signature(ce._prepare_ldflags).parameters
    ld_args = {"extra_ldflags": [LDFLAGS], "with_cuda": with_cuda, "with_sycl": False, "verbose": False,
               "is_standalone": False}
    ldflags = ce._prepare_ldflags(**{k: v for k, v in ld_args.items() if k in prep})
    write = ce._write_ninja_file_to_build_library
    args = {"path": os.path.join(workdir, "build.ninja"), "name": NAME, "sources": sources,
            "extra_cflags": [CFLAGS], "extra_cuda_cflags": extra_cuda, "extra_sycl_cflags": [],
            "extra_ldflags": ldflags, "extra_include_paths": [INCLUDE], "with_cuda": with_cuda, "with_sycl": False,
            "is_standalone": False}
    write(**{k: v for k, v in args.items() if k in inspect.signature(write).parameters})
    values = {}
    with open(args["path"]) as f:
        for line in f:
            m = re.match(r"^(cflags|cuda_cflags|ldflags) = (.*)$", line.rstrip("\n"))
            if m:
                values[m.group(1)] = shlex.split(m.group(2))
    # torch writes `-isystem <dir>` as two tokens in one string; shlex already split them.
    return {"cflags": values.get("cflags", []), "cuda_cflags": values.get("cuda_cflags", []),
            "ldflags": values.get("ldflags", [])}


def describe(arch: str) -> dict:
    import torch
    import torch.utils.cpp_extension as ce
    cuda_home = _cuda_home()
    saved_home, saved_arch_list = ce.CUDA_HOME, os.environ.get("TORCH_CUDA_ARCH_LIST")
    ce.CUDA_HOME = cuda_home  # a CPU-only torch leaves it None; we still compile (compile_only mode)
    num = arch[3:]
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{num[:-1]}.{num[-1]}" if not num.endswith("a") else \
        f"{num[:-2]}.{num[-2]}a"
    templates = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for with_cuda in (True, False):
                for user_arch in (False, True):
                    for user_std in (False, True):
                        templates[f"{int(with_cuda)}/{int(user_arch)}/{int(user_std)}"] = \
                            _ninja_flags(ce, with_cuda, user_arch, user_std, tmp)
    finally:
        ce.CUDA_HOME = saved_home
        if saved_arch_list is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved_arch_list
    include = [p for p in ce.include_paths()]
    torch_inc = include[0]
    types_h = os.path.join(torch_inc, "torch", "csrc", "api", "include", "torch", "types.h")
    block = ""
    if os.path.exists(types_h):
        with open(types_h) as f:
            text = f.read()
        m = re.search(r"^namespace torch \{.*?^\}\s*//\s*namespace torch", text, re.S | re.M)
        block = m.group(0) if m else ""
    ops_dir = os.path.join(torch_inc, "ATen", "ops")
    ops = sorted(n[:-2] for n in os.listdir(ops_dir) if n.endswith(".h") and not n.endswith(("_ops.h", "_native.h",
                 "_meta.h", "_compositeexplicitautograd_dispatch.h", "_cpu_dispatch.h", "_cuda_dispatch.h",
                 "_meta_dispatch.h", "_compositeimplicitautograd_dispatch.h",
                 "_compositeexplicitautogradnonfunctional_dispatch.h"))) if os.path.isdir(ops_dir) else []
    uses_name = False
    for root, _, files in os.walk(torch_inc):
        for n in files:
            if n.endswith((".h", ".hpp", ".cuh")):
                try:
                    with open(os.path.join(root, n), errors="replace") as f:
                        if "TORCH_EXTENSION_NAME" in f.read():
                            uses_name = True
                            break
                except OSError:
                    pass
        if uses_name:
            break
    lib_dir = ce.TORCH_LIB_PATH
    missing = tuple(lib for lib in ("c10_cuda", "torch_cuda") if not os.path.exists(os.path.join(lib_dir,
                                                                                                   f"lib{lib}.so")))
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    nvcc_out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", nvcc_out)
    cxx = ce.get_cxx_compiler()
    cxx_version = subprocess.run([cxx, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
    import sysconfig
    return {"arch": arch, "arch_source": "flag", "torch_version": torch.__version__,
            "torch_include": [os.path.realpath(p) for p in include], "torch_lib_dir": lib_dir,
            "cuda_home": cuda_home, "nvcc": nvcc, "nvcc_version": m.group(1) if m else nvcc_out.strip()[-40:],
            "cxx": cxx, "cxx_version": cxx_version, "python_ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
            "templates": templates, "torch_namespace_block": block, "aten_ops": ops,
            "headers_use_extension_name": uses_name, "missing_torch_libs": list(missing),
            "recipe_version": RECIPE_VERSION}


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(description="Print the build toolchain (flags from torch) as JSON.")
    p.add_argument("--arch", default=DEFAULT_ARCH)
    args = p.parse_args(argv)
    json.dump(describe(normalize_arch(args.arch)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
