"""The one door between kevin_jax and the evaluator (Contract 1 in docs/ARCHITECTURE.md).

    with Evaluator(EvalConfig(devices="all", mode="auto")) as ev:
        results = ev.evaluate(requests)       # blocking, order preserved
        futures = ev.submit(requests)         # concurrent.futures, one per request

The types of the contract (EvalConfig, EvalRequest, EvalResult: contract.py; they live there so that the evaluator
can use them without importing this door, which names it) and the evaluator that runs the pipeline
(orchestrator/evaluator.py, its module doc says how) are named here; kevin_jax and launch/ import nothing else of
cuda_eval. Importing this module does not import torch (the trainer runs JAX in-process).
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
