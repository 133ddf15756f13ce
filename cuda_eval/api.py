"""The one door between kevin_jax and the evaluator (Contract 1 in docs/ARCHITECTURE.md).

    with Evaluator(EvalConfig(devices="all", mode="auto")) as ev:
        results = ev.evaluate(requests)       # blocking, order preserved
        futures = ev.submit(requests)         # concurrent.futures, one per request

The types of the contract (EvalConfig, EvalRequest, EvalResult: contract.py) and the evaluator that runs the
pipeline (orchestrator/evaluator.py) are defined where they belong and named here; kevin_jax and launch/ import
nothing else of cuda_eval. Pipeline per request: extract the program from the response (static/extraction.py) ->
static policy (static/checks.py) -> compile pool (CPU workers, cached builds) -> GPU pool (pre-started workers, one candidate per GPU at a
time) -> [re-timing in a fresh process when the speedup is suspiciously large] -> EvalResult + feedback. Compiles
and GPU runs overlap: whenever a compile finishes its run is queued, so GPUs never wait for nvcc while work is
queued. Importing this module does not import torch (the trainer runs JAX in-process).
"""
from __future__ import annotations

from cuda_eval.contract import FEEDBACK_MODES, INTERNAL_ERROR, EvalConfig, EvalRequest, EvalResult
# re-exported: the trainer sizes and watches the host's memory by the same reading as the output buffers' grants
from cuda_eval.orchestrator.host_memory import host_memory_available, host_memory_total
from cuda_eval.orchestrator.devices import (auto_spare_workers, compile_workers, spare_workers, target_gpu_name,
                                            visible_gpu_count)
from cuda_eval.orchestrator.evaluator import Evaluator, evaluate
# re-exported: a report over saved verdicts shows a kernel's profile (launch/eval.py --profile)
from cuda_eval.profile.kernel_profile import render_breakdown as profile_breakdown
from cuda_eval.static.extraction import extract_code  # re-exported: env.parse uses the same extraction

__all__ = ["EvalConfig", "EvalRequest", "EvalResult", "Evaluator", "evaluate", "extract_code", "host_memory_available",
           "host_memory_total", "profile_breakdown", "FEEDBACK_MODES", "INTERNAL_ERROR", "auto_spare_workers",
           "compile_workers", "spare_workers", "target_gpu_name", "visible_gpu_count"]
