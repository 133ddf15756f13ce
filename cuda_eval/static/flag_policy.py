"""Which compiler and linker flags a candidate may pass to load_inline / load (an allow-list, as data).

Candidate flags reach g++, nvcc and the tools nvcc drives; many options of those tools run programs (-wrapper,
-B, -ccbin, -fplugin), read or write files of the candidate's choosing (-include, -o, -save-temps, @file, -I/-L) or
hand raw options to another tool (-Wl,, -Xlinker). None of that is needed to write a fast kernel, so only the flags
below are accepted, checked token by token after the shell-style splitting torch applies (toolchain._shell_words).
Anything else gives the verdict "flag_rejected" (a `FlagRejected` here) before any build starts.

Compile flags (extra_cflags and extra_cuda_cflags share one list; a flag the compiler does not know still fails
to compile, as it would with torch):
- optimisation: -O, -O0..-O3, -Os, -Og, -Ofast
- language: -std= / --std= c++11/14/17/20 (or gnu++..)
- macros: -DNAME, -DNAME=VALUE, -D NAME[=VALUE], -UNAME, -U NAME (NAME an identifier; VALUE letters, digits and
  _.+-*/%~^:() only: no spaces, quotes or newlines, since nvcc's commands go through a shell)
- math and code generation: --use_fast_math, -ffast-math, -ftz/-prec-div/-prec-sqrt/-fmad=true|false,
  -funroll-loops, -fno-strict-aliasing, -fno-math-errno, -fomit-frame-pointer, -fopenmp, -fPIC, -pthread,
  -march=native, -mtune=native, -mavx/-mavx2/-mfma/-mf16c/-mavx512f
- diagnostics: -w, -W<warning> (no commas: -Wl, -Wa, -Wp pass options to other tools), -Werror, -g, -g0..-g3, -G,
  -lineinfo, -res-usage
- nvcc: --expt-relaxed-constexpr, --expt-extended-lambda, --extended-lambda, --restrict, --maxrregcount=N,
  -arch / --gpu-architecture / -code / --gpu-code / -gencode / --generate-code for sm_XX, compute_XX, lto_XX up
  to the machine's target major version (not native/all)
- --default-stream legacy|null|per-thread, --diag-suppress/--diag-warn/--diag-error N[,N..]
- -Xptxas / --ptxas-options (then -O0..3, -v, --verbose, --warn-on-spills, --warn-on-local-memory-usage,
  --warn-on-double-precision-use, -warn-spills, -warn-lmem-usage, -dlcm=.., --maxrregcount=N,
  --allow-expensive-optimizations=true|false), -Xcompiler / --compiler-options (then the host flags above) and
  -Xcudafe (then --diag_suppress=.., --diag_warning=.., --diag_error=.., --display_error_number), with the
  argument as the next token or joined by '=' (nvcc splits it at commas; each part is checked)
Link flags (extra_ldflags): -l<lib> or -l <lib> for LINK_LIBRARIES only.
Include paths (extra_include_paths): none; the build has no directory of the candidate's (blank entries are
ignored): headers belong in the sources.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

# --- the allow-list ---------------------------------------------------------------------------------------------
# Host-compiler flags of one token (valid in extra_cflags, extra_cuda_cflags and inside -Xcompiler).
HOST_FLAGS: tuple[str, ...] = (
    r"-O[0-3sg]?", r"-Ofast",
    r"--?std=(c|gnu)\+\+(11|14|17|20)",
    r"-ffast-math", r"-funroll-loops", r"-fno-strict-aliasing", r"-fno-math-errno", r"-fomit-frame-pointer",
    r"-fopenmp", r"-fPIC", r"-pthread",
    r"-march=native", r"-mtune=native", r"-m(avx|avx2|fma|f16c|avx512f)",
    r"-w", r"-W(?![lap]\b)(no-)?[A-Za-z0-9][A-Za-z0-9_+=.-]*",
    r"-g[0-3]?",
)
# nvcc flags of one token (extra_cuda_cflags; in extra_cflags g++ rejects them itself).
NVCC_FLAGS: tuple[str, ...] = (
    r"--?use_fast_math", r"--?(ftz|prec-div|prec-sqrt|fmad)=(true|false)",
    r"--?expt-relaxed-constexpr", r"--?expt-extended-lambda", r"--?extended-lambda", r"--?restrict",
    r"-G", r"--?lineinfo", r"--generate-line-info", r"--?res-usage", r"--resource-usage",
    r"--?maxrregcount=\d{1,3}",
    r"--W(?![lap]\b)(no-)?[A-Za-z0-9][A-Za-z0-9_+=.-]*",
)
# Arguments of -Xptxas / --ptxas-options.
PTXAS_FLAGS: tuple[str, ...] = (
    r"-O[0-3]", r"-v", r"--verbose", r"--warn-on-spills", r"--warn-on-local-memory-usage",
    r"--warn-on-double-precision-use", r"-warn-spills", r"-warn-lmem-usage", r"-dlcm=(ca|cg|cs)",
    r"--?maxrregcount=\d{1,3}", r"--allow-expensive-optimizations=(true|false)",
)
# Arguments of -Xcudafe (diagnostic control only).
CUDAFE_FLAGS: tuple[str, ...] = (
    r"--?diag_(suppress|warning|error|remark)=[A-Za-z0-9_,-]+", r"--?display_error_number",
    r"--?no_display_error_number",
)
# Libraries extra_ldflags may name.
LINK_LIBRARIES: tuple[str, ...] = (
    "cublas", "cublasLt", "cudart", "cuda", "curand", "cufft", "cusparse", "cusolver", "cudnn", "nvrtc", "gomp", "m",
    "c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "torch_python",
)
MACRO_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
MACRO_VALUE = r"[A-Za-z0-9_.+\-*/%~^:()]{0,256}"
ARCH_VALUE = r"(sm|compute|lto)_(\d{2,3})([af]?)"

COMPILE_SUMMARY = ("-O0..-O3/-Os/-Ofast, -std=c++14/17/20, -D/-U NAME[=VALUE], -w, -W<warning>, -g, -G, -lineinfo, "
                   "--use_fast_math, -ffast-math, -funroll-loops, -fno-strict-aliasing, -fopenmp, "
                   "-march/-mtune=native, --expt-relaxed-constexpr, --extended-lambda, --maxrregcount=N, -res-usage, "
                   "-arch/-gencode up to {target}, -Xptxas <ptxas flag>, -Xcompiler <host flag>")
LINK_SUMMARY = "-l<lib> for " + ", ".join(LINK_LIBRARIES)

# Why well-known dangerous options are refused (prefix -> reason); the rest is "not on the allow-list".
_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-wrapper", "--wrapper"), "it runs a program of your choosing around every compiler step"),
    (("-B", "-ccbin", "--ccbin", "--compiler-bindir", "-specs", "--specs", "--sysroot", "-isysroot"),
     "it replaces the compiler's own programs or rules"),
    (("-fplugin", "-load", "--load"), "it loads code into the compiler"),
    (("-Wl,", "-Wa,", "-Wp,", "-Xlinker", "--linker-options", "-Xnvlink", "--nvlink-options", "-Xassembler",
      "-Xpreprocessor", "-Xcudafe", "-Xarchive", "--archive-options", "-Xfatbin", "--fatbin-options",
      "-forward-unknown", "--forward-unknown"), "it passes raw options to another tool"),
    (("-o", "--output", "-odir", "--output-directory", "-save-temps", "--save-temps", "-keep", "--keep", "-M",
      "--dependency", "-dump", "--dump", "-fdump", "-aux-info", "--aux-info", "-pch", "--pch", "-create-pch",
      "-use-pch"), "the build decides which files are written"),
    (("-include", "-imacros", "--pre-include", "-I", "--include-path", "-isystem", "--system-include", "-iquote",
      "-idirafter", "-iprefix", "-iwithprefix", "-L", "--library-path", "-l", "--library", "--optix-ir"),
     "the build decides which files and directories are read (put your code in the sources, libraries in "
     "extra_ldflags)"),
    (("@", "-optf", "--options-file"), "it reads options from a file"),
    (("-x", "--x", "-dryrun", "--dryrun", "-E", "-S", "-c", "-###", "-run", "--run", "-lib", "--lib", "-link",
      "--link", "-shared", "--shared", "-rdc", "--relocatable-device-code", "-dc", "--device-c", "-dlink",
      "--device-link", "-cuda", "--cuda", "-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin",
      "--threads", "-t", "-split-compile", "--split-compile"), "it changes what the build does"),
)


class FlagRejected(ValueError):
    """A flag outside the allow-list. str(e) is the verdict's log: which flag, why, what is allowed."""

    def __init__(self, kind: str, flag: str, where: str, why: str, allowed: str):
        shown = flag if len(flag) <= 80 else flag[:77] + "..."
        super().__init__(f"{kind} {shown!r} in {where} is not allowed here: {why}; allowed: {allowed}")
        self.flag, self.where, self.why = flag, where, why


def _full(patterns: Sequence[str], token: str) -> bool:
    return any(re.fullmatch(p, token) for p in patterns)


def _reason(token: str) -> str:
    for prefixes, why in _REASONS:
        if any(token.startswith(p) for p in prefixes):
            return why
    return "not on the allow-list"


def _arch_major(value: str) -> int | None:
    m = re.fullmatch(ARCH_VALUE, value)
    if not m:
        return None
    return int(m.group(2)) // 10


def _arch_ok(value: str, target_major: int) -> bool:
    major = _arch_major(value)
    return major is not None and 3 <= major <= target_major


def _arch_list_ok(value: str, target_major: int) -> bool:
    """sm_90 | [sm_90,compute_90] | sm_90,compute_90 (quotes around the list tolerated)."""
    value = value.strip("'\"")
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    parts = value.split(",")
    return bool(parts) and all(_arch_ok(p, target_major) for p in parts)


def _gencode_ok(value: str, target_major: int) -> bool:
    """arch=compute_90,code=sm_90 | arch=compute_90,code=[sm_90,compute_90]"""
    m = re.fullmatch(r"arch=([A-Za-z0-9_]+),code=(.+)", value.strip("'\""))
    return bool(m) and _arch_ok(m.group(1), target_major) and _arch_list_ok(m.group(2), target_major)


def _macro_ok(value: str, *, define: bool) -> bool:
    pattern = MACRO_NAME + (f"(={MACRO_VALUE})?" if define else "")
    return re.fullmatch(pattern, value) is not None


def _host_token_ok(token: str) -> bool:
    if _full(HOST_FLAGS, token):
        return True
    if token.startswith("-D") and len(token) > 2:
        return _macro_ok(token[2:], define=True)
    if token.startswith("-U") and len(token) > 2:
        return _macro_ok(token[2:], define=False)
    return False


def _parts_ok(value: str, ok) -> bool:
    """nvcc splits -Xptxas/-Xcompiler arguments at commas (and the shell at spaces): every part must be allowed."""
    parts = [p for p in re.split(r"[,\s]+", value) if p]
    return bool(parts) and all(ok(p) for p in parts)


# Options that take an argument, as (spellings, check of the argument, what the argument may be).
def _option_table(target_major: int):
    return (
        (("-D", "--define-macro"), lambda v: _macro_ok(v, define=True), "a macro NAME[=VALUE]"),
        (("-U", "--undefine-macro"), lambda v: _macro_ok(v, define=False), "a macro NAME"),
        (("-arch", "--gpu-architecture"), lambda v: _arch_ok(v, target_major), "sm_XX/compute_XX"),
        (("-code", "--gpu-code"), lambda v: _arch_list_ok(v, target_major), "sm_XX/compute_XX"),
        (("-gencode", "--generate-code"), lambda v: _gencode_ok(v, target_major),
         "arch=compute_XX,code=sm_XX"),
        (("-maxrregcount", "--maxrregcount"), lambda v: re.fullmatch(r"\d{1,3}", v) is not None, "a number"),
        (("-Xptxas", "--ptxas-options"), lambda v: _parts_ok(v, lambda p: _full(PTXAS_FLAGS, p)),
         "ptxas flags (-O3, -v, ...)"),
        (("-Xcompiler", "--compiler-options"), lambda v: _parts_ok(v, _host_token_ok),
         "host compiler flags (-O3, -fopenmp, -march=native, ...)"),
        (("-Xcudafe",), lambda v: _parts_ok(v, lambda p: _full(CUDAFE_FLAGS, p)), "--diag_suppress=N and the like"),
        (("-diag-suppress", "--diag-suppress", "-diag-warn", "--diag-warn", "-diag-error", "--diag-error"),
         lambda v: re.fullmatch(r"[0-9]+(,[0-9]+)*", v) is not None, "diagnostic numbers"),
        (("-default-stream", "--default-stream"), lambda v: v in ("legacy", "null", "per-thread"),
         "legacy, null or per-thread"),
    )


def check_compile_flags(tokens: Sequence[str], *, target_arch: str, where: str = "extra_cuda_cflags") -> None:
    """Raise FlagRejected for the first token (already shell-split) outside the allow-list."""
    target_major = _arch_major(target_arch) or 9
    summary = COMPILE_SUMMARY.format(target=re.sub(r"[af]$", "", target_arch))
    table = _option_table(target_major)
    arch_why = f"the target GPU is {target_arch}: sm_XX/compute_XX up to that major version (not native/all)"
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if _host_token_ok(tok) or _full(NVCC_FLAGS, tok):
            continue
        handled = False
        for spellings, ok, what in table:
            for sp in spellings:
                if tok == sp:  # argument in the next token
                    if i >= len(tokens):
                        raise FlagRejected("compiler flag", tok, where, f"it needs {what} after it", summary)
                    value = tokens[i]
                    i += 1
                elif tok.startswith(sp + "="):
                    value = tok[len(sp) + 1:]
                else:
                    continue
                if not ok(value):
                    arch_like = spellings[0] in ("-arch", "-code", "-gencode")
                    why = arch_why if arch_like else f"its argument must be {what} from the allow-list"
                    raise FlagRejected("compiler flag", f"{sp} {value}" if tok == sp else tok, where, why, summary)
                handled = True
                break
            if handled:
                break
        if handled:
            continue
        if tok.startswith("-D") or tok.startswith("-U"):
            raise FlagRejected("compiler flag", tok, where,
                               "macro names must be identifiers and values may use only letters, digits and "
                               "_.+-*/%~^:() (no spaces, quotes or newlines)", summary)
        raise FlagRejected("compiler flag", tok, where, _reason(tok), summary)


def check_link_flags(tokens: Sequence[str], *, where: str = "extra_ldflags") -> None:
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok == "-l" and i < len(tokens):
            lib = tokens[i]
            i += 1
        elif tok.startswith("-l"):
            lib = tok[2:]
        else:
            why = _reason(tok) if tok.startswith("-") else "only -l<lib> is accepted"
            raise FlagRejected("linker flag", tok, where, why, LINK_SUMMARY)
        if lib not in LINK_LIBRARIES:
            raise FlagRejected("linker flag", f"-l{lib}", where, "not one of the libraries this build links",
                               LINK_SUMMARY)


def check_include_paths(paths: Sequence[str]) -> None:
    for p in paths:
        if p.strip():
            raise FlagRejected("include path", p, "extra_include_paths",
                               "the build has no directory of yours to include from", "none (put headers in the "
                               "sources: cpp_sources/cuda_sources)")


def shell_words(flags: Sequence[str]) -> list[str]:
    """torch joins user flags into the ninja file, whose commands run through /bin/sh: an empty flag vanishes and
    "-O3 --use_fast_math" is two flags. Mirror that (ValueError for unbalanced quotes, as the shell would fail)."""
    try:
        return shlex.split(" ".join(f.strip() for f in flags))
    except ValueError as e:
        raise ValueError(f"cannot parse compiler flags {list(flags)!r}: {e}") from None


def check(extra_cflags: Sequence[str] = (), extra_cuda_cflags: Sequence[str] = (), extra_ldflags: Sequence[str] = (),
          extra_include_paths: Sequence[str] = (), *, target_arch: str) -> None:
    """Raise FlagRejected if any of the candidate's flags (as passed to load_inline) is outside the allow-list."""
    for where, flags in (("extra_cflags", extra_cflags), ("extra_cuda_cflags", extra_cuda_cflags),
                         ("extra_ldflags", extra_ldflags)):
        try:
            tokens = shell_words(flags)
        except ValueError as e:
            raise FlagRejected("compiler flags" if where != "extra_ldflags" else "linker flags",
                               " ".join(flags), where, f"they cannot be split like a shell would ({e})",
                               "balanced quotes") from None
        if where == "extra_ldflags":
            check_link_flags(tokens, where=where)
        else:
            check_compile_flags(tokens, target_arch=target_arch, where=where)
    check_include_paths(extra_include_paths)


def rejection(spec, target_arch: str) -> str | None:
    """None if the spec's flags are all allowed, else the verdict's log (see FlagRejected)."""
    try:
        check(spec.extra_cflags, spec.extra_cuda_cflags, spec.extra_ldflags, spec.extra_include_paths,
              target_arch=target_arch)
    except FlagRejected as e:
        return str(e)
    return None
