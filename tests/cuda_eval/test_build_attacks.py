"""Attacks on the compile stage by a candidate that has read our source. Each test fails if its defence is removed:
(a) compiler flags are allow-listed (the -wrapper attack), (b) nothing of ours writes into or follows a link in a
sandbox uid's directory, and products are copied out of it through checked descriptors, (c) hard links are refused,
(d) record.json is read as untrusted data, (e) the allow-list itself, (f) cache privacy (modes, records store)."""
import ast
import dataclasses
import glob
import inspect
import json
import os
import pathlib
import shutil
import stat
import tempfile

import pytest

from cuda_eval.compile import sources
from cuda_eval.compile.build_dirs import BuildDirs
from cuda_eval.compile.builder import BuildConfig, Builder
from cuda_eval.compile.cache import BuildCache, UnsafeFile, copy_untrusted, read_untrusted
from cuda_eval.compile.pch import PchStore
from cuda_eval.compile.pool import ERROR_KINDS, MAX_RECORD_BYTES, RecordCorrupted, read_record
from cuda_eval.protocol import extension_spec as cand
from cuda_eval.protocol.extension_spec import ExtensionSpec, spec_from_load_inline
from cuda_eval.sandbox import identity as sandbox_identity, runner as sb
from cuda_eval.static import flag_policy, static_record
from cuda_eval.static.extraction import extract_code
from cuda_eval.static.static_record import speculate_specs
from sandbox_fixtures import compile_pool, run_lock, sandbox_tmp, shared_dir, toolchain  # noqa: F401 - fixtures

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
ROOT = os.geteuid() == 0
DEDICATED = ROOT and sandbox_identity.identity_mode() == "dedicated"
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (file ownership of sandbox uids)")
needs_dedicated = pytest.mark.skipif(not DEDICATED, reason="needs root with dedicated sandbox uids")
SECRET = b"CANARY-SECRET: root's own file\n"


# --- fixtures -----------------------------------------------------------------------------------------------------
@pytest.fixture
def canary_dir():
    """A 0700 directory of ours (root's): a sandbox uid can neither reach nor create anything in it."""
    path = tempfile.mkdtemp(prefix="cuda_eval_canary_")
    os.chmod(path, 0o700)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def canary(canary_dir):
    """A 0600 file of ours that attacks try to overwrite, chmod or publish."""
    path = canary_dir / "secret.txt"
    path.write_bytes(SECRET)
    os.chmod(path, 0o600)
    return path


def assert_canary_intact(path: pathlib.Path) -> None:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert st.st_nlink == 1 and path.read_bytes() == SECRET


def assert_not_in_cache(root: str, content: bytes = SECRET) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                with open(p, "rb") as f:
                    assert content not in f.read(), f"{p} holds the canary's content"


@pytest.fixture
def sandbox_dir(sandbox_tmp):
    """(dir, uid): a directory handed to a leased sandbox uid, as the build's out/ is (the lease is held)."""
    path = str(sandbox_tmp / "out")
    with sb.SandboxSession(path) as session:
        yield path, (session.uid if session.uid is not None else os.geteuid())


# --- (e) the allow-list --------------------------------------------------------------------------------------------
ACCEPTED_COMPILE = [
    ["-O3"], ["-O0"], ["-Os"], ["-Ofast"], ["-O3 --use_fast_math"], ["-use_fast_math"], ["-std=c++17"],
    ["-std=gnu++20"], ["-DNDEBUG"], ["-DBLOCK=256"], ["-D", "TILE=(16)"], ["-UNDEBUG"], ["-U", "X"], ["-ffast-math"],
    ["-funroll-loops"], ["-fno-strict-aliasing"], ["-fopenmp"], ["-march=native"], ["-mtune=native"], ["-w"],
    ["-Wall", "-Wextra", "-Wno-unused-variable", "-Werror=return-type"], ["-lineinfo"], ["-g"], ["-G"],
    ["--expt-relaxed-constexpr"], ["--expt-extended-lambda"], ["--extended-lambda"], ["-Xptxas -O3"],
    ["-Xptxas", "-v"], ["-Xptxas=-v"], ["--ptxas-options=-v"], ["-Xptxas -O3,-v"], ["-Xcompiler", "-O3"],
    ["-Xcompiler -fopenmp"], ["-Xcompiler=-march=native"], ["--compiler-options", "-fPIC"], ["--maxrregcount=64"],
    ["-maxrregcount=32"], ["-maxrregcount", "128"], ["-arch=sm_90"], ["-arch=sm_90a"], ["-arch=sm_80"],
    ["-arch", "compute_90"], ["--gpu-architecture=sm_86"], ["-gencode arch=compute_90,code=sm_90"],
    ["-gencode=arch=compute_80,code=[sm_80,compute_80]"], ["-res-usage"], ["--resource-usage"], [""], [],
    ["--default-stream per-thread"], ["-Xcudafe --diag_suppress=177"], ["--diag-suppress=20012,177"],
]
REFUSED_COMPILE = [
    (["-wrapper '/bin/sh,-c,(sleep 1; ln -sf /root/x.py cuda.cu) & exec \"$0\" \"$@\"'"], "-wrapper",
     "runs a program"),
    (["-B/tmp/evil"], "-B/tmp/evil", "compiler's own programs"), (["-specs=/tmp/x.specs"], "-specs", "rules"),
    (["-fplugin=/tmp/p.so"], "-fplugin", "loads code"), (["-Wl,-rpath,/tmp"], "-Wl,", "raw options"),
    (["-Xlinker", "-rpath"], "-Xlinker", "raw options"), (["-o", "/root/x"], "'-o'", "which files are written"),
    (["-include", "/etc/shadow"], "-include", "read"), (["-imacros", "/etc/shadow"], "-imacros", "read"),
    (["-I/etc"], "-I/etc", "read"), (["-L/tmp"], "-L/tmp", "read"), (["@/tmp/opts"], "@/tmp/opts", "from a file"),
    (["--compiler-bindir=/tmp"], "--compiler-bindir", "compiler's own programs"),
    (["-ccbin", "/tmp/cc"], "-ccbin", "compiler's own programs"), (["--dryrun"], "--dryrun", "what the build does"),
    (["-save-temps"], "-save-temps", "written"), (["-x", "c"], "'-x'", "what the build does"),
    (["-dumpbase", "x"], "-dumpbase", "written"), (["-Xcompiler", "-wrapper"], "-Xcompiler -wrapper", "host"),
    (["-Xcompiler=-B/tmp"], "-Xcompiler=-B/tmp", "host"), (["-Xptxas", "-o,/tmp/x"], "-Xptxas", "ptxas"),
    (["-arch=sm_100"], "sm_100", "sm_90"), (["-arch=native"], "native", "sm_90"),
    (["-gencode arch=compute_120,code=sm_120"], "compute_120", "sm_90"), (["-DX=$(id)"], "-DX=$(id)", "macro"),
    (["-D'X=a\nb'"], "-DX=a", "macro"), (["-D", "X=`id`"], "-D X=`id`", "macro"),
    (["-D'X=\"s\"'"], "-DX=", "macro"), (["-lcublas"], "-lcublas", "extra_ldflags"),
    (["-DX='unbalanced"], "unbalanced", "split"), (["-Xcudafe", "--gen_c_file_name=/tmp/x"], "-Xcudafe", "diag"),
    (["-rdc=true"], "-rdc=true", "what the build does"), (["--default-stream", "/tmp"], "--default-stream", "null"),
]


@pytest.mark.parametrize("flags", ACCEPTED_COMPILE, ids=lambda f: " ".join(f)[:40] or "empty")
def test_allowed_compile_flags(flags):
    flag_policy.check(extra_cflags=flags, extra_cuda_cflags=flags, target_arch="sm_90")


@pytest.mark.parametrize("flags, named, why", REFUSED_COMPILE, ids=lambda v: str(v)[:30])
def test_refused_compile_flags(flags, named, why):
    for where in ("extra_cflags", "extra_cuda_cflags"):
        with pytest.raises(flag_policy.FlagRejected) as e:
            flag_policy.check(**{where: flags}, target_arch="sm_90")
        msg = str(e.value)
        assert msg.startswith(("compiler flag ", "compiler flags ")) and "is not allowed here: " in msg, msg
        assert named in msg and why in msg and where in msg and "; allowed: " in msg, msg
        assert isinstance(e.value, ValueError)


def test_link_flags_and_include_paths():
    flag_policy.check(extra_ldflags=["-lcublas", "-lcublasLt -lcudnn", "-l", "curand", ""], target_arch="sm_90")
    for flags, named in ((["-L/tmp", "-lfoo"], "-L/tmp"), (["-lfoo"], "-lfoo"), (["/tmp/evil.so"], "/tmp/evil.so"),
                         (["-Wl,-rpath,/tmp"], "-Wl,"), (["-shared"], "-shared"), (["-O3"], "-O3")):
        with pytest.raises(flag_policy.FlagRejected, match="linker flag") as e:
            flag_policy.check(extra_ldflags=flags, target_arch="sm_90")
        assert named in str(e.value) and "-l<lib> for cublas" in str(e.value)
    flag_policy.check(extra_include_paths=["", "  "], target_arch="sm_90")
    for path in ("/usr/include", "../../etc", "inc", "."):
        with pytest.raises(flag_policy.FlagRejected, match="include path"):
            flag_policy.check(extra_include_paths=[path], target_arch="sm_90")


def test_arch_limit_follows_the_target():
    flag_policy.check(extra_cuda_cflags=["-arch=sm_100"], target_arch="sm_100")
    with pytest.raises(flag_policy.FlagRejected, match="sm_80"):
        flag_policy.check(extra_cuda_cflags=["-arch=sm_90"], target_arch="sm_80")


def test_toolchain_flags_enforce_the_allow_list(toolchain):
    with pytest.raises(flag_policy.FlagRejected, match="-wrapper"):
        toolchain.flags("e", with_cuda=True, extra_cflags=["-wrapper /bin/sh,-c,id"])
    with pytest.raises(flag_policy.FlagRejected, match="include path"):
        toolchain.flags("e", with_cuda=False, extra_include_paths=["/etc"])
    assert not any(f.startswith("-I") and f.endswith(os.getcwd())
                   for f in toolchain.flags("e", with_cuda=False, extra_include_paths=[" "])["cflags"])


def test_flag_rejected_is_a_compile_stage_verdict():
    assert "flag_rejected" in ERROR_KINDS


# --- every program of the repo passes the allow-list -----------------------------------------------------------------
FLAG_ARGS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths")


class _Unknown:
    pass


def flag_sets(code: str) -> list[dict]:
    """The flag arguments of every load_inline/load call of a program, read statically: speculate_specs' specs,
    and every call (e.g. in __init__) with module-level constants resolved."""
    out = [{k: getattr(s, k) for k in FLAG_ARGS} for s in speculate_specs(code)]
    tree = ast.parse(code)
    env: dict = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                env[stmt.targets[0].id] = static_record._static_value(stmt.value, env)
            except static_record._NotStatic:
                env.pop(stmt.targets[0].id, None)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        if name not in ("load_inline", "load"):
            continue
        sig = inspect.signature(cand._load_inline_signature if name == "load_inline" else cand._load_signature)

        def value(n):
            try:
                return static_record._static_value(n, env)
            except static_record._NotStatic:
                return _Unknown()
        bound = sig.bind_partial(*[value(a) for a in node.args],
                                 **{k.arg: value(k.value) for k in node.keywords if k.arg}).arguments
        flags = {k: bound.get(k) or [] for k in FLAG_ARGS}
        assert not any(isinstance(v, _Unknown) for v in flags.values()), "flags not statically known"
        out.append({k: [v] if isinstance(v, str) else list(v) for k, v in flags.items()})
    return out


def repo_programs() -> list[tuple[str, str]]:
    programs = []
    patterns = [str(CORPUS / d / "*.py") for d in ("honest", "cpu", "bad", "adversarial")]
    patterns += [str(REPO / "kevin_jax/tasks/builtin_solutions/**/*.py"), str(REPO / "benchmarks/candidates/*.py")]
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True)):
            programs.append((os.path.relpath(path, REPO), pathlib.Path(path).read_text()))
    warm = REPO / "kevin_jax/data/warm_start_corpus.jsonl"
    for i, line in enumerate(warm.read_text().splitlines() if warm.exists() else []):
        row = json.loads(line)
        ex = extract_code(row.get("response", ""))
        if ex.ok:
            programs.append((f"warm_start[{i}]", ex.code))
        for j, attempt in enumerate(row.get("attempts") or []):
            if attempt.get("code"):
                programs.append((f"warm_start[{i}].attempts[{j}]", attempt["code"]))
    return programs


def test_every_program_of_the_repo_passes_the_allow_list():
    programs = repo_programs()
    assert len(programs) > 100
    calls = 0
    for where, code in programs:
        if "load_inline" not in code and "cpp_extension.load" not in code:
            continue
        sets = flag_sets(code)
        assert sets, f"{where}: no load_inline call read statically"
        for flags in sets:
            calls += 1
            try:
                flag_policy.check(**flags, target_arch="sm_90")
            except flag_policy.FlagRejected as e:
                pytest.fail(f"{where}: {e}")
    assert calls > 100


# --- (a) the -wrapper attack -----------------------------------------------------------------------------------------
def wrapper_flag(canary_path: str, marker: str) -> str:
    """The audit's flag: a shell runs inside the build, swaps cuda.cu for a link to a file of root's choosing
    (here canary_path) and leaves a marker that it ran."""
    return (f"-wrapper '/bin/sh,-c,(sleep 1; ln -sf {canary_path} cuda.cu; touch {marker}) & "
            f"exec \"$0\" \"$@\"'")


def test_wrapper_flag_is_refused_before_any_build(toolchain, sandbox_tmp, canary_dir):
    target = canary_dir / "x.py"
    marker = sandbox_tmp / "wrapper_ran"
    spec = spec_from_load_inline(name="wrap", cpp_sources="int f() { return 1; }", no_implicit_headers=True,
                                 extra_cflags=[wrapper_flag(str(target), str(marker))])
    build_dir = sandbox_tmp / "b"
    result = Builder(toolchain, None, config=BuildConfig(use_pch=False)).build(spec, str(build_dir), 60)
    assert not result.ok and result.error_kind == "flag_rejected"
    assert result.log.startswith("compiler flag '-wrapper' in extra_cflags is not allowed here: ")
    assert not build_dir.exists() and not marker.exists() and not target.exists()


WRAPPER_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="wrapped_relu", cpp_sources="""
#include <torch/extension.h>
torch::Tensor relu_out(torch::Tensor x) { return x.clamp_min(0); }
""", functions=["relu_out"], extra_cflags=[FLAG])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_out(x)
'''


@pytest.mark.nvcc
def test_wrapper_candidate_gets_flag_rejected(compile_pool, sandbox_tmp, canary_dir):
    target = canary_dir / "x.py"
    marker_dir = sandbox_tmp / "shared"
    marker_dir.mkdir(mode=0o777)
    os.chmod(marker_dir, 0o777)
    marker = marker_dir / "wrapper_ran"
    code = WRAPPER_CANDIDATE.replace("FLAG", repr(wrapper_flag(str(target), str(marker))))
    assert speculate_specs(code), "the flag must also reach the speculative path"
    task = (CORPUS / "tasks" / "cpu_relu.py").read_text()
    out = compile_pool.compile(task, code)
    assert not out.ok and out.error_kind == "flag_rejected", (out.error_kind, out.log)
    assert "'-wrapper'" in out.log and "is not allowed here" in out.log
    assert out.modules == [] and out.timings["speculated"] == 0  # no build, speculative or not, was started
    assert not target.exists() and not marker.exists()
    assert out.timings.get("record_static")  # refused from its source alone: no process of the program ran
    # no recording (a candidate's source) ever goes to the sandbox-readable cache
    for shard in os.scandir(os.path.join(compile_pool.cache.root, "entries")):
        for entry in os.scandir(shard.path):
            meta = json.loads(pathlib.Path(entry.path, "meta.json").read_text())
            assert meta.get("kind") != "record"


# --- (b) links planted in the sandbox's directory --------------------------------------------------------------------
FAKE_COMPILER = r'''#!/bin/sh
# A test-only fake compiler, run as the sandbox uid. Hostile (@HONEST@ = 0), it does what a step inside the build
# could do: plant links to a file of root's, in its cwd, at every name the evaluator once wrote or read there,
# and leave a link as its output. Honest, it writes a small output file.
cu=""; out=""; prev=""
for a in "$@"; do
    [ "$prev" = "-c" ] && cu="$a"
    [ "$prev" = "-o" ] && out="$a"
    prev="$a"
done
light=0
case "$cu" in *.cu) grep -q kj_light_torch.h "$cu" && light=1;; esac
if [ "@HONEST@" = 0 ]; then
    for f in cuda.cu main.cpp kj_light_torch.h main.o cuda.cuda.o kj_glue_prelude.h kj_binding.cpp binding.o; do
        ln -sf @CANARY@ "$f" 2>/dev/null
    done
fi
if [ $light = 1 ]; then echo "$cu(1): error: fake light failure" >&2; exit 1; fi
rm -f "$out"
if [ "@HONEST@" = 1 ]; then printf 'fake product of %s\n' "$cu" > "$out"; else ln -sf @CANARY@ "$out" 2>/dev/null; fi
exit 0
'''


def fake_toolchain(toolchain, directory: pathlib.Path, canary: pathlib.Path, *, honest: bool):
    directory.mkdir(mode=0o755, exist_ok=True)
    os.chmod(directory, 0o755)
    path = directory / ("fake_cc_honest" if honest else "fake_cc_hostile")
    path.write_text(FAKE_COMPILER.replace("@CANARY@", str(canary)).replace("@HONEST@", str(int(honest))))
    os.chmod(path, 0o755)
    return dataclasses.replace(toolchain, nvcc=str(path), cxx=str(path), headers_use_extension_name=False)


SWAP_SPEC = spec_from_load_inline(name="swap", cpp_sources="torch::Tensor f(torch::Tensor x);",
                                  cuda_sources="__global__ void k(float* p) { p[0] = 1.f; }\n"
                                               "torch::Tensor f(torch::Tensor x) { return x; }\n", functions=["f"])


@needs_dedicated
def test_links_planted_by_the_build_are_never_followed(toolchain, sandbox_tmp, canary):
    """The light build fails, the evaluator rewrites cuda.cu for the exact build (the audit's path), objects go
    to the object cache and the .so is read out: with links at every one of those names in the compilers' cwd."""
    fake = fake_toolchain(toolchain, sandbox_tmp / "bin", canary, honest=False)
    cache = BuildCache(str(sandbox_tmp / "cache"), 1 << 30)
    builder = Builder(fake, cache, config=BuildConfig(parallel_phases=False, use_pch=False))
    result = builder.build(SWAP_SPEC, str(sandbox_tmp / "b"), 120)
    assert result.header_mode == "light_failed_exact"  # the exact cuda.cu was written after the swap
    assert not result.ok and result.error_kind == "sandbox_killed" and "could not be read safely" in result.log
    assert_canary_intact(canary)
    assert_not_in_cache(cache.root)
    assert not os.listdir(os.path.join(cache.root, "entries"))  # the planted objects were not cached either
    src = sandbox_tmp / "b" / "src"
    # the shared binding object is built in a build of its own (its planted output was refused there too)
    assert sorted(os.listdir(src)) == ["cuda.cu", "kj_glue_prelude.h", "kj_lean", "kj_light_torch.h", "main.cpp"]
    assert result.binding_failure == "the shared binding unit did not compile"
    assert all(os.lstat(src / n).st_uid == os.geteuid() for n in os.listdir(src))


@needs_dedicated
def test_honest_products_are_copied_out_never_moved(toolchain, sandbox_tmp, canary):
    fake = fake_toolchain(toolchain, sandbox_tmp / "bin", canary, honest=True)
    cache = BuildCache(str(sandbox_tmp / "cache"), 1 << 30)
    builder = Builder(fake, cache, config=BuildConfig(parallel_phases=False, use_pch=False))
    result = builder.build(SWAP_SPEC, str(sandbox_tmp / "b"), 120)
    assert result.ok, result.log
    out = sandbox_tmp / "b" / "out"
    so = os.lstat(result.so_path)
    assert os.path.dirname(result.so_path) == str(sandbox_tmp / "b" / "product")
    assert so.st_uid == os.geteuid() and os.lstat(out).st_uid != os.geteuid()
    assert (so.st_dev, so.st_ino) != (os.lstat(out / "swap.so").st_dev, os.lstat(out / "swap.so").st_ino)
    entries = [e.path for s in os.scandir(os.path.join(cache.root, "entries")) for e in os.scandir(s.path)]
    assert len(entries) == 2  # binding.o (main.cpp is the glue unit, never cached) and cuda.cuda.o
    for entry in entries:
        for f in os.scandir(entry):
            assert f.stat(follow_symlinks=False).st_uid == os.geteuid()
    assert_canary_intact(canary)


@needs_dedicated
def test_pch_build_reads_its_product_safely(toolchain, sandbox_tmp, canary):
    for honest in (False, True):
        fake = fake_toolchain(toolchain, sandbox_tmp / "bin", canary, honest=honest)
        cache = BuildCache(str(sandbox_tmp / f"pch{int(honest)}"), 1 << 30)
        store = PchStore(cache, fake, str(sandbox_tmp / "work"), BuildConfig().limits)
        path = store.ensure(["-O2"], wait=True)
        if honest:
            assert path and open(os.path.join(path, sources.PCH_HEADER + ".gch")).read().startswith("fake product")
            assert all(f.stat(follow_symlinks=False).st_uid == os.geteuid() for f in os.scandir(path))
        else:
            assert path is None and "refusing" in next(iter(store.failures.values()))
            assert not os.listdir(os.path.join(cache.root, "entries"))
        assert_not_in_cache(cache.root)
    assert_canary_intact(canary)


@needs_root
def test_safe_read_refuses_links_to_root_files(sandbox_dir, canary, sandbox_tmp):
    """The same swap, set up directly: out/ belongs to a sandbox uid and holds links to a root 0600 file."""
    out, uid = sandbox_dir
    for name in ("cuda.cu", "main.o", "ext.so"):
        os.symlink(canary, os.path.join(out, name))
        os.lchown(os.path.join(out, name), uid, uid)
    product = sandbox_tmp / "product"
    product.mkdir()
    for name in ("cuda.cu", "main.o", "ext.so"):
        with pytest.raises(UnsafeFile, match="symbolic link"):
            copy_untrusted(out, name, str(product / name), owner=uid, max_bytes=1 << 20)
        with pytest.raises(UnsafeFile):
            read_untrusted(out, name, owner=uid, max_bytes=1 << 20)
    dirs = BuildDirs(str(sandbox_tmp), str(sandbox_tmp / "src"), out, str(product), owner=uid)
    with pytest.raises(UnsafeFile):
        dirs.take("ext.so", None)
    assert os.listdir(product) == []
    cache = BuildCache(str(sandbox_tmp / "cache"), 1 << 30)
    with pytest.raises(ValueError, match="regular file"):
        cache.publish("ab" * 32, {"ext.so": os.path.join(out, "ext.so")}, move=True)
    assert_canary_intact(canary)
    assert_not_in_cache(cache.root)
    # a FIFO neither blocks nor passes
    os.mkfifo(os.path.join(out, "fifo.so"))
    os.lchown(os.path.join(out, "fifo.so"), uid, uid)
    with pytest.raises(UnsafeFile, match="regular file"):
        read_untrusted(out, "fifo.so", owner=uid, max_bytes=1 << 20)


# --- (c) hard links --------------------------------------------------------------------------------------------------
@needs_root
def test_safe_read_refuses_hard_links_and_foreign_files(sandbox_dir, canary, sandbox_tmp):
    out, uid = sandbox_dir
    os.link(canary, os.path.join(out, "ext.so"))  # what a sandbox uid can do where protected_hardlinks is 0
    with pytest.raises(UnsafeFile, match="single link"):
        read_untrusted(out, "ext.so", owner=uid, max_bytes=1 << 20)
    own = os.path.join(out, "own.so")
    pathlib.Path(own).write_bytes(b"mine")
    os.chown(own, uid, uid)
    os.link(own, os.path.join(out, "own_too.so"))
    with pytest.raises(UnsafeFile, match="single link"):
        read_untrusted(out, "own.so", owner=uid, max_bytes=1 << 20)
    os.unlink(os.path.join(out, "own_too.so"))
    assert read_untrusted(out, "own.so", owner=uid, max_bytes=1 << 20) == b"mine"
    with pytest.raises(UnsafeFile, match="owned by uid"):  # a root file renamed in is not the sandbox's product
        read_untrusted(out, "own.so", owner=uid + 1, max_bytes=1 << 20)
    with pytest.raises(UnsafeFile, match="bytes"):
        read_untrusted(out, "own.so", owner=uid, max_bytes=2)
    cache = BuildCache(str(sandbox_tmp / "cache"), 1 << 30)
    with pytest.raises(ValueError, match="single link"):
        cache.publish("cd" * 32, {"ext.so": os.path.join(out, "ext.so")}, move=True)
    os.unlink(os.path.join(out, "ext.so"))
    assert_canary_intact(canary)


@needs_root
def test_publish_never_moves_a_file_it_does_not_own(sandbox_dir, sandbox_tmp):
    out, uid = sandbox_dir
    src = os.path.join(out, "m.so")
    pathlib.Path(src).write_bytes(b"product")
    os.chown(src, uid, uid)
    cache = BuildCache(str(sandbox_tmp / "cache"), 1 << 30)
    entry = cache.publish("ef" * 32, {"m.so": src}, move=True)
    published = os.lstat(entry.file("m.so"))
    assert os.path.exists(src) and published.st_ino != os.lstat(src).st_ino  # copied, not renamed
    assert published.st_uid == os.geteuid()
    # ours, but in a directory someone else can write to: copied as well
    shared = sandbox_tmp / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    mine = shared / "n.so"
    mine.write_bytes(b"product")
    cache.publish("fa" * 32, {"n.so": str(mine)}, move=True)
    assert mine.exists()


# --- (d) record.json -------------------------------------------------------------------------------------------------
@needs_root
def test_read_record_treats_the_file_as_untrusted(sandbox_dir, canary):
    out, uid = sandbox_dir
    path = os.path.join(out, "record.json")
    assert read_record(out, uid) == (None, [])

    def plant(content: bytes | None = None, link: str | None = None, owner: int = uid) -> None:
        if os.path.lexists(path):
            os.unlink(path)
        if link:
            os.symlink(link, path)
        else:
            pathlib.Path(path).write_bytes(content)
        os.lchown(path, owner, owner)

    good = {"done": True, "specs": [spec_from_load_inline(name="e", cpp_sources="int f();").to_dict()]}
    plant(json.dumps(good).encode())
    record, specs = read_record(out, uid)
    assert record["done"] and [s.name for s in specs] == ["e"]
    cases = [(dict(link=str(canary)), "symbolic link"), (dict(content=b"{}", owner=0), "owned by uid"),
             (dict(content=b"[1, 2]"), "not a JSON object"), (dict(content=b"{\"specs\": 3}"), "specs"),
             (dict(content=b"\xff\xfe"), "Error"), (dict(content=b" " * (MAX_RECORD_BYTES + 1)), "limit"),
             (dict(content=json.dumps({"specs": [{"name": "e", "cpp_sources": [1]}]}).encode()), "TypeError"),
             (dict(content=json.dumps({"specs": [{"name": "e", "kind": "files", "n_sources": 1,
                                                  "source_files": [["../../etc/cron.d/x", "boom"]]}]}).encode()),
              "plain file name"),
             (dict(content=json.dumps({"specs": [{"name": "e", "bogus": 1}]}).encode()), "unknown")]
    for kwargs, message in cases:
        plant(**kwargs)
        with pytest.raises(RecordCorrupted, match=message):
            read_record(out, uid)
    os.unlink(path)
    os.link(canary, path)
    with pytest.raises(RecordCorrupted, match="single link"):
        read_record(out, uid)
    os.unlink(path)
    assert_canary_intact(canary)


RECORD_SWAP_CANDIDATE = '''
import os
import torch
os.unlink("record.json")
os.symlink(TARGET, "record.json")
os._exit(0)


class ModelNew(torch.nn.Module):
    pass
'''


@pytest.mark.nvcc
@needs_dedicated
def test_record_json_swapped_for_a_link_is_a_record_error(compile_pool, canary_dir):
    """The candidate replaces its record by a link to a root file that, if read, would give another verdict."""
    target = canary_dir / "record_bait.json"
    target.write_text(json.dumps({"done": True, "error_kind": "no_load_inline", "error": SECRET.decode(),
                                  "specs": []}))
    os.chmod(target, 0o600)
    task = (CORPUS / "tasks" / "cpu_relu.py").read_text()
    out = compile_pool.compile(task, RECORD_SWAP_CANDIDATE.replace("TARGET", repr(str(target))))
    assert not out.ok and out.error_kind == "record_error", (out.error_kind, out.log)
    assert "corrupted its record" in out.log and "symbolic link" in out.log and "CANARY" not in out.log


# --- (f) cache privacy -----------------------------------------------------------------------------------------------
def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_cache_modes(tmp_path):
    src = tmp_path / "m.so"
    src.write_bytes(b"so")
    cache = BuildCache(str(tmp_path / "builds"), 1 << 20)
    entry = cache.publish("ab" * 32, {"m.so": str(src)})
    assert mode(cache.root) == 0o755 and mode(os.path.join(cache.root, "entries")) == 0o711
    assert mode(os.path.dirname(entry.path)) == 0o711  # the 2-char prefix dir: traversable, not listable
    assert mode(os.path.join(cache.root, "tmp")) == 0o700 and mode(os.path.join(cache.root, "trash")) == 0o700
    assert mode(entry.file("m.so")) & 0o444 == 0o444  # sandboxed GPU workers load it by path
    private = BuildCache(str(tmp_path / "records"), 1 << 20, private=True)
    assert mode(private.root) == 0o700
    # an existing cache's listable prefix dirs are closed when it is opened again
    os.chmod(os.path.dirname(entry.path), 0o755)
    os.chmod(os.path.join(cache.root, "entries"), 0o755)
    BuildCache(str(tmp_path / "builds"), 1 << 20)
    assert mode(os.path.dirname(entry.path)) == 0o711 and mode(os.path.join(cache.root, "entries")) == 0o711


@needs_dedicated
def test_sandbox_can_open_known_entries_but_not_list_them(sandbox_tmp):
    src = sandbox_tmp / "m.so"
    src.write_bytes(b"known")
    cache = BuildCache(str(sandbox_tmp / "builds"), 1 << 20)
    entry = cache.publish("ab" * 32, {"m.so": str(src)})
    limits = sb.SandboxLimits(wall_timeout_s=30)
    listing = sb.run_sandboxed(["/bin/ls", os.path.join(cache.root, "entries")], str(sandbox_tmp / "w1"), limits)
    assert listing["exit_code"] != 0 and b"ab" not in listing["stdout"]
    shard = sb.run_sandboxed(["/bin/ls", os.path.dirname(entry.path)], str(sandbox_tmp / "w2"), limits)
    assert shard["exit_code"] != 0
    known = sb.run_sandboxed(["/bin/cat", entry.file("m.so")], str(sandbox_tmp / "w3"), limits)
    assert known["exit_code"] == 0 and known["stdout"] == b"known"
    records = BuildCache(str(sandbox_tmp / "records"), 1 << 20, private=True)
    rec = records.publish("cd" * 32, {"record.json": str(src)})
    secret = sb.run_sandboxed(["/bin/cat", rec.file("record.json")], str(sandbox_tmp / "w4"), limits)
    assert secret["exit_code"] != 0 and secret["stdout"] == b""


@pytest.mark.nvcc
def test_pool_keeps_records_in_a_root_only_store(compile_pool):
    assert mode(compile_pool.records.root) == 0o700
    assert compile_pool.records.root != compile_pool.cache.root
    assert mode(os.path.join(compile_pool.cache.root, "entries")) == 0o711


# --- specs that come back from record.json ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad, error", [
    ({"source_files": [["../x.cu", ""]], "kind": "files", "n_sources": 1}, ValueError),
    ({"source_files": [["-fplugin=x.so", ""]], "kind": "files", "n_sources": 1}, ValueError),
    ({"source_files": [[".hidden.cu", ""]], "kind": "files", "n_sources": 1}, ValueError),
    ({"n_sources": True}, ValueError), ({"cpp_sources": [3]}, TypeError), ({"extra_cflags": "-O3"}, TypeError),
    ({"with_cuda": "yes"}, TypeError), ({"is_standalone": 1}, TypeError), ({"functions": [["f"]]}, ValueError),
])
def test_hostile_spec_dicts_are_refused(bad, error):
    d = {"name": "e", **bad}
    with pytest.raises(error):
        if isinstance(d.get("extra_cflags"), str):
            ExtensionSpec(**d)
        else:
            ExtensionSpec.from_dict(d)


def test_file_builds_write_only_plain_names(tmp_path):
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    (tmp_path / "odd name.h").write_text("#pragma once\n")
    spec = cand.spec_from_load("ext", [str(tmp_path / "k.cu")])
    assert [n for n, _ in spec.source_files] == ["k.cu"]  # the oddly named sibling header is not carried
    (tmp_path / "-x.cu").write_text("")
    with pytest.raises(ValueError, match="source file name"):
        cand.spec_from_load("ext", [str(tmp_path / "-x.cu")])
