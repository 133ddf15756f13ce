"""Extraction of the program from a response, extension specs, and load_inline interception (record/prebuilt)."""
import glob
import json
import os
import sysconfig

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuda_eval.protocol import extension_spec as cand
from cuda_eval.protocol.extension_spec import ExtensionSpec
from cuda_eval.static import static_record
from cuda_eval.static.extraction import extract_code
from cuda_eval.worker import extension_loader as loader

PROGRAM = "import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


def fenced(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}```\n"


# --- extraction ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, expected_error", [
    ("", "empty response"),
    ("   \n", "empty response"),
    ("I think the answer is to use a kernel.", "no ```python code block"),
    (fenced("int main() {}", "cpp"), "no ```python code block"),
    ("```python\nclass ModelNew: pass\n", "not closed"),
    (fenced("class Model(nn.Module): pass\n"), "does not define class ModelNew"),
])
def test_format_errors(response, expected_error):
    ex = extract_code(response)
    assert ex.code is None and expected_error in ex.error


@pytest.mark.parametrize("lang", ["python", "py", "Python", "python3", ""])
def test_languages_accepted(lang):
    ex = extract_code("Here:\n" + fenced(PROGRAM, lang))
    assert ex.ok and ex.code == PROGRAM and ex.error is None


def test_last_block_defining_model_new_wins():
    first = PROGRAM.replace("pass", "x = 1")
    second = PROGRAM.replace("pass", "x = 2")
    helper = "def helper(): pass\n"
    text = fenced(first) + "better:\n" + fenced(second) + "and a test:\n" + fenced(helper)
    assert extract_code(text).code == second


def test_blocks_after_think_are_preferred():
    in_think = PROGRAM.replace("pass", "draft = True")
    final = PROGRAM.replace("pass", "final = True")
    text = "<think>\nlet me try\n" + fenced(in_think) + "</think>\nAnswer:\n" + fenced(final)
    assert extract_code(text).code == final
    # Whatever is inside the think section loses to a block after it, even if it came "later" in spirit.
    text2 = "<think>\n" + fenced(final) + "</think>\n" + fenced(in_think)
    assert extract_code(text2).code == in_think


def test_falls_back_to_blocks_inside_think():
    inside = PROGRAM.replace("pass", "inside = True")
    assert extract_code("<think>\n" + fenced(inside) + "</think>\nsorry, no code").code == inside
    assert extract_code("<think>\nunterminated\n" + fenced(inside)).code == inside


def test_longer_fences_and_indented_fences():
    text = "````python\n" + PROGRAM + "```\nnot the end\n````\n"
    assert "not the end" in extract_code(text).code
    assert extract_code("  ```python\n" + PROGRAM + "  ```\n").code == PROGRAM


def test_non_string_response_is_a_format_error():
    assert "not text" in extract_code(None).error
    assert "not text" in extract_code(b"```python\n```").error


fragments = st.sampled_from(["```", "```python\n", "```py\n", "\n```\n", "<think>", "</think>", "class ModelNew",
                             "class ModelNew(nn.Module):\n    pass\n", "\n", "~~~", "````", "\r\n", "\x00", "é"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(fragments, st.text(max_size=30)), max_size=25))
def test_extraction_never_raises(parts):
    ex = extract_code("".join(parts))
    assert (ex.code is None) != (ex.error is None)
    if ex.code is not None:
        assert "ModelNew" in ex.code


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_extraction_never_raises_on_any_text(text):
    ex = extract_code(text)
    assert (ex.code is None) != (ex.error is None)


# --- specs -----------------------------------------------------------------------------------------------------------
def test_spec_from_load_inline_binds_like_torch():
    spec = cand.spec_from_load_inline("ext", "int f();", "__global__ void k(){}", None, ["f"],
                                      extra_cuda_cflags=["-O3"])
    assert spec.name == "ext" and spec.cpp_sources == ("int f();",) and spec.cuda_sources == ("__global__ void k(){}",)
    assert spec.functions == (("f", "f"),) and spec.extra_cuda_cflags == ("-O3",) and spec.uses_cuda
    spec2 = cand.spec_from_load_inline(name="ext", cpp_sources=["a", "b"], functions={"f": "doc"}, with_cuda=False)
    assert spec2.cpp_sources == ("a", "b") and spec2.functions == (("f", "doc"),) and not spec2.uses_cuda
    assert cand.spec_from_load_inline(name="e", cpp_sources="", functions="g").functions == (("g", "g"),)
    assert cand.spec_from_load_inline(name="e", cpp_sources="").functions is None


@pytest.mark.parametrize("kwargs, error", [
    ({"name": "bad name", "cpp_sources": ""}, ValueError),
    ({"name": "e", "cpp_sources": 3}, TypeError),
    ({"name": "e", "cpp_sources": "", "functions": 3}, ValueError),
    ({"name": "e", "cpp_sources": "", "sycl_sources": ["x"]}, ValueError),
    ({"name": "e"}, TypeError),
    ({"name": "e", "cpp_sources": "", "bogus": 1}, TypeError),
])
def test_spec_rejects_what_torch_would(kwargs, error):
    with pytest.raises(error):
        cand.spec_from_load_inline(**kwargs)


def test_spec_key_and_content_hash():
    a = cand.spec_from_load_inline(name="e", cpp_sources="x", cuda_sources="y", functions=["f"])
    b = cand.spec_from_load_inline("e", ["x"], ["y"], functions=["f"], verbose=True, build_directory="/tmp/elsewhere")
    assert a == b and a.key() == b.key()  # build dir and verbosity do not change the product
    c = cand.spec_from_load_inline(name="e", cpp_sources="x", cuda_sources="y", functions=["f"],
                                   extra_cuda_cflags=["-O3"])
    assert c.key() != a.key()
    tc1, tc2 = {"arch": "sm_90", "torch": "2.11"}, {"arch": "sm_80", "torch": "2.11"}
    assert a.content_hash(tc1) != a.content_hash(tc2) and a.content_hash(tc1) == b.content_hash(dict(tc1))


def test_spec_dict_round_trip():
    spec = cand.spec_from_load_inline(name="e", cpp_sources=["x"], cuda_sources="y", functions={"f": "d"},
                                      extra_cflags=["-O2"], extra_include_paths=["/usr/include"])
    d = json.loads(json.dumps(spec.to_dict()))
    assert ExtensionSpec.from_dict(d) == spec and ExtensionSpec.from_dict(d).key() == spec.key()
    with pytest.raises(ValueError, match="unknown"):
        ExtensionSpec.from_dict({**d, "surprise": 1})


def test_spec_from_load_reads_files_and_sibling_headers(tmp_path):
    (tmp_path / "k.cu").write_text('#include "k.cuh"\n__global__ void k() {}\n')
    (tmp_path / "k.cuh").write_text("#pragma once\n")
    (tmp_path / "m.cpp").write_text("int main_part();\n")
    spec = cand.spec_from_load("ext", [str(tmp_path / "m.cpp"), str(tmp_path / "k.cu")], extra_cflags=["-O2"])
    assert spec.kind == "files" and spec.n_sources == 2 and spec.uses_cuda
    assert [n for n, _ in spec.source_files] == ["m.cpp", "k.cu", "k.cuh"]


# --- stage 1: recording ------------------------------------------------------------------------------------------------
def test_record_extensions_returns_modules_that_refuse_to_run():
    import torch.utils.cpp_extension as ce
    original = ce.load_inline
    sink = []
    with loader.record_extensions(sink):
        from torch.utils.cpp_extension import load_inline
        mod = load_inline(name="rec", cpp_sources="int f();", functions=["f"])
        path = ce.load_inline(name="ops", cpp_sources="", is_python_module=False)
        with pytest.raises(loader.ExtensionCallError, match="only recorded"):
            mod.f(1)
        with pytest.raises(loader.ExtensionCallError):
            mod.anything_else()
    assert ce.load_inline is original
    assert [s.name for s in sink] == ["rec", "ops"] and isinstance(path, str)


# --- stage 2: prebuilt modules -------------------------------------------------------------------------------------------
def _stdlib_extension(name: str) -> str:
    """A real extension module .so of the standard library (stands in for a built candidate: importable as-is)."""
    lib = sysconfig.get_config_var("DESTSHARED") or os.path.join(sysconfig.get_paths()["platstdlib"], "lib-dynload")
    found = glob.glob(os.path.join(lib, f"{name}.*.so"))
    if not found:
        pytest.skip(f"no {name} extension in {lib}")
    return found[0]


def test_install_prebuilt_routes_known_specs_and_builds_unknown_ones():
    import torch.utils.cpp_extension as ce
    original = ce.load_inline
    known = cand.spec_from_load_inline(name="_json", cpp_sources="// known")
    so = _stdlib_extension("_json")
    built = []

    def builder_fake(spec):
        built.append(spec.name)
        return _stdlib_extension("_csv")

    modules = [cand.BuiltModule("_json", so, "ab" * 32, False, known.key()).to_dict()]
    with loader.install_prebuilt(modules, builder=builder_fake):
        m1 = ce.load_inline(name="_json", cpp_sources="// known")
        m2 = ce.load_inline(name="_json", cpp_sources="// known")
        assert m1 is m2 and m1.__file__ == so and built == []
        m3 = ce.load_inline(name="_csv", cpp_sources="// reached only at run time")
        assert built == ["_csv"] and hasattr(m3, "reader")
    assert ce.load_inline is original


def test_install_prebuilt_without_builder_explains():
    import torch.utils.cpp_extension as ce
    with loader.install_prebuilt({}):
        with pytest.raises(RuntimeError, match="not built in the compile stage"):
            ce.load_inline(name="late", cpp_sources="")
    with pytest.raises(ValueError, match="spec_key"):
        loader.install_prebuilt([cand.BuiltModule("x", "/x.so", "ab" * 32)])


# --- static speculation ------------------------------------------------------------------------------------------------
SPEC_PROGRAM = '''
import torch
from torch.utils.cpp_extension import load_inline
HEADER = "#include <torch/extension.h>\\n"
cuda_src = HEADER + """__global__ void k() {}"""
cpp_src = "torch::Tensor f(torch::Tensor x);"
FLAGS = ["-O3"]
ext = load_inline(name="spec_ext", cpp_sources=cpp_src, cuda_sources=[cuda_src], functions=["f"],
                  extra_cuda_cflags=FLAGS, verbose=True)
torch.utils.cpp_extension.load_inline("second", cpp_src)
dynamic = load_inline(name="dyn_" + str(3), cpp_sources=cpp_src)
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="in_init", cpp_sources=cpp_src)
'''


def test_speculation_reads_module_level_literal_calls():
    specs = static_record.speculate_specs(SPEC_PROGRAM)
    assert [s.name for s in specs] == ["spec_ext", "second"]
    assert specs[0] == cand.spec_from_load_inline(name="spec_ext", cpp_sources="torch::Tensor f(torch::Tensor x);",
                                                  cuda_sources=["#include <torch/extension.h>\n__global__ void k() {}"],
                                                  functions=["f"], extra_cuda_cflags=["-O3"])


@pytest.mark.parametrize("code", ["def broken(:\n", SPEC_PROGRAM.replace("class ModelNew", "class Other"),
                                  "import torch\nclass ModelNew: pass\nx = load_inline(**{'name': 'a'})\n", "\0"])
def test_speculation_gives_up_quietly(code):
    assert static_record.speculate_specs(code) == []
