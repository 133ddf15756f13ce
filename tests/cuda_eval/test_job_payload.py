"""The job payload (protocol/job.py): built from EvalConfig alone, plain JSON on the wire, and read back by the judge
and the worker only when every field is there with its type (no reader falls back to a default of its own)."""
import dataclasses
import json

import pytest

from cuda_eval.api import EvalConfig
from cuda_eval.orchestrator.evaluator import job_config
from cuda_eval.protocol.job import JobConfig, JobPayload, PayloadError, RuntimeBuild


def payload(**config) -> JobPayload:
    settings = job_config(EvalConfig(**config), kernel_profile=False, profile_tools={"cuobjdump": None})
    return JobPayload(kind="evaluate", task_source="class Model: ...", code="class ModelNew: ...", modules=[],
                      kernel_names=["k"], runtime_build=RuntimeBuild(toolchain={"nvcc": "x"}, cache_dir=None,
                                                                     timeout_s=60.0),
                      ref_timing_cache={}, config=settings)


def test_a_payload_round_trips_through_json():
    p = payload(num_correct_trials=3, timing_method="kernelbench", profile="strict")
    again = JobPayload.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p and again.config.num_trials == 3 and again.config.timing.method == "kernelbench"
    assert isinstance(again.config, JobConfig) and isinstance(again.runtime_build, RuntimeBuild)
    assert again.config.strict_fp32 == 1e-4 and payload().config.strict_fp32 is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        again.config.seed = 1


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["config"].pop("seed"), "missing fields ['seed']"),
    (lambda d: d["config"]["dynamic"].update(surprise=True), "unknown fields ['surprise']"),
    (lambda d: d["config"].update(num_trials="5"), "config.num_trials: expected int"),
    (lambda d: d["config"].update(atol=True), "config.atol: expected float"),
    (lambda d: d["config"]["timing"].update(method="stopwatch"), "config.timing.method"),
    (lambda d: d.update(kind="guess"), "payload.kind"),
    (lambda d: d.update(code=None), "payload.code"),
    (lambda d: d.update(kernel_names=[1]), "payload.kernel_names"),
    (lambda d: d["runtime_build"].update(path_map=[["/real"]]), "runtime_build.path_map"),
])
def test_a_malformed_payload_is_refused(edit, message):
    data = json.loads(json.dumps(payload().to_dict()))
    edit(data)
    with pytest.raises(PayloadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        JobPayload.from_dict(data)


def test_a_reference_job_has_no_code():
    data = payload().to_dict()
    data.update(kind="reference", code=None)
    assert JobPayload.from_dict(data).code is None
