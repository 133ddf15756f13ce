"""Evaluation profiles (orchestrator/scoring.py): named sets of EvalConfig fields, KernelBench's static rules, and
flags that are advisory under the kernelbench profile but zero the score under kevin. The pipeline runs with the
pool fakes of test_api (CompilePoolFake, GpuPoolFake): these tests are about the verdict's assembly."""
import dataclasses

import pytest

from cuda_eval.orchestrator import scoring
from cuda_eval.api import EvalConfig, EvalRequest
from cuda_eval.static import checks
from test_api import make_evaluator, outcome, response, worker_result

TORCH_IN_FORWARD = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#include <torch/extension.h>
__global__ void bias_relu_kernel(float* y, const float* b, long n, long c) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(y[i] + b[i % c], 0.f);   // the fused epilogue; the GEMM stays cuBLAS
}
torch::Tensor bias_relu(torch::Tensor y, torch::Tensor b) {
    long n = y.numel();
    bias_relu_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), b.data_ptr<float>(), n, b.numel());
    return y;
}
"""
ext = load_inline(name="bias_relu", cpp_sources="torch::Tensor bias_relu(torch::Tensor y, torch::Tensor b);",
                  cuda_sources=src, functions=["bias_relu"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features))
        self.bias = nn.Parameter(torch.randn(out_features))

    def forward(self, x):
        return ext.bias_relu(torch.matmul(x, self.weight.t()), self.bias)
'''

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return [16, 32]
'''


def test_kevin_is_the_defaults_and_each_profile_sets_its_fields():
    assert dataclasses.asdict(EvalConfig(profile="kevin")) == dataclasses.asdict(EvalConfig())
    kb = EvalConfig(profile="kernelbench")
    assert (kb.static_policy, kb.strict, kb.num_correct_trials, kb.timing_method, kb.retime_speedup_threshold) == \
        ("kernelbench", True, 5, "kernelbench", 0.0)
    strict = EvalConfig(profile="strict")
    assert strict.strict and strict.flag_native_threads and strict.static_policy == "auto"
    for name, profile in scoring.PROFILES.items():
        cfg = EvalConfig(profile=name)
        assert all(getattr(cfg, k) == v for k, v in profile.settings.items())
        assert dataclasses.replace(cfg) == cfg       # re-validation keeps the profile's own values


def test_a_field_set_against_the_profile_or_an_unknown_profile_is_an_error():
    with pytest.raises(ValueError, match="num_correct_trials=3 conflicts with profile 'kernelbench'"):
        EvalConfig(profile="kernelbench", num_correct_trials=3)
    with pytest.raises(ValueError, match="unknown evaluation profile 'leaderboard'"):
        EvalConfig(profile="leaderboard")
    assert EvalConfig(profile="kernelbench", atol=0.05).atol == 0.05   # fields outside the profile stay free


def test_kernelbench_static_rules_add_the_pass_rule():
    bypass = "import torch\nfrom ref import Model\n\nclass ModelNew(Model):\n    pass\n"
    kb = {f.code for f in checks.static_check(bypass, checks.StaticPolicy.named("kernelbench"))}
    kevin = {f.code for f in checks.static_check(bypass, checks.StaticPolicy.named("kevin"))}
    assert "pass_statement" in kb and "pass_statement" not in kevin
    # as KernelBench reads it: `#` and `//` start comments (also inside C++ source strings); words containing
    # "pass" do not count
    commented = 'x = 1  # pass\nsrc = """\n// pass the pointer\nint passed = 0;\n"""\n'
    assert not [f for f in checks.static_check(commented, checks.StaticPolicy.named("kernelbench"))
                if f.code == "pass_statement"]
    assert [f for f in checks.static_check("bypassed = 0\nif bypassed:\n    pass\n",
                                           checks.StaticPolicy.named("kernelbench")) if f.code == "pass_statement"]


def test_split_flags():
    flags = [{"code": "try_except", "reason": "a"}, {"code": "library_heavy_op", "reason": "b"}]
    assert scoring.split_flags(flags, "kevin") == (flags, [])
    rejecting, advisory = scoring.split_flags(flags, "kernelbench")
    assert rejecting == flags[:1]
    assert advisory == [{"code": "library_heavy_op", "reason": "b", "note": "would be rejected under kevin"}]


def _judge(profile, tmp_path, code=TORCH_IN_FORWARD, flags=()):
    ev = make_evaluator(lambda p: outcome(worker_result(flags=list(flags))), tmp_path, profile=profile)
    try:
        return ev.evaluate([EvalRequest("L2/gemm_bias_relu", TASK, response(code), "r")])[0], ev
    finally:
        ev.close()


def test_a_leaderboard_style_fusion_is_rejected_under_kevin_and_scored_under_kernelbench(tmp_path):
    """A cuBLAS GEMM kept in PyTorch next to a fused CUDA epilogue: Kevin's rules reject it before it runs;
    KernelBench's accept it, and our flags (static and dynamic) are reported as advisory."""
    dynamic = [{"code": "library_heavy_op", "reason": "forward ran aten::mm"}]
    kevin, ev = _judge("kevin", tmp_path / "kevin", flags=dynamic)
    assert kevin.correct is None and {f["code"] for f in kevin.hack_flags} == {"torch_in_forward"}
    assert not ev.gpu_pool.payloads and kevin.meta["profile"] == "kevin" and not kevin.advisory_flags

    kb, ev = _judge("kernelbench", tmp_path / "kb", flags=dynamic)
    assert ev.gpu_pool.payloads, "the kernelbench profile runs it"
    payload = ev.gpu_pool.payloads[0]
    assert payload["config"]["timing"]["method"] == "kernelbench" and payload["config"]["strict_fp32"] == 1e-4
    assert kb.correct and kb.hack_flags == [] and kb.speedup == pytest.approx(2.0)
    assert {f["code"] for f in kb.advisory_flags} == {"torch_in_forward", "library_heavy_op"}
    assert all(f["note"] == "would be rejected under kevin" for f in kb.advisory_flags)
    assert kb.meta["profile"] == "kernelbench"
    assert "Kevin's training rules would reject it" in kb.feedback


def test_what_kernelbench_rejects_stays_rejected(tmp_path):
    fallback = TORCH_IN_FORWARD.replace("        return ext.bias_relu(", "        try:\n            return ext.bias_relu(") \
        .rstrip() + "\n        except RuntimeError:\n            return torch.relu(x @ self.weight.t() + self.bias)\n"
    kb, ev = _judge("kernelbench", tmp_path, code=fallback)
    assert not ev.gpu_pool.payloads and kb.correct is None
    assert {f["code"] for f in kb.hack_flags} == {"try_except"}
    assert {f["code"] for f in kb.advisory_flags} == {"torch_in_forward"}
