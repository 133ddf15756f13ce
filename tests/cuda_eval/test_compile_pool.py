"""The compile pool end to end with real nvcc: record, light-header build, cache, stage-2 loading."""

import pytest

from cuda_eval.compile.pool import CompileConfig, CompileOutcome
from cuda_eval.protocol import extension_spec as cand
from cuda_eval.worker import extension_loader as loader
from sandbox_fixtures import (TEST_ARCH, built_add, candidate_pair, compile_pool, make_pool,  # noqa: F401
                              run_lock, shared_dir, toolchain)

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]


def test_kernelbench_add_compiles(built_add):
    out = built_add
    assert out.ok, (out.log, out.timings)
    assert out.error_kind is None and len(out.modules) == 1
    m = out.modules[0]
    assert m.name == "elementwise_add" and m.so_path.endswith("elementwise_add.so")
    assert m.header_mode == "light"  # this kernel needs nothing beyond the light header
    assert out.specs[0]["name"] == "elementwise_add"
    assert out.toolchain["arch"] == TEST_ARCH
    # literal sources in module-level load_inline calls: read from the source, the program never ran here
    assert out.timings.get("record_static") and out.timings["record_cpu_s"] == 0.0
    assert out.timings["speculated"] == 0
    assert {"record_s", "build_s", "wall_s"} <= set(out.timings)
    assert CompileOutcome(**{**out.__dict__}).to_dict()["modules"][0]["spec_key"] == m.spec_key


def test_second_compile_is_a_cache_hit(compile_pool, built_add):
    out = compile_pool.compile(*candidate_pair("add"))
    assert out.ok and out.modules[0].cache_hit and out.modules[0].so_path == built_add.modules[0].so_path
    assert out.timings["build_s"] == 0.0
    assert out.timings.get("record_static") and out.timings["wall_s"] < 1.0


def test_a_recorded_program_is_recorded_once(shared_dir, built_add):
    """With the static reading off (or for a program it cannot read), the program runs in the record sandbox once;
    the same program again costs no process and no torch import."""
    with make_pool(shared_dir, static_record=False) as pool:
        first = pool.compile(*candidate_pair("add"))
        again = pool.compile(*candidate_pair("add"))
    assert first.ok and again.ok and not first.timings.get("record_static")
    assert first.timings.get("record_cache_hit") or first.timings["record_cpu_s"] > 0
    assert again.timings.get("record_cache_hit") and again.timings["wall_s"] < 1.0
    assert [m.spec_key for m in first.modules] == [m.spec_key for m in built_add.modules]


def test_prebuilt_module_loads_in_stage_two(built_add):
    """What the GPU worker does: install the prebuilt modules, import the candidate, build ModelNew."""
    import torch  # noqa: F401
    task_source, code = candidate_pair("add")
    with loader.install_prebuilt([m.to_dict() for m in built_add.modules]):
        namespace = {"__name__": "stage2_candidate"}
        exec(compile(code, "candidate.py", "exec"), namespace)
        model = namespace["ModelNew"]()
    assert model.elementwise_add.__file__ == built_add.modules[0].so_path
    assert callable(model.elementwise_add.elementwise_add_cuda)


def test_compile_error_rebuilds_exactly_and_maps_lines(compile_pool):
    task_source, code = candidate_pair("add")
    broken = code.replace("out[idx] = a[idx] + b[idx];", "out[idx] = a[idx] + b[idx]")
    out = compile_pool.compile(task_source, broken)
    assert not out.ok and out.error_kind == "compile_error"
    assert out.log.startswith('cuda_sources[0](9): error: expected a ";"'), out.log
    module = out.timings["modules"][0]
    assert module["header_mode"] == "light_failed_exact"  # the verdict comes from the exact build


def test_a_source_the_lean_headers_do_not_serve_is_rebuilt_with_all_of_them(compile_pool):
    """A name that only ATen/Context.h declares (the lean operator headers leave it out): the light build fails on
    our account, the exact build is the verdict (ok), never a compile error of the candidate's."""
    task_source, code = candidate_pair("add")
    needs_context = code.replace("torch::Tensor elementwise_add_cuda(",
                                 "int lean_gpus() { return (int)at::detail::getCUDAHooks().deviceCount(); }\n\n"
                                 "torch::Tensor elementwise_add_cuda(", 1)
    assert needs_context != code
    out = compile_pool.compile(task_source, needs_context)
    assert out.ok and out.error_kind is None, out.log
    assert out.timings["modules"][0]["header_mode"] == "light_failed_exact"


def test_config_validation():
    with pytest.raises(ValueError):
        CompileConfig(workers=0)
    with pytest.raises(ValueError):
        CompileConfig(pch="maybe")
    with pytest.raises(ValueError, match="bad CUDA arch"):
        CompileConfig(arch="hopper")
    with pytest.raises(TypeError):
        CompileConfig(unknown_field=1)


def test_runtime_builder_finds_the_compile_stage_build(built_add, shared_dir, toolchain):
    """A build reached only at run time in the GPU worker is a cache hit when the compile stage built it."""
    from cuda_eval.worker.runtime_build import RuntimeBuilder
    spec = cand.ExtensionSpec.from_dict(built_add.specs[0])
    rb = RuntimeBuilder(str(shared_dir / "cache"), str(shared_dir / "rt"), toolchain=toolchain.to_dict())
    assert rb(spec) == built_add.modules[0].so_path and rb.builds == []
