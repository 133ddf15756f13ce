"""Stage 1 recording: running a candidate on the CPU with load_inline intercepted (cuda_eval.worker.record)."""
import json
import os
import sys

import pytest

from cuda_eval.sandbox import runner as sb
from cuda_eval.worker import record
from sandbox_fixtures import sandbox_tmp  # noqa: F401 - fixture

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
    def forward(self, x):
        return self.linear(x)

FEATURES = 64
def get_inputs():
    return [torch.randn(8, FEATURES)]
def get_init_inputs():
    return [FEATURES]
"""

HEAD = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
"""


def run_record(tmp_path, code: str, task: str = TASK) -> dict:
    (tmp_path / "task.py").write_text(task)
    (tmp_path / "candidate.py").write_text(code)
    try:
        return record.record(str(tmp_path))
    finally:
        for name in (record.TASK_MODULE, record.CANDIDATE_MODULE):
            sys.modules.pop(name, None)


def test_import_time_load_inline(tmp_path):
    code = HEAD + """
ext = load_inline(name="at_import", cpp_sources=SRC, functions=["f"])
class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
    def forward(self, x):
        return ext.f(x)
"""
    r = run_record(tmp_path, code)
    assert r["ok"] and r["done"] and [s["name"] for s in r["specs"]] == ["at_import"]
    assert r["phases"]["import"]["ok"] and r["phases"]["construct"]["ok"]
    assert "only recorded" in r["phases"]["forward"]["error"]  # the probe called the recorded function
    on_disk = json.loads((tmp_path / record.RECORD_FILE).read_text())
    assert on_disk == r


def test_load_inline_in_init_is_recorded_on_meta_then_cpu(tmp_path):
    code = HEAD + """
class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        assert self.linear.weight.is_meta
        self.ext = load_inline(name="in_init", cpp_sources=SRC, functions=["f"])
        self.linear.cuda()  # fails on a CPU machine, after the build was recorded
    def forward(self, x):
        return self.ext.f(x)
"""
    r = run_record(tmp_path, code)
    assert r["ok"] and [s["name"] for s in r["specs"]] == ["in_init"]
    assert not r["phases"]["construct"]["ok"]


def test_load_inline_in_forward_is_recorded_by_the_probe(tmp_path):
    code = HEAD + """
class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ext = None
    def forward(self, x):
        if self.ext is None:
            self.ext = load_inline(name="lazy", cpp_sources=SRC, functions=["f"])
        return self.ext.f(x)
"""
    r = run_record(tmp_path, code)
    assert r["ok"] and [s["name"] for s in r["specs"]] == ["lazy"]


def test_failure_after_recording_keeps_the_specs(tmp_path):
    code = HEAD + """
ext = load_inline(name="before_error", cpp_sources=SRC, functions=["f"])
x = torch.zeros(3).cuda()   # CPU machine: raises here
class ModelNew(nn.Module):
    pass
"""
    r = run_record(tmp_path, code)
    assert r["ok"] and not r["phases"]["import"]["ok"] and r["specs"][0]["name"] == "before_error"


@pytest.mark.parametrize("code, kind, message", [
    ("class ModelNew(:\n  pass\n", "syntax", "SyntaxError"),
    ("import torch\nclass Model(torch.nn.Module):\n    pass\n", "no_model_new", "ModelNew"),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n",
     "no_load_inline", "load_inline"),
    (HEAD + "raise ValueError('broken at import')\nclass ModelNew(nn.Module):\n    pass\n", "record_error",
     "broken at import"),
    ("x = 1\n\0\nclass ModelNew: pass\n", "syntax", ""),
])
def test_verdicts(tmp_path, code, kind, message):
    r = run_record(tmp_path, code)
    assert not r["ok"] and r["error_kind"] == kind and message in r["error"]


def test_syntax_error_names_the_line(tmp_path):
    r = run_record(tmp_path, "import torch\n\ndef f(:\n    pass\nclass ModelNew: pass\n")
    assert r["error_kind"] == "syntax" and "line 3" in r["error"]


def test_traceback_shows_only_candidate_lines(tmp_path):
    code = HEAD + "def helper():\n    return 1 / 0\nhelper()\nclass ModelNew(nn.Module):\n    pass\n"
    r = run_record(tmp_path, code)
    err = r["phases"]["import"]["error"]
    assert "ZeroDivisionError" in err and "line" in err and "site-packages" not in err


def test_a_hang_after_recording_still_leaves_the_specs(sandbox_tmp):
    """Run as the compile pool does (sandboxed subprocess, timeout): record.json is written at each build."""
    work = sandbox_tmp / "rec"
    work.mkdir()
    (work / "task.py").write_text(TASK)
    (work / "candidate.py").write_text(HEAD + "ext = load_inline(name='then_hang', cpp_sources=SRC)\n"
                                              "while True:\n    pass\nclass ModelNew: pass\n")
    limits = sb.SandboxLimits(wall_timeout_s=15, address_space_bytes=16 << 30)
    res = sb.run_sandboxed([sys.executable, "-m", "cuda_eval.worker.record", str(work)], str(work), limits,
                           extra_env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert res["timed_out"]
    r = json.loads((work / record.RECORD_FILE).read_text())
    assert not r["done"] and [s["name"] for s in r["specs"]] == ["then_hang"]


def test_record_main_exits_zero_even_if_the_candidate_exits(sandbox_tmp):
    work = sandbox_tmp / "rec"
    work.mkdir()
    (work / "task.py").write_text(TASK)
    (work / "candidate.py").write_text(HEAD + "import sys\nsys.exit(5)\nclass ModelNew: pass\n")
    res = sb.run_sandboxed([sys.executable, "-m", "cuda_eval.worker.record", str(work)], str(work),
                           sb.SandboxLimits(wall_timeout_s=60))
    r = json.loads((work / record.RECORD_FILE).read_text())
    assert res["exit_code"] == 0 and r["done"] and r["error_kind"] == "record_error" and "SystemExit" in r["error"]
    assert os.stat(work).st_mode  # still there
