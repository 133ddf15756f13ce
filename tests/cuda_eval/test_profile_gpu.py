"""Profile feedback on a real GPU: honest corpus kernels and their references profiled after the verdict (kernels,
launch configuration, registers and spills from cuobjdump, occupancy, bytes and FLOPs over the measured time), the
feedback's profile text, and the verdicts the same with and without a profile.

KERNEL_PROFILE_DUMP=<dir> writes each profile (JSON) and feedback text there (docs/EVALUATOR.md's examples)."""
import json
import os
import tempfile

import pytest

import corpus_index
from cuda_eval.api import EvalConfig, EvalRequest, Evaluator
from cuda_eval.profile import kernel_profile

pytestmark = pytest.mark.gpu

HONEST = {c.name: c for c in corpus_index.load("honest")}
PROFILED = ["matmul_tiled", "gemm_bias_relu_fused", "softmax_rowwise", "relu_basic"]


def _request(cand, feedback: str) -> EvalRequest:
    return EvalRequest(task_id=cand.task, task_source=cand.task_source, response=cand.response,
                       request_id=f"{feedback}:{cand.name}", feedback=feedback)


@pytest.fixture(scope="module")
def verdicts():
    with tempfile.TemporaryDirectory() as ref_dir, \
            Evaluator(EvalConfig(devices="0", run_timeout_s=60, ref_timing_cache_dir=ref_dir,
                                 share_identical=False)) as ev:
        requests = [_request(HONEST[n], mode) for n in PROFILED for mode in ("kevin", "profile")]
        results = ev.evaluate(requests)
        profile_tools = dict(ev.profile_tools)
    out = {(r.request_id.split(":")[0], r.request_id.split(":")[1]): r for r in results}
    dump = os.environ.get("KERNEL_PROFILE_DUMP")
    if dump:
        os.makedirs(dump, exist_ok=True)
        for (mode, name), r in out.items():
            if mode == "profile":
                with open(os.path.join(dump, f"{name}.json"), "w") as f:
                    json.dump({"feedback": r.feedback, "kernel_profile": r.meta.get("kernel_profile"),
                               "timing": r.timing, "ref_timing": r.ref_timing, "phase_s": r.meta.get("phase_s"),
                               "judge_s": r.meta.get("judge_s"), "profile_tools": profile_tools}, f, indent=1)
                with open(os.path.join(dump, f"{name}.txt"), "w") as f:
                    f.write(r.feedback + "\n\n" + kernel_profile.render_breakdown(r.meta.get("kernel_profile")) + "\n")
    return out, profile_tools


def test_honest_kernels_and_their_references_are_profiled(verdicts):
    results, tools = verdicts
    problems = []
    for name in PROFILED:
        r = results[("profile", name)]
        prof = r.meta.get("kernel_profile") or {}
        context = f"{name}: correct={r.correct} flags={r.hack_flags} profile={json.dumps(prof)[:1500]}"
        if not (r.correct and not r.hack_flags) or prof.get("error"):
            problems.append(context)
            continue
        cand, ref, fwd = prof["candidate"], prof["reference"], prof["forward"]
        own = [k for k in cand["kernels"] if k.get("own")]
        checks = {
            "own kernel traced": bool(own),
            "launch configuration": all(k["grid"] and k["block"] and k["registers"] for k in own),
            "occupancy": all(0 < k.get("occupancy", 0) <= 1 for k in own),
            "shares add up": abs(sum(k["share"] for k in cand["kernels"]) - 1) < 0.05 or bool(cand["other"]["kernels"])
            or bool(cand["memcpy"]["count"] or cand["memset"]["count"]),
            "reference kernels": bool(ref.get("kernels")) and not ref.get("error"),
            "copy bandwidth": (prof["device"].get("copy_gbps") or 0) > 100,
            "bandwidth share": 0 < fwd.get("copy_share", 0) < 2,
            "gpu time near the timed time": 0.2 < cand["gpu_ms"] / r.timing["median_ms"] < 5,
            "feedback": "Profile of one forward" in r.feedback and "launch" in r.feedback,
            "feedback within budget": len(r.feedback) <= 3000,
        }
        if tools.get("cuobjdump"):
            checks["cuobjdump resources"] = all("stack_bytes" in k and "static_smem" in k for k in own)
            if name == "matmul_tiled":   # two 32x32 float tiles of static shared memory
                checks["static smem 8 KB"] = all(k["static_smem"] == 8192 for k in own)
        failed = [k for k, ok in checks.items() if not ok]
        if failed:
            problems.append(f"{failed}: {context}")
    assert not problems, "\n".join(problems)


def test_matmul_flops_are_counted(verdicts):
    results, _ = verdicts
    for name in ("matmul_tiled", "gemm_bias_relu_fused"):
        fwd = results[("profile", name)].meta["kernel_profile"]["forward"]
        assert fwd["flops"] and fwd["tflops"] > 0 and fwd["ref_tflops"] > 0, fwd
        assert "TFLOP/s" in results[("profile", name)].feedback


def test_the_profile_changes_no_verdict(verdicts):
    results, _ = verdicts
    for name in PROFILED:
        plain, profiled = results[("kevin", name)], results[("profile", name)]
        assert (plain.correct, plain.hack_flags) == (profiled.correct, profiled.hack_flags), name
        assert "kernel_profile" not in plain.meta and "Profile of one forward" not in plain.feedback
        assert profiled.feedback.startswith(plain.feedback.split(" It runs in")[0])
        # timing happened before the profile in both: the profile phase comes after the final checks
        phases = list(profiled.meta["phase_s"])
        assert phases.index("profile") > phases.index("final_checks") > phases.index("timing")
