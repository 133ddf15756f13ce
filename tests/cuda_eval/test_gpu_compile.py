"""On a GPU: the native CUDA timer, and compiled candidates that actually run and match their references.

    python -m pytest -q -m gpu tests/cuda_eval/test_gpu_compile.py
"""
import re

import pytest

from cuda_eval import _native
from cuda_eval.worker import extension_loader as loader
from sandbox_fixtures import (built_add, candidate_pair, compile_pool, run_lock, sandbox_tmp, shared_dir,  # noqa: F401
                              toolchain)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch_cuda():
    import torch
    torch.cuda.init()
    return torch


def test_timer_uses_torchs_cudart_and_reads_the_device(torch_cuda):
    torch = torch_cuda
    maps = open("/proc/self/maps").read()
    if "libcudart" in maps:  # torch's own runtime is reused (a statically linked one would not show up here)
        assert _native.find_cudart() in maps
    props = _native.device_properties()
    assert props["name"] == torch.cuda.get_device_name() and props["sm_count"] > 0
    assert props["l2_cache_bytes"] > (1 << 20) and (props["major"], props["minor"]) == torch.cuda.get_device_capability()


def test_timer_measures_kernels(torch_cuda):
    torch = torch_cuda
    a = torch.randn(4096, 4096, device="cuda")
    timer = _native.CudaTimer(None)
    times = timer.time(lambda: a @ a, warmup=3, reps=10)
    assert len(times) == 10 and all(t > 0 for t in times)
    flops = 2 * 4096 ** 3
    assert flops / (min(times) / 1e3) < 2e15  # no faster than any existing GPU
    small = timer.time(lambda: a[:16] @ a[:, :16], warmup=3, reps=10)
    assert sorted(small)[5] < sorted(times)[5]


def test_timer_includes_side_stream_work(torch_cuda):
    """sync_device=True: work left running on another stream is inside the measurement."""
    torch = torch_cuda
    side = torch.cuda.Stream()
    cycles = 50_000_000  # ~25 ms at 2 GHz

    def sneaky():
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)

    timer = _native.CudaTimer(None)
    honest = timer.time(sneaky, warmup=1, reps=5, sync_device=True)
    fooled = timer.time(sneaky, warmup=1, reps=5, sync_device=False)
    assert min(honest) > 10.0
    assert max(fooled) < min(honest) / 2


def test_timer_propagates_python_errors(torch_cuda):
    timer = _native.CudaTimer(None)

    def boom():
        raise ValueError("from the timed function")
    with pytest.raises(ValueError, match="from the timed function"):
        timer.time(boom, warmup=0, reps=1)


RUN_ON_GPU = ["add", "softmax", "matmul", "conv_bias_relu", "swish", "scale_clamp", "leaky_relu_stream",
              "hardtanh_init", "argmax", "mse_loss", "layernorm", "tanh_vec4"]


@pytest.fixture(scope="module")
def compiled(compile_pool):
    """All of them at once (the pool has a worker per core)."""
    futures = {name: compile_pool.submit(*candidate_pair(name)) for name in RUN_ON_GPU}
    return {name: f.result() for name, f in futures.items()}


@pytest.mark.nvcc
@pytest.mark.parametrize("name", RUN_ON_GPU)
def test_benchmark_candidates_compile_run_and_match(torch_cuda, compiled, name):
    torch = torch_cuda
    task_source, code = candidate_pair(name)
    out = compiled[name]
    assert out.ok, out.log
    print(f"{name}: compiled in {out.timings['wall_s']:.1f} s, header {out.modules[0].header_mode}")
    task = {"__name__": f"task_{name}"}
    exec(compile(task_source, "task.py", "exec"), task)
    with loader.install_prebuilt([m.to_dict() for m in out.modules]):
        ns = {"__name__": f"cand_{name}"}
        exec(compile(code, "candidate.py", "exec"), ns)
        init = task["get_init_inputs"]()
        torch.manual_seed(0)
        ref = task["Model"](*init).cuda()
        torch.manual_seed(0)
        new = ns["ModelNew"](*init).cuda()
    torch.manual_seed(1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task["get_inputs"]()]
    with torch.no_grad():
        expected, got = ref(*inputs), new(*inputs)
    torch.cuda.synchronize()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert torch.allclose(got.float(), expected.float(), atol=1e-2, rtol=1e-2), (got - expected).abs().max()


@pytest.mark.nvcc
def test_arch_auto_is_the_gpus(torch_cuda, shared_dir):
    from cuda_eval.compile import toolchain as tc
    major, minor = torch_cuda.cuda.get_device_capability()
    assert tc.detect("auto", cache_dir=str(shared_dir / "cache")).arch == f"sm_{major}{minor}"
    assert re.fullmatch(r"sm_\d+", tc.gpu_arch())


def test_a_sandboxed_process_can_use_the_gpu(sandbox_tmp):
    """The GPU stage runs candidates under a sandbox uid: the device nodes must be usable by it."""
    import sys
    from cuda_eval.sandbox import runner as sb
    code = "import torch; x = torch.ones(4, device='cuda'); print(float(x.sum()), torch.cuda.get_device_name())"
    limits = sb.SandboxLimits(address_space_bytes=None, wall_timeout_s=180, processes=2048)
    res = sb.run_sandboxed([sys.executable, "-c", code], str(sandbox_tmp / "w"), limits)
    assert res["exit_code"] == 0 and res["stdout"].startswith(b"4.0 "), res["stderr"][-2000:]
    print(f"sandbox uid {res['uid']}: {res['stdout'].decode().strip()}, peak RSS {res['peak_rss_bytes'] >> 20} MiB")
