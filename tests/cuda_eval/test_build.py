"""Our build of extensions (cuda_eval.compile): generated sources, flags, logs, and real small builds."""
import os

import pytest

from cuda_eval.compile import glue as glue_mod, nvcc, sources, toolchain as tcmod
from cuda_eval.compile.builder import BuildConfig, Builder
from cuda_eval.protocol import kernel_symbols
from cuda_eval.protocol.extension_spec import ExtensionSpec, spec_from_load_inline
from cuda_eval.worker.extension_loader import import_extension
from cuda_eval.worker.runtime_build import RuntimeBuildError, RuntimeBuilder
from sandbox_fixtures import run_lock, sandbox_tmp, shared_dir, toolchain  # noqa: F401 - fixtures

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- flags from torch ----------------------------------------------------------------------------------------------
def test_flags_follow_torch_rules(toolchain):
    f = toolchain.flags("myext", with_cuda=True, extra_cflags=["-O3", ""], extra_cuda_cflags=["-O3 --use_fast_math"])
    assert "-DTORCH_EXTENSION_NAME=myext" in f["cflags"] and f["cflags"][-1] == "-O3" and "" not in f["cflags"]
    cu = f["cuda_cflags"]
    num = toolchain.arch[3:]   # the card's own arch on a GPU machine (sandbox_fixtures.TEST_ARCH), else sm_90
    assert f"-gencode=arch=compute_{num},code=sm_{num}" in cu and "--use_fast_math" in cu
    assert any(x.startswith("-std=") for x in cu)
    assert f["ldflags"][0] == "-shared" and "-ltorch" in f["ldflags"]
    for lib in toolchain.missing_torch_libs:
        assert f"-l{lib}" not in f["ldflags"]
    # A user arch flag replaces torch's -gencode; a user -std replaces torch's.
    g = toolchain.flags("e", with_cuda=True, extra_cuda_cflags=[f"-arch={toolchain.arch}", "-std=c++17"])["cuda_cflags"]
    assert not any(x.startswith("-gencode") for x in g) and f"-arch={toolchain.arch}" in g
    assert [x for x in g if x.startswith("-std=")] == ["-std=c++17"]
    assert toolchain.flags("e", with_cuda=False)["cuda_cflags"] == []
    with pytest.raises(ValueError, match="cannot parse"):
        toolchain.flags("e", with_cuda=True, extra_cflags=["-DX='unbalanced"])


@pytest.mark.parametrize("arch, expected", [("sm_90", "sm_90"), ("90", "sm_90"), ("9.0", "sm_90"),
                                            ("sm_90a", "sm_90a"), ("compute_80", "sm_80"), ("8.6", "sm_86")])
def test_normalize_arch(arch, expected):
    assert tcmod.normalize_arch(arch) == expected


def test_bad_arch():
    with pytest.raises(ValueError, match="bad CUDA arch"):
        tcmod.normalize_arch("hopper")


# --- generated sources -------------------------------------------------------------------------------------------------
SPEC = spec_from_load_inline(name="ext", cpp_sources=["torch::Tensor f(torch::Tensor x);"],
                             cuda_sources=["#include <torch/extension.h>\n__global__ void k() {}\ntorch::Tensor f("
                                           "torch::Tensor x) { return x; }\n"], functions=["f"])


def test_main_cpp_is_what_load_inline_writes():
    text = sources.main_cpp(SPEC, pch_include=False)
    lines = text.splitlines()
    assert lines[0] == "#include <torch/extension.h>"
    assert '#line 1 "cpp_sources[0]"' in lines
    assert 'm.def("f", torch::wrap_pybind_function(f), "f");' in lines
    raw = sources.main_cpp(ExtensionSpec(**{**SPEC.__dict__, "with_pytorch_error_handling": False}), pch_include=False)
    assert 'm.def("f", f, "f");' in raw
    pch = sources.main_cpp(SPEC, pch_include=True).splitlines()
    assert pch[:2] == [f'#include "{sources.PCH_HEADER}"', "#define TORCH_EXTENSION_NAME ext"]
    bare = sources.main_cpp(ExtensionSpec(**{**SPEC.__dict__, "no_implicit_headers": True}), pch_include=False)
    assert "torch/extension.h" not in bare.splitlines()[0]


def test_cuda_cu_light_keeps_line_numbers():
    exact, light = sources.cuda_cu(SPEC, light=False), sources.cuda_cu(SPEC, light=True)
    assert exact.splitlines()[:3] == ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    assert len(exact.splitlines()) == len(light.splitlines())
    assert "torch/extension.h" not in light and "torch/types.h" not in light
    assert light.count(sources.LIGHT_HEADER) == 2


def test_light_header_eligibility(toolchain):
    text, why = sources.light_header_text(["auto y = torch::empty_like(x); auto z = at::zeros({3}, x.options());"],
                                     toolchain)
    assert why == "" and "#include <ATen/ops/empty_like.h>" in text and "#include <ATen/ops/zeros.h>" in text
    assert "namespace torch" in text and "AT_PER_OPERATOR_HEADERS" in text
    assert "TensorIndexing" not in text
    assert "TensorIndexing" in sources.light_header_text(["x.index({torch::indexing::Slice()})"], toolchain)[0]
    for src in ["PYBIND11_MODULE(m, m) {}", "py::object o;", "torch::nn::Linear l(3, 3);",
                "#include <torch/torch.h>", "auto t = torch::from_blob(p, {3});", "TORCH_LIBRARY(ops, m) {}"]:
        text, why = sources.light_header_text([src], toolchain)
        assert text is None and why.startswith("uses"), src



def test_lean_op_headers_drop_context_and_device_guard_only(toolchain):
    src = "auto y = torch::empty({3}, x.options()); return x + y;"
    light, _ = sources.light_header_text([src], toolchain)
    lean = sources.lean_op_headers([src], light, toolchain)
    # every operator header the light header names, and empty_like.h (ATen/TensorOperators.h includes it)
    assert set(lean) == {"ATen/ops/empty.h", "ATen/ops/empty_like.h"}
    for rel, text in lean.items():
        installed = open(os.path.join(toolchain.torch_include[0], rel)).read()
        assert "#include <ATen/Context.h>" in installed and "#include <ATen/DeviceGuard.h>" in installed
        assert "ATen/Context.h" not in text and "ATen/DeviceGuard.h" not in text
        # the rest exactly as installed, line for line (the dropped includes leave empty lines)
        assert text.splitlines() == ["" if ln in ("#include <ATen/Context.h>", "#include <ATen/DeviceGuard.h>")
                                     else ln for ln in installed.splitlines()]
    # sources that might name what those headers declare keep the installed headers
    for needs in ["at::DeviceGuard g(x.device());", "const at::cuda::OptionalCUDAGuard g(device_of(x));",
                  "if (at::hasCUDA()) {}"]:
        assert sources.lean_op_headers([src + needs], light, toolchain) == {}, needs


# --- main.cpp as glue unit + shared binding object -------------------------------------------------------------------
def glue(cpp, functions=("f",), **kw):
    return spec_from_load_inline(name="ext", cpp_sources=cpp, cuda_sources="__global__ void k() {}",
                                 functions=list(functions), **kw)


def test_glue_plan_reads_plain_declarations(toolchain):
    cpp = ("#include <torch/extension.h>\n// entry points\n"
           "torch::Tensor f(torch::Tensor x, const at::Tensor& y, double s, int64_t n = 3);\n"
           "std::vector<torch::Tensor> g(std::vector<torch::Tensor> xs, bool flag);")
    plan, why = glue_mod.glue_plan(glue(cpp, ("f", "g")), toolchain)
    assert why == "" and plan.signatures == (
        "::at::Tensor (*)(::at::Tensor, const ::at::Tensor &, double, ::std::int64_t)",
        "::std::vector < ::at::Tensor > (*)(::std::vector < ::at::Tensor >, bool)")
    # the candidate's lines are kept verbatim (their own #line), only the torch include is swapped for the prelude
    assert '#line 1 "cpp_sources[0]"' in plan.glue_text and "torch/extension.h" not in plan.glue_text
    assert f'#include "{glue_mod.GLUE_PRELUDE}"' in plan.glue_text
    assert 'static_assert(::std::is_same<decltype(&f), ::at::Tensor (*)(' in plan.glue_text
    assert "PyInit_ext()" in plan.glue_text and "PyInit_ext" not in plan.binding_text  # no extension named there
    assert plan.binding_text.startswith("#include <torch/extension.h>\n")
    # known types: the one shared binding object, whatever the names, signatures and error-handling mode; the
    # glue describes each function by its types' indices and calls it through a thunk
    assert plan.shared and plan.binding_text == glue_mod.any_binding_text()
    assert "#include <torch/" not in plan.prelude_text and "#include <ATen/core/Tensor.h>" in plan.prelude_text
    assert "{&kj_thunk_0, 1, 4, 0, {0, 0, 11, 1}}" in plan.glue_text.replace(
        "reinterpret_cast<void (*)()>(&f), &typeid(decltype(&f)), ", "{")
    other, _ = glue_mod.glue_plan(spec_from_load_inline(name="other", cpp_sources="void h(float x);", cuda_sources="",
                                                        functions=["h"], with_pytorch_error_handling=False), toolchain)
    assert other.shared and other.key == plan.key and other.binding_text == plan.binding_text
    assert f"&kj_thunk_0, 0, 1, {glue_mod.ANY_VOID}, {{12}}" in other.glue_text
    # a type the shared binding has no caster for (a pointer, a reference result, a tuple argument): a binding
    # object per signature set, load_inline's PYBIND11_MODULE for exactly those signatures
    for odd in ("torch::Tensor f(torch::Tensor x, float* p);", "torch::Tensor& f(torch::Tensor x);",
                "torch::Tensor f(std::tuple<torch::Tensor, torch::Tensor> x);"):
        per_sig, _ = glue_mod.glue_plan(glue(odd), toolchain)
        assert not per_sig.shared and "m.def(kj_names[0], torch::wrap_pybind_function(*reinterpret_cast<kj_sig_0>(" \
            "kj_fns[0])), kj_docs[0]);" in per_sig.binding_text, odd
        assert "namespace at { class Tensor; }" in per_sig.prelude_text
    plain, _ = glue_mod.glue_plan(glue(odd, with_pytorch_error_handling=False), toolchain)
    assert plain.key != per_sig.key and "m.def(kj_names[0], *reinterpret_cast<kj_sig_0>(kj_fns[0]), kj_docs[0]);" \
        in plain.binding_text


@pytest.mark.parametrize("cpp, functions", [
    ("torch::Tensor f(torch::Tensor x) { return x; }", ("f",)),                 # a body needs the real headers
    ("#define T torch::Tensor\nT f(T x);", ("f",)),                              # macros: names could change meaning
    ("using namespace torch;\nTensor f(Tensor x);", ("f",)),                     # lookup could find torch's names
    ("namespace k { torch::Tensor f(torch::Tensor x); }", ("f",)),
    ("template <class T> T f(T x);", ("f",)),
    ("torch::Tensor f(torch::Tensor x);\ntorch::Tensor f(torch::Tensor x, double s);", ("f",)),  # overloaded
    ("c10::optional<torch::Tensor> f(torch::Tensor x);", ("f",)),               # a type we do not know
    ("MyType f(torch::Tensor x);", ("f",)),
    ("torch::Tensor f(torch::Tensor x);", ("g",)),                              # never declared
    ("static torch::Tensor f(torch::Tensor x);", ("f",)),
    ("#include <ATen/ATen.h>\ntorch::Tensor f(torch::Tensor x);", ("f",)),     # any other header
    ("torch::Tensor f(torch::Tensor x); // TORCH_CHECK below\nint n = AT_X;", ("f",)),
    ("torch::Tensor f(torch::Tensor x);", ("f", "f\" ")),                       # not an identifier
])
def test_glue_plan_refuses_what_could_differ(toolchain, cpp, functions):
    plan, why = glue_mod.glue_plan(glue(cpp, functions), toolchain)
    assert plan is None and why, cpp


def test_glue_plan_refuses_odd_modules_and_docstrings(toolchain):
    cpp = "torch::Tensor f(torch::Tensor x);"
    for kw in ({"no_implicit_headers": True}, {"is_python_module": False}, {"extra_include_paths": ["/tmp"]}):
        assert glue_mod.glue_plan(glue(cpp, **kw), toolchain)[0] is None, kw
    quoted = spec_from_load_inline(name="ext", cpp_sources=cpp, functions={"f": 'say "hi"'})
    assert glue_mod.glue_plan(quoted, toolchain)[0] is None
    import dataclasses
    assert glue_mod.glue_plan(glue(cpp), dataclasses.replace(toolchain, headers_use_extension_name=True))[0] is None


# --- logs --------------------------------------------------------------------------------------------------------------
NVCC_LOG = """In file included from /work/build/cuda.cu:1:
/work/build/cuda_sources[0](9): error: expected a ";"
        }
        ^

/work/build/cuda_sources[0](13): error: identifier "undefined_fn" is undefined
        auto size = a.numel(); undefined_fn(size);
                               ^

/site/torch/include/c10/util/Exception.h(12): warning #68-D: integer conversion resulted in a change of sign
Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

2 errors detected in the compilation of "cuda.cu".
"""

GCC_LOG = """In file included from /site/torch/include/torch/extension.h:5,
                 from main.cpp:1:
cpp_sources[0]:3:1: error: 'foo' does not name a type
    3 | foo bar;
      | ^~~
load_inline bindings:2:43: note: in expansion of macro
compilation terminated.
"""


def test_clean_log_keeps_errors_drops_noise(toolchain):
    log = nvcc.clean_log(NVCC_LOG, build_dir="/work/build", toolchain=None, max_errors=8, max_chars=4000)
    assert log.splitlines()[0] == 'cuda_sources[0](9): error: expected a ";"'
    assert 'identifier "undefined_fn" is undefined' in log and "undefined_fn(size)" in log
    assert "In file included" not in log and "warning" not in log and "errors detected" not in log
    assert "/work/build" not in log
    g = nvcc.clean_log(GCC_LOG, build_dir="/x", toolchain=None, max_errors=8, max_chars=4000)
    assert g.startswith("cpp_sources[0]:3:1: error: 'foo' does not name a type") and "note:" not in g


def test_clean_log_limits(toolchain):
    many = "".join(f"cuda_sources[0]({i}): error: bad {i}\n" for i in range(30))
    log = nvcc.clean_log(many, build_dir="/b", toolchain=None, max_errors=3, max_chars=4000)
    assert log.count("error: bad") == 3 and "27 more errors" in log
    assert len(nvcc.clean_log(many * 50, build_dir="/b", toolchain=None, max_errors=1000, max_chars=500)) <= 500
    assert nvcc.clean_log("ld: something odd happened\n", build_dir="/b", toolchain=None, max_errors=3,
                        max_chars=100) == "ld: something odd happened"


def test_torch_paths_are_shortened(toolchain):
    inc = toolchain.torch_include[0]
    log = nvcc.clean_log(f"{inc}/ATen/core/TensorBody.h(100): error: no instance of overloaded function\n",
                       build_dir="/b", toolchain=toolchain, max_errors=3, max_chars=1000)
    assert log.startswith("<torch>/ATen/core/TensorBody.h(100): error")


# --- nvcc's dry run ---------------------------------------------------------------------------------------------------
DRYRUN = [
    "_NVVM_BRANCH_=nvvm", "_SPACE_= ", "CICC_PATH=/cuda/nvvm/bin", 'LIBRARIES=  "-L/cuda/lib/stubs" "-L/cuda/lib"',
    'gcc -std=c++17 -D__CUDA_ARCH_LIST__=900 -E -x c++ -D__CUDACC__ "k.cu" -o "/t/x-5_k.cpp4.ii"',
    'cudafe++ --c++17 --gen_c_file_name "/t/x-6_k.cudafe1.cpp" --stub_file_name "x-6_k.cudafe1.stub.c" '
    '--gen_module_id_file --module_id_file_name "/t/x-4_k.module_id" "/t/x-5_k.cpp4.ii"',
    'gcc -std=c++17 -D__CUDA_ARCH__=900 -D__CUDA_ARCH_LIST__=900 -E -x c++ "k.cu" -o "/t/x-7_k.cpp1.ii"',
    '"$CICC_PATH/cicc" --c++17 -arch compute_90 --module_id_file_name "/t/x-4_k.module_id" "/t/x-7_k.cpp1.ii" '
    '-o "/t/x-6_k.ptx"',
    'ptxas -arch=sm_90 -m64 "/t/x-6_k.ptx" -o "/t/x-8_k.cubin"',
    'fatbinary -64 "--image3=kind=elf,sm=90,file=/t/x-8_k.cubin" --embedded-fatbin="/t/x-3_k.fatbin.c"',
    "rm /t/x-3_k.fatbin",
    'gcc -std=c++17 -D__CUDA_ARCH__=900 -c -x c++ "/t/x-6_k.cudafe1.cpp" -o "k.o"',
]


def test_classify_dry_run():
    plan = nvcc._classify(DRYRUN)
    assert [n for n, _ in plan.host] == ["host preprocess", "cudafe++"]
    assert [n for n, _ in plan.device] == ["device preprocess", "cicc", "ptxas", "fatbinary"]
    assert [n for n, _ in plan.final] == ["host compile"] and plan.module_id_file == "/t/x-4_k.module_id"
    assert "--gen_module_id_file" not in plan.host[1][1]
    env = nvcc._assignments_env(plan.assignments)
    assert env["CICC_PATH"] == "/cuda/nvvm/bin" and env["LIBRARIES"] == "-L/cuda/lib/stubs -L/cuda/lib"


def test_unknown_dry_run_falls_back():
    assert nvcc._classify(DRYRUN + ["nvlink --arch=sm_90 a.o -o b.o"]) is None
    assert nvcc._classify([c for c in DRYRUN if not c.startswith("cudafe++")]) is None


# --- real builds (small: no torch headers) ---------------------------------------------------------------------------
TINY_CPP = ("#include <pybind11/pybind11.h>\n"
            "int plus_one(int n);\n"
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"plus_one\", &plus_one); }\n")
TINY_CU = ("#include <cuda_runtime.h>\n"
           "__global__ void touch(int* p) { if (p) *p = 1; }\n"
           "int plus_one(int n) {\n"
           "    touch<<<1, 1>>>(nullptr);\n"
           "    return n + 1;\n"
           "}\n")


def tiny_spec(name: str, cu: str = TINY_CU) -> ExtensionSpec:
    return spec_from_load_inline(name=name, cpp_sources=TINY_CPP, cuda_sources=cu, no_implicit_headers=True)


@pytest.mark.nvcc
@pytest.mark.parametrize("parallel", [True, False])
def test_tiny_cuda_extension_builds_and_loads(toolchain, sandbox_tmp, parallel):
    builder = Builder(toolchain, None, config=BuildConfig(parallel_phases=parallel, use_pch=False))
    name = f"tiny_{int(parallel)}"
    result = builder.build(tiny_spec(name), str(sandbox_tmp / "b"), timeout_s=300)
    assert result.ok, result.raw_log
    names = [p.name for p in result.phases]
    if parallel:
        assert {"cudafe++", "cicc", "ptxas", "host compile"} <= set(names) and "nvcc" not in names
    else:
        assert "nvcc" in names
    module = import_extension(name, result.so_path)
    assert module.plus_one(41) == 42  # host code runs; the kernel launch needs no GPU to return
    assert kernel_symbols.binary_kernels(result.so_path) == ["_Z5touchPi"]   # our build's binary, as the pool reads it


@pytest.mark.nvcc
def test_compile_error_is_mapped_to_the_candidate_source(toolchain, sandbox_tmp):
    bad = TINY_CU.replace("return n + 1;", "return n + undefined_thing;")
    result = Builder(toolchain, None, config=BuildConfig(use_pch=False)).build(tiny_spec("bad", bad),
                                                                             str(sandbox_tmp / "b"), 300)
    assert not result.ok and result.error_kind == "compile_error"
    assert result.log.startswith('cuda_sources[0](5): error: identifier "undefined_thing" is undefined'), result.log
    assert str(sandbox_tmp) not in result.log


@pytest.mark.nvcc
def test_compiler_hang_is_killed(toolchain, sandbox_tmp):
    import dataclasses
    hang = '#include "/dev/zero"\n' + TINY_CU
    small = dataclasses.replace(BuildConfig().limits, address_space_bytes=2 << 30)  # keep the test box's RAM safe
    result = Builder(toolchain, None, config=BuildConfig(use_pch=False, limits=small)).build(
        tiny_spec("hang", hang), str(sandbox_tmp / "b"), timeout_s=8)
    assert not result.ok and result.error_kind in ("compile_timeout", "compile_error")
    assert result.build_s < 30


@pytest.mark.nvcc
def test_object_cache_reuses_unchanged_translation_units(toolchain, sandbox_tmp):
    from cuda_eval.compile.cache import BuildCache
    cache = BuildCache(str(sandbox_tmp / "cache"), 1 << 30)
    builder = Builder(toolchain, cache, config=BuildConfig(use_pch=False))
    first = builder.build(tiny_spec("objc"), str(sandbox_tmp / "b1"), 300)
    second = builder.build(tiny_spec("objc", TINY_CU.replace("n + 1", "2 + n")), str(sandbox_tmp / "b2"), 300)
    assert first.ok and second.ok
    assert "main.o (cached)" in [p.name for p in second.phases]
    # the .cu differs: its object is compiled again, never taken from the first build
    assert "cuda.cuda.o (cached)" not in [p.name for p in second.phases]
    assert import_extension("objc", second.so_path).plus_one(1) == 3


@pytest.mark.nvcc
def test_runtime_builder_builds_unseen_specs_and_reports_failures(toolchain, sandbox_tmp):
    rb = RuntimeBuilder(None, str(sandbox_tmp / "rt"), toolchain=toolchain.to_dict())
    so = rb(tiny_spec("rt_ok"))
    assert import_extension("rt_ok", so).plus_one(1) == 2 and len(rb.builds) == 1 and rb.builds[0]["ok"]
    bad = TINY_CU.replace("return n + 1;", "return n + undefined_thing;")
    with pytest.raises(RuntimeBuildError, match=r"(?s)Error building extension \(compile_error\):\n.*undefined_thing"):
        rb(tiny_spec("rt_bad", bad))


@pytest.mark.nvcc
def test_sources_stay_ours_and_the_product_is_a_copy(toolchain, sandbox_tmp):
    """src/ (generated sources) is ours and read-only for the sandbox, the compilers write into out/, and the .so
    the build returns is our copy of what they linked (a real g++-only build, no torch headers)."""
    import stat
    cpp = "#include <pybind11/pybind11.h>\nint two() { return 2; }\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) " \
          "{ m.def(\"two\", &two); }\n"
    spec = spec_from_load_inline(name="layout", cpp_sources=cpp, no_implicit_headers=True, with_cuda=False)
    result = Builder(toolchain, None, config=BuildConfig(use_pch=False)).build(spec, str(sandbox_tmp / "b"), 300)
    assert result.ok, result.raw_log
    root = sandbox_tmp / "b"
    assert sorted(os.listdir(root)) == ["out", "product", "src"]
    st = os.lstat(root / "product")
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o755
    # src/ is readable by this build's sandbox uid alone (its group), not by other candidates' processes
    st, out = os.lstat(root / "src"), os.lstat(root / "out")
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == (0o750 if os.geteuid() == 0 else 0o755)
    assert os.geteuid() != 0 or st.st_gid == out.st_uid != 0
    assert os.listdir(root / "src") == ["main.cpp"] and os.lstat(root / "src" / "main.cpp").st_uid == os.geteuid()
    assert result.so_path == str(root / "product" / "layout.so")
    assert open(result.so_path, "rb").read() == (root / "out" / "layout.so").read_bytes()
    assert os.stat(result.so_path).st_ino != os.stat(root / "out" / "layout.so").st_ino
    assert import_extension("layout", result.so_path).two() == 2



GLUE_CPP = ("#include <torch/extension.h>\n"
            "torch::Tensor axpy(torch::Tensor a, torch::Tensor b, double s);\n"
            "std::vector<torch::Tensor> pair(const torch::Tensor& x, int64_t n);\n"
            "std::tuple<torch::Tensor, torch::Tensor> split2(const torch::Tensor& x, std::optional<torch::Tensor> w,"
            " bool flip);\n"
            "void fill(torch::Tensor x, float v, const std::vector<int64_t>& shape);\n"
            "int64_t count(const std::vector<torch::Tensor>& xs, int k);\n")
GLUE_FUNCTIONS = ["axpy", "pair", "split2", "fill", "count"]
GLUE_CU = ("torch::Tensor axpy(torch::Tensor a, torch::Tensor b, double s) {\n"
           "    TORCH_CHECK(a.sizes() == b.sizes(), \"size mismatch\");\n"
           "    return a + b * s;\n"
           "}\n"
           "std::vector<torch::Tensor> pair(const torch::Tensor& x, int64_t n) { return {x * n, x + n}; }\n"
           "std::tuple<torch::Tensor, torch::Tensor> split2(const torch::Tensor& x, std::optional<torch::Tensor> w,"
           " bool flip) {\n"
           "    auto y = w.has_value() ? x * *w : x;\n"
           "    return flip ? std::make_tuple(y, x) : std::make_tuple(x, y);\n"
           "}\n"
           "void fill(torch::Tensor x, float v, const std::vector<int64_t>& shape) {\n"
           "    TORCH_CHECK(x.dim() == (int64_t)shape.size(), \"rank \", x.dim());\n"
           "    x.fill_(v);\n"
           "}\n"
           "int64_t count(const std::vector<torch::Tensor>& xs, int k) { return (int64_t)xs.size() * k; }\n")
GLUE_PROBE = r"""
import json, sys, torch
from cuda_eval.worker.extension_loader import import_extension
m = import_extension("glue_ext", sys.argv[1])
fns = [m.axpy, m.pair, m.split2, m.fill, m.count]
x = torch.ones(2)
out = {"name": m.__name__, "module": m.axpy.__module__, "docs": [f.__doc__ for f in fns],
       "names": sorted(n for n in dir(m) if not n.startswith("__")),
       "axpy": m.axpy(torch.ones(3), torch.ones(3), 2.0).tolist(), "pair": [t.tolist() for t in m.pair(x, 3)],
       "split2": [[t.tolist() for t in m.split2(x, w, f)] for w in (None, x * 3) for f in (False, True)],
       "fill": [m.fill(x, 5, [2]), x.tolist()], "count": m.count([x, x, x], 2)}
errors = []
for call in (lambda: m.axpy(torch.ones(3), torch.ones(4), 2.0), lambda: m.axpy(1, 2, 3),
             lambda: m.pair(torch.ones(2), 1.5), lambda: m.axpy(torch.ones(2), torch.ones(2), s=1.0),
             lambda: m.split2(x, 3, True), lambda: m.fill(x, 1.0, [1, 2]), lambda: m.fill(x, "a", [2]),
             lambda: m.count(x, 2), lambda: m.count([x], 2 ** 40), lambda: m.pair(x), lambda: m.split2(x, None, 1)):
    try:
        call()
        errors.append(None)
    except Exception as e:
        text = f"{type(e).__name__}: {e}".replace(sys.argv[1], "SO")
        errors.append(text if len(sys.argv) < 3 else text.splitlines()[0])
out["errors"] = errors
print(json.dumps(out))
"""


@pytest.mark.nvcc
def test_glue_binding_behaves_as_load_inlines_main_cpp(toolchain, sandbox_tmp):
    """The same extension built with main.cpp as load_inline writes it and as glue + binding: the module loads
    under its name and its functions have the same docstrings, results and errors (bad sizes, bad types, keyword
    arguments); a second extension with the same signatures takes the binding from the cache."""
    import json
    import subprocess
    import sys
    from cuda_eval.compile.cache import BuildCache
    cache = BuildCache(str(sandbox_tmp / "cache"), 1 << 30)
    seen = {}
    for wrap in (True, False):
        spec = spec_from_load_inline(name="glue_ext", cpp_sources=GLUE_CPP, cuda_sources=GLUE_CU,
                                     functions=GLUE_FUNCTIONS, with_pytorch_error_handling=wrap)
        assert glue_mod.glue_plan(spec, toolchain)[0].shared
        for mode in ("glue", "exact"):  # the exact build finds the glue build's cuda.o in the object cache
            builder = Builder(toolchain, cache, config=BuildConfig(use_pch=False, glue_binding=mode == "glue"))
            result = builder.build(spec, str(sandbox_tmp / f"{mode}{wrap}"), 900)
            assert result.ok, result.raw_log
            assert result.binding_mode == mode, result.binding_failure
            # without the error handling a c10::Error's text carries a C++ backtrace: its first line is compared
            probe = subprocess.run([sys.executable, "-c", GLUE_PROBE, result.so_path, *([] if wrap else ["1"])],
                                   capture_output=True, text=True, cwd=REPO, timeout=300)
            assert probe.returncode == 0, probe.stderr
            seen[mode, wrap] = json.loads(probe.stdout)
        assert seen["glue", wrap] == seen["exact", wrap]
    glue = seen["glue", True]
    assert glue["name"] == "glue_ext" and glue["axpy"] == [3.0, 3.0, 3.0] and glue["count"] == 6
    assert glue["errors"][0] == "RuntimeError: size mismatch" and "incompatible function arguments" in \
        glue["errors"][1]
    assert glue["docs"][2].startswith("split2(arg0: torch.Tensor, arg1: torch.Tensor | None, arg2: bool) -> tuple[")
    renamed = spec_from_load_inline(name="glue_two", cpp_sources=GLUE_CPP.replace("axpy", "axpy2"),
                                    cuda_sources=GLUE_CU.replace("axpy", "axpy2"),
                                    functions=["axpy2"])  # another signature set: the same binding object
    again = Builder(toolchain, cache, config=BuildConfig(use_pch=False)).build(renamed, str(sandbox_tmp / "two"), 900)
    assert again.ok and again.binding_mode == "glue"
    names = [p.name for p in again.phases]
    # only the binding object is shared: the glue unit and the .cu of the other sources are compiled anew
    assert f"{glue_mod.BINDING_OBJECT} (cached)" in names and "g++ main.cpp (glue)" in names
    assert "cuda.cuda.o (cached)" not in names and "main.o (cached)" not in names
    probe = subprocess.run([sys.executable, "-c", "import sys, torch\n"
                            "from cuda_eval.worker.extension_loader import import_extension\n"
                            "m = import_extension('glue_two', sys.argv[1])\n"
                            "print(m.axpy2(torch.ones(2), torch.ones(2), 3.0).tolist(), m.axpy2.__doc__)",
                            again.so_path], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert probe.stdout.split("\n")[0] == "[4.0, 4.0] axpy2(arg0: torch.Tensor, arg1: torch.Tensor, arg2: " \
        "typing.SupportsFloat | typing.SupportsIndex) -> torch.Tensor", probe.stderr


@pytest.mark.nvcc
def test_glue_failure_falls_back_to_the_exact_main_cpp(toolchain, sandbox_tmp):
    """A declaration the plan cannot see (a default argument in parentheses) makes `f` overloaded: the glue unit
    fails its signature check, and the verdict is the exact main.cpp's (load_inline's own error)."""
    cpp = "torch::Tensor f(torch::Tensor x);\ntorch::Tensor f(torch::Tensor x, torch::Tensor y = torch::Tensor());\n"
    spec = spec_from_load_inline(name="glue_bad", cpp_sources=cpp, functions=["f"], with_cuda=False)
    assert glue_mod.glue_plan(spec, toolchain)[0] is not None
    result = Builder(toolchain, None, config=BuildConfig(use_pch=False)).build(spec, str(sandbox_tmp / "b"), 900)
    assert not result.ok and result.error_kind == "compile_error"
    assert result.binding_mode == "glue_failed_exact" and "glue unit did not compile" in result.binding_failure
    names = [p.name for p in result.phases]
    assert names[:2] == ["g++ main.cpp (glue)", "g++ main.cpp"], names
    assert "load_inline bindings" in result.log and "glue" not in result.log
