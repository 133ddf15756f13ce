"""Each bad input of the compile stage gets a clear verdict within its timeout, and the pool keeps working after it."""
import os
import re
import time

import pytest

from cuda_eval.sandbox import identity as sandbox_identity
from sandbox_fixtures import (built_add, candidate_pair, compile_pool, make_pool, run_lock,  # noqa: F401
                              shared_dir, toolchain)

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

TASK, ADD = candidate_pair("add")
RECORD_TIMEOUT = 30   # generous: a loaded 2-core CI box needs ~5-10 s just to import torch
COMPILE_TIMEOUT = 30
DEDICATED = sandbox_identity.identity_mode() == "dedicated"


@pytest.fixture(scope="module")
def pool(shared_dir, built_add):
    """Short timeouts; the same cache as the main pool, so valid programs are cache hits."""
    assert built_add.ok
    with make_pool(shared_dir, record_timeout_s=RECORD_TIMEOUT, compile_timeout_s=COMPILE_TIMEOUT,
                   record_processes=32, compile_address_space_bytes=4 << 30) as p:
        yield p


def prefixed(code_before: str) -> str:
    """The valid add program with `code_before` run at import, before its load_inline call."""
    return code_before + "\n" + ADD


CASES = {
    "syntax_error": ("def broken(:\n    pass\n" + ADD, {"syntax"}, "SyntaxError"),
    "no_model_new": (ADD.replace("class ModelNew", "class SomethingElse"), {"no_model_new"}, "ModelNew"),
    "no_load_inline": ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n"
                       "        return a + b\n", {"no_load_inline"}, "load_inline"),
    "infinite_loop_at_import": (prefixed("while True:\n    pass"), {"record_timeout"}, "timed out"),
    "fork_loop": (prefixed("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
                  {"record_timeout", "record_error", "sandbox_killed"}, None),
    "allocates_100GB": (prefixed("hog = bytearray(100 * 1024**3)"), {"record_error"}, "MemoryError"),
    "os_exit_at_import": (prefixed("import os\nos._exit(0)"), {"sandbox_killed"}, "exited with code 0"),
    "compiler_hang": (ADD.replace('#include <torch/extension.h>', '#include "/dev/zero"'),
                      {"compile_timeout", "compile_error"}, None),
}
# Where a case may end in several ways (message None above), the log must say which one it took (a regex per kind).
KIND_MESSAGES = {"record_timeout": "timed out", "record_error": "raised|corrupted its record",
                 "sandbox_killed": "while being imported", "compile_timeout": "timed out",
                 "compile_error": "error|out of memory"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_candidate_gets_a_clear_verdict(pool, name):
    code, kinds, message = CASES[name]
    t0 = time.monotonic()
    out = pool.compile(TASK, code)
    elapsed = time.monotonic() - t0
    assert not out.ok and out.error_kind in kinds, (out.error_kind, out.log)
    if message is None:
        assert re.search(KIND_MESSAGES[out.error_kind], out.log), (out.error_kind, out.log)
    else:
        assert message and message in out.log, (out.error_kind, out.log)
    assert elapsed < RECORD_TIMEOUT + COMPILE_TIMEOUT + 30
    # ... and the next candidate is compiled normally.
    good = pool.compile(TASK, ADD)
    assert good.ok and good.modules[0].cache_hit


@pytest.mark.parametrize("name, code_before", [
    ("prints_megabytes", "import sys\nfor _ in range(300):\n    sys.stdout.write('spam' * 16384)"),
    ("os_exit_after_load_inline", None),
])
def test_noisy_or_dying_candidates_still_compile(pool, name, code_before):
    if code_before is None:
        code = ADD.replace("class ModelNew", "import os\nos._exit(0)\nclass ModelNew")
    else:
        code = prefixed(code_before)
    out = pool.compile(TASK, code)
    assert out.ok and out.modules[0].cache_hit, out.log
    if code_before is None:
        assert any("stopped early" in w for w in out.warnings)


@pytest.mark.skipif(not DEDICATED, reason="needs a dedicated sandbox uid (root)")
def test_writing_outside_its_dir_is_denied(pool, shared_dir):
    target = shared_dir / "must_not_exist.txt"
    code = prefixed(f"try:\n    open({str(target)!r}, 'w').write('pwned')\nexcept PermissionError:\n    pass")
    out = pool.compile(TASK, code)
    assert out.ok and not target.exists()
    target_cache = os.path.join(pool.cache.root, "entries", "poison.txt")
    out = pool.compile(TASK, prefixed(f"open({target_cache!r}, 'w')"))
    assert not out.ok and out.error_kind == "record_error" and "PermissionError" in out.log
    assert not os.path.exists(target_cache)


def test_many_bad_candidates_at_once_do_not_block_good_ones(pool):
    futures = [pool.submit(TASK, CASES["infinite_loop_at_import"][0]) for _ in range(2)]
    futures += [pool.submit(TASK, ADD) for _ in range(3)]
    outs = [f.result(timeout=300) for f in futures]
    assert [o.error_kind for o in outs[:2]] == ["record_timeout"] * 2
    assert all(o.ok for o in outs[2:])
