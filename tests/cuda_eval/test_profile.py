"""Profile feedback's plain-data half (cuda_eval/profile/kernel_profile.py) and the feedback text: occupancy against
CUDA's own calculator, cuobjdump's resource usage (recorded, and from a real nvcc build when cuobjdump is there), kernel
names, the profiler's trace, sanitising what a worker sends, and the texts rendered from recorded profiles."""
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cuda_eval.orchestrator import feedback
from cuda_eval.api import EvalRequest, EvalResult
from cuda_eval.profile import kernel_profile as kp

DATA = Path(__file__).parent / "data"
PROFILES = {p.stem: json.loads(p.read_text()) for p in sorted((DATA / "kernel_profiles").glob("*.json"))}
H100 = kp.DeviceLimits.for_capability(9, 0, sm_count=132)
ORACLE_DEVICES = {(9, 0): (2048, 233472, 232448), (8, 0): (2048, 167936, 166912), (8, 6): (1536, 102400, 101376),
                  (8, 9): (1536, 102400, 101376), (7, 0): (2048, 98304, 98304), (10, 0): (2048, 233472, 232448),
                  (12, 0): (1536, 102400, 101376)}


# --- occupancy ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block,regs,smem,blocks,occ,limiter", [
    # values of CUDA's occupancy calculator (cuda_occupancy.h) for an H100 (sm_90: 64 warps, 32 blocks, 64K
    # registers, 228 KB of shared memory per SM, 1 KB reserved per block)
    (256, 32, 0, 8, 1.0, None),                     # 8 blocks x 8 warps: every warp slot
    (128, 96, 0, 5, 0.3125, "registers"),           # 96 x 32 = 3072 registers a warp: 5 warps a sub-partition
    (1024, 64, 0, 1, 0.5, "registers"),             # 2048 registers a warp x 32 warps = the whole file
    (128, 32, 48 << 10, 4, 0.25, "shared memory"),  # 49 KB per block: 4 fit in 228 KB
    (256, 255, 0, 1, 0.125, "registers"),
    (64, 40, 4224, 24, 0.75, "registers"),          # 1280 registers a warp: 12 warps a sub-partition
    (32, 16, 0, 32, 0.5, "blocks"),                 # 32 blocks of one warp: the block limit
    (1024, 65, 0, 0, 0.0, "registers"),             # does not fit at all
])
def test_occupancy_known_values(block, regs, smem, blocks, occ, limiter):
    got = kp.occupancy(H100, block, regs, smem, 0)
    assert got["blocks_per_sm"] == blocks and math.isclose(got["occupancy"], occ)
    if limiter:
        assert got["limited_by"] == limiter


def _oracle_rows(path):
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("ERR"):
            yield tuple(int(x) for x in line.split())


def _check_oracle(rows) -> list:
    bad = []
    for major, minor, block, regs, smem_static, smem_dynamic, want in rows:
        threads, smem_sm, optin = ORACLE_DEVICES[(major, minor)]
        limits = kp.DeviceLimits.for_capability(major, minor, max_threads_per_sm=threads, smem_per_sm=smem_sm,
                                                smem_per_block_optin=optin, smem_per_block=49152)
        got = kp.occupancy(limits, block, regs, smem_static, smem_dynamic)["blocks_per_sm"]
        if got != want:
            bad.append((major, minor, block, regs, smem_static, smem_dynamic, want, got))
    return bad


def test_occupancy_matches_cudas_calculator_on_recorded_cases():
    """tests/cuda_eval/data/occupancy_oracle_sample.txt: cudaOccMaxActiveBlocksPerMultiprocessor's answers (CUDA
    13.0's cuda_occupancy.h, compiled from data/occupancy_oracle.cpp) for 7 architectures, every 37th case of the
    sweep below."""
    rows = list(_oracle_rows(DATA / "occupancy_oracle_sample.txt"))
    assert len(rows) > 250
    assert _check_oracle(rows) == []


def test_occupancy_matches_cudas_calculator_on_the_whole_sweep(tmp_path):
    """The same sweep (11k cases: block sizes, registers, static + dynamic shared memory, sm_70..sm_120) against
    cuda_occupancy.h itself, compiled here when the CUDA headers and a C++ compiler are present."""
    header = next((p for p in ("/usr/local/cuda/include/cuda_occupancy.h",
                               os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "include",
                                            "cuda_occupancy.h")) if os.path.isfile(p)), None)
    cxx = shutil.which("g++") or shutil.which("c++")
    if header is None or cxx is None:
        pytest.skip("needs cuda_occupancy.h and a C++ compiler")
    exe = tmp_path / "oracle"
    subprocess.run([cxx, "-std=c++17", f"-I{os.path.dirname(header)}", str(DATA / "occupancy_oracle.cpp"), "-o",
                    str(exe)], check=True, capture_output=True, timeout=300)
    out = tmp_path / "table.txt"
    out.write_text(subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=120).stdout)
    rows = list(_oracle_rows(out))
    assert len(rows) > 10000
    assert _check_oracle(rows) == []


def test_device_limits_from_the_device_properties_override_the_table():
    limits = kp.DeviceLimits.for_capability(8, 6, sm_count=84, smem_per_sm=None)
    assert (limits.max_threads_per_sm, limits.smem_per_sm, limits.max_blocks_per_sm) == (1536, 100 << 10, 16)
    assert kp.DeviceLimits.from_dict(limits.to_dict()) == limits


# --- resource usage (cuobjdump -res-usage) ----------------------------------------------------------------------
def test_parse_recorded_res_usage():
    """data/cuobjdump_res_usage_sm80_90_100.txt: cuobjdump 13 on data/res_usage_kernels.cu built for sm_80, sm_90
    and sm_100 (ptxas -v said: tiled_kernel<16> 1088 and <32> 4224 bytes of smem, spill_kernel a 256-byte stack
    frame, add_kernel 12 registers on sm_90)."""
    text = (DATA / "cuobjdump_res_usage_sm80_90_100.txt").read_text()
    per_arch = kp.parse_res_usage(text)
    assert set(per_arch) == {80, 90, 100}
    assert per_arch[90]["_Z10add_kernelPKfS0_Pfi"] == {"registers": 12, "stack": 0, "shared": 0, "local": 0}
    assert per_arch[80]["_Z12tiled_kernelILi16EEvPKfPfi"]["shared"] == 1088        # sm_80: ptxas's value
    assert per_arch[90]["_Z12tiled_kernelILi16EEvPKfPfi"]["shared"] == 2112        # sm_90: + the 1 KB reserved
    res = kp.resource_usage(text, (9, 0))
    assert {e["static_smem"] for e in res["tiled_kernel"]} == {1088, 4224}         # what ptxas reported
    assert res["spill_kernel"][0]["stack_bytes"] == 256
    assert res["inner_kernel"][0]["mangled"] == "_ZN2ns12inner_kernelEPd" and "c_kernel" in res
    assert all(e["sm"] == 90 for entries in res.values() for e in entries)
    assert kp.resource_usage(text, (8, 6))["tiled_kernel"][0]["sm"] == 80          # the newest ELF it can run
    assert kp.resource_usage("", (9, 0)) == {}


@pytest.mark.nvcc
def test_res_usage_of_a_real_build(tmp_path):
    """A shared library built here with nvcc for sm_90, read by the cuobjdump the evaluator would use."""
    from cuda_eval.profile import kernel_profiler
    cuobjdump = kp.find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("no cuobjdump (CUDA's bin/, PATH, or the nvidia-cuda-cuobjdump package)")
    so = tmp_path / "k.so"
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-Xptxas", "-v",
                    str(DATA / "res_usage_kernels.cu"), "-o", str(so)], check=True, capture_output=True, timeout=600)
    res, why = kernel_profiler.finish_cuobjdump(kernel_profiler.start_cuobjdump(cuobjdump, [str(so)]), (9, 0))
    assert why is None, why
    assert {e["static_smem"] for e in res["tiled_kernel"]} == {1088, 4224}
    assert res["spill_kernel"][0]["stack_bytes"] == 256 and res["add_kernel"][0]["registers"] > 0
    assert kernel_profiler.finish_cuobjdump(kernel_profiler.start_cuobjdump(None, [str(so)]), (9, 0))[1]


@pytest.mark.parametrize("name,base", [
    ("_Z10add_kernelPKfS0_Pfi", "add_kernel"), ("_ZN2ns12inner_kernelEPd", "inner_kernel"),
    ("_Z12tiled_kernelILi32EEvPKfPfi", "tiled_kernel"), ("c_kernel", "c_kernel"),
    ("_ZN12_GLOBAL__N_110foo_kernelEPf", "foo_kernel"), ("_ZL10static_kerPf", "static_ker"),
    ("add_kernel(float const*, float const*, float*, int)", "add_kernel"),
    ("void tiled_kernel<32>(float const*, float*, int)", "tiled_kernel"),
    ("void ns::inner_kernel(double*)", "inner_kernel"), ("(anonymous namespace)::foo_kernel(float*)", "foo_kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "vectorized_elementwise_kernel"),
])
def test_kernel_base_names_match_mangled_and_demangled(name, base):
    assert kp.base_name(name) == base


def test_short_names():
    assert kp.short_name("void tiled_kernel<32>(float const*, float*, int)") == "tiled_kernel<32>"
    long = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int)"
    assert kp.short_name(long) == "at::native::vectorized_elementwise_kernel<...>"
    assert len(kp.short_name("x" * 300)) == 48


# --- the trace ----------------------------------------------------------------------------------------------------
def _ev(name, ts, dur, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_parse_trace_keeps_what_runs_between_the_markers():
    spin = "at::cuda::(anonymous namespace)::spin_kernel(long)"
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<unsigned char> >(int)"
    events = [_ev(spin, 0, 1000)]                                                        # the gate
    for i in range(2):
        t = 1000 + i * 100
        events += [_ev(fill, t, 20, grid=[9999, 1, 1], block=[128, 1, 1]),               # the L2 flush: outside
                   _ev(spin, t + 20, 1), _ev("gemm(float*)", t + 22, 30, grid=[64, 64, 1], block=[128, 1, 1],
                                              **{"registers per thread": 96, "shared memory": 4096}),
                   _ev("Memset (Device)", t + 53, 1, cat="gpu_memset"),
                   _ev("bias(float*)", t + 55, 10, grid=[1024, 1, 1], block=[256, 1, 1],
                       **{"registers per thread": 16, "shared memory": 0}),
                   _ev(spin, t + 70, 1)]
    events.append({"ph": "s", "cat": "ac2g", "name": "flow", "ts": 5})                   # not a duration event
    side = kp.parse_trace(events, forwards=2, gated=True)
    assert side["launches"] == 2 and [k["name"] for k in side["kernels"]] == ["gemm(float*)", "bias(float*)"]
    gemm = side["kernels"][0]
    assert math.isclose(gemm["ms"], 0.030) and gemm["grid"] == [64, 64, 1] and gemm["registers"] == 96
    assert side["memset"] == {"count": 1.0, "ms": 0.001}
    assert math.isclose(side["gpu_ms"], 0.041) and math.isclose(side["span_ms"], 0.049)
    with pytest.raises(ValueError, match="marker"):
        kp.parse_trace(events, forwards=3, gated=True)


# --- what a worker sends is sanitised -------------------------------------------------------------------------------
def test_sanitize_bounds_a_hostile_profile():
    raw = {"forwards": 1e9, "launches": float("nan"), "gpu_ms": -5, "kernels": [
        {"name": "k\x1b[31m" + "x" * 10_000, "ms": float("inf"), "grid": [1, 2, 3, 4, "x"], "block": "no",
         "registers": 10 ** 9, "smem_bytes": True},
        "junk", {"name": {"nested": ["deep"]}}] * 50, "memcpy": "no", "extra": {"x" * 100: 1}}
    side = kp.sanitize_side(raw)
    assert side["forwards"] == 1000 and side["launches"] == 0.0 and side["gpu_ms"] == 0.0
    assert len(side["kernels"]) <= kp.PROFILE_MAX_KERNELS
    k = side["kernels"][0]
    assert len(k["name"]) == 300 and "\x1b" not in k["name"]
    assert k["ms"] == 0.0 and k["grid"] == [1, 2, 3] and k["block"] == [] and k["registers"] == 1024
    assert k["smem_bytes"] is None and "extra" not in side
    assert kp.sanitize_side({"error": "boom\n" * 1000})["error"].count("?") > 0
    assert kp.sanitize_resources({"k": [{"registers": "x", "stack_bytes": -1}], "bad": "no"}) == {
        "k": [{"mangled": "", "registers": 0, "stack_bytes": 0, "static_smem": 0}]}
    with pytest.raises(ValueError):
        kp.sanitize_side("not a dict")


def test_annotate_matches_resources_by_name_and_registers():
    side = {"gpu_ms": 1.0, "kernels": [
        {"name": "void tiled_kernel<32>(float const*, float*, int)", "ms": 0.75, "grid": [8], "block": [1024],
         "smem_bytes": 4224 + 2048, "registers": 13},
        {"name": "void at::native::fill_kernel(float*)", "ms": 0.25, "grid": [8], "block": [128], "smem_bytes": 0,
         "registers": 16}]}
    res = {"tiled_kernel": [{"mangled": "a", "registers": 12, "stack_bytes": 0, "static_smem": 1088},
                            {"mangled": "b", "registers": 13, "stack_bytes": 8, "static_smem": 4224}]}
    kp.annotate(side, H100, res, ["tiled_kernel"])
    tiled, fill = side["kernels"]
    assert tiled["own"] and tiled["stack_bytes"] == 8 and tiled["static_smem"] == 4224 and tiled["dynamic_smem"] == 2048
    assert not fill["own"] and "stack_bytes" not in fill and fill["occupancy"] == 1.0
    assert tiled["occupancy"] == 1.0 and math.isclose(tiled["share"], 0.75)


def test_forward_summary():
    fwd = kp.forward_summary(time_ms=0.5, input_bytes=10**6, param_bytes=10**6, output_bytes=10**6, copy_gbps=3000.0,
                             flops=2e9, ref_time_ms=0.25)
    assert fwd["min_bytes"] == 3 * 10**6 and math.isclose(fwd["gbps"], 6.0) and math.isclose(fwd["copy_share"], 0.002)
    assert math.isclose(fwd["tflops"], 4.0) and math.isclose(fwd["ref_tflops"], 8.0)
    assert "gbps" not in kp.forward_summary(time_ms=None, input_bytes=1, param_bytes=0, output_bytes=1,
                                            copy_gbps=None, flops=None, ref_time_ms=None)


# --- texts from recorded profiles -----------------------------------------------------------------------------------
def _correct(profile=None, **kw) -> EvalResult:
    base = dict(request_id="r", task_id="matmul", mode="full", format_ok=True, code="...", compiled=True,
                correct=True, trials=[{"passed": True}] * 5, speedup=0.12, timing={"median_ms": 1.95},
                ref_timing={"median_ms": 0.231}, meta={"num_trials": 5})
    base.update(kw)
    if profile is not None:
        base["meta"] = dict(base["meta"], kernel_profile=profile)
    return EvalResult(**base)


def test_recorded_profiles_render():
    text = kp.render_feedback(PROFILES["matmul_tiled_h100"])
    assert text.splitlines()[0] == "Profile of one forward (GPU time per kernel):"
    assert "- yours: 1 launch, 1.91 ms of GPU time; 100% matmul_tiled_kernel (grid 32x32, 1024 threads, " \
           "38 registers, 0 B stack/spill, smem 8 KB static, 50% occupancy)" in text
    assert "- reference: 1 launch, 0.212 ms of GPU time; 100% sm90_xmma_gemm_f32f32_tf32f32" in text
    assert "in 1.95 ms = 6.45 GB/s, 0.2% of this GPU's 3 TB/s copy bandwidth" in text
    assert "= 1.1 TFLOP/s (the reference: 9.3 TFLOP/s)" in text
    fused = kp.render_feedback(PROFILES["gemm_fused_spills_h100"])
    assert "4 launches" in fused and "416 B stack/spill" in fused and "limited by registers" in fused
    assert "1 more kernel" in fused and "1 memset" in fused
    assert kp.render_feedback(PROFILES["candidate_failed"]) is None
    breakdown = kp.render_breakdown(PROFILES["gemm_fused_spills_h100"])
    assert "at::native::vectorized_elementwise_kernel<...>" in breakdown and breakdown.count("\n") >= 6


@pytest.mark.parametrize("budget", [900, 600, 400, 250, 120])
def test_profile_text_fits_its_budget(budget):
    for name, profile in PROFILES.items():
        text = kp.render_feedback(profile, budget)
        assert text is None or len(text) <= budget, (name, budget, text)


def test_feedback_profile_mode_adds_the_profile_to_the_correct_branch_only():
    plain = feedback.render(_correct(PROFILES["matmul_tiled_h100"]))
    profiled = feedback.render(_correct(PROFILES["matmul_tiled_h100"]), mode="profile")
    assert "Profile" not in plain and profiled.startswith(plain + "\n") and "matmul_tiled_kernel" in profiled
    assert len(profiled) <= 3000 and len(feedback.render(_correct(PROFILES["gemm_fused_spills_h100"]), 700,
                                                        mode="profile")) <= 700
    wrong = _correct(PROFILES["matmul_tiled_h100"], correct=False, trials=[{"passed": False, "trial": 0}])
    assert "Profile" not in feedback.render(wrong, mode="profile")
    flagged = _correct(PROFILES["matmul_tiled_h100"], hack_flags=[{"code": "x", "reason": "y"}])
    assert "Profile" not in feedback.render(flagged, mode="profile")


def test_profile_failure_gives_the_kevin_text_and_a_reason():
    for profile in (PROFILES["candidate_failed"], None, {"version": 1, "candidate": {"error": "x"}}):
        r = _correct(profile)
        assert feedback.render(r, mode="profile") == feedback.render(r)
        assert feedback.profile_unavailable(r)
    assert "peer closed" in feedback.profile_unavailable(_correct(PROFILES["candidate_failed"]))
    assert feedback.profile_unavailable(_correct(PROFILES["matmul_tiled_h100"])) is None


def test_feedback_mode_is_checked():
    with pytest.raises(ValueError, match="feedback"):
        EvalRequest("t", "src", "resp", feedback="verbose")


def test_best_kernel_report_for_launch_eval():
    """launch/eval.py --profile (kevin_jax.evaluation.report): per task, the breakdown of its fastest correct kernel,
    "correct" read from Turn.correct (well formed, correct, unflagged) as the reward reads it."""
    from kevin_jax.env.trajectory import Trajectory, Turn
    from kevin_jax.evaluation.report import best_kernel_report

    def turn(k, speedup, profile, correct=True, flags=(), format_error=None):
        return Turn(k, [1], [2], [0.0], "stop", "", {"format_error": format_error},
                    {"correct": correct, "speedup": speedup, "hack_flags": list(flags),
                     "timing": {"median_ms": 1.0}, "meta": {"kernel_profile": profile}})
    trajectories = [
        Trajectory("L1/matmul", 0, 0, 0, [turn(0, 0.1, PROFILES["matmul_tiled_h100"]),
                                          turn(1, 9.0, None, flags=[{"code": "x"}]),
                                          turn(2, 8.0, None, format_error="no code block")]),
        Trajectory("L1/matmul", 1, 0, 0, [turn(0, 0.5, PROFILES["gemm_fused_spills_h100"])]),
        Trajectory("L2/none", 0, 0, 0, [turn(0, None, None, correct=False)]),
        Trajectory("L2/old", 0, 0, 0, [turn(0, 2.0, None)])]
    text = best_kernel_report(trajectories)
    matmul, none, old = text.split("\n\n")
    assert matmul.startswith("L1/matmul: best kernel 0.50x (trajectory 1, turn 0, 1 ms)")
    assert "gemm_bias_relu_kernel<64, 64, 8>" in matmul and "reference: 2 launches" in matmul
    assert none == "L2/none: no correct kernel"
    assert old.endswith("no profile")


def test_launch_eval_writes_the_profile_report(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("launch_eval_for_test", Path(__file__).parents[2] / "launch" / "eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    verdict = {"correct": True, "speedup": 0.12, "hack_flags": [], "timing": {"median_ms": 1.95},
               "meta": {"kernel_profile": PROFILES["matmul_tiled_h100"]}}
    from kevin_jax.env.trajectory import Trajectory, Turn, write_trajectories
    turn = Turn(turn=0, prompt_tokens=[1], response_tokens=[2], response_logprobs=[-0.5], stop_reason="stop",
                response_text="```cuda\n...\n```", parsed={"format_error": None}, verdict=verdict)
    write_trajectories(tmp_path / "trajectories.jsonl",
                       [Trajectory(task_id="L1/matmul", traj_index=0, step=0, seed=0, turns=[turn])])
    (tmp_path / "table.txt").write_text("the table\n")
    module._write_profile_report(str(tmp_path))
    report = (tmp_path / "kernel_profiles.txt").read_text()
    assert "L1/matmul: best kernel 0.12x" in report and "matmul_tiled_kernel" in report
    assert (tmp_path / "table.txt").read_text().startswith("the table\n") and report in (tmp_path / "table.txt").read_text()
