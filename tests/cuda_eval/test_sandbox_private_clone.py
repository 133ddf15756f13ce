"""A clone in a private (0700) folder with its .venv inside, as README's set-up gives whenever the user clones into
`mktemp -d` or under /root: the sandbox uid cannot read the interpreter, site-packages (torch) or this package, which
are staged for it (cuda_eval.sandbox.runtime); nothing is made readable in place and nothing runs as root.

The reproduction: the same layout as CI's `python3 -m venv .venv; pip install -r requirements.txt` in the private
clone, built in seconds: the package copied, our venv hard-linked file by file (same inodes, so same modes) and its
editable-install finder pointed at the private copy."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import runner as sb
from sandbox_fixtures import sandbox_tmp  # noqa: F401 - fixture

PACKAGE_DIR = os.path.join(sandbox_environment.PACKAGE_PARENT, "cuda_eval")
REPO = os.path.dirname(PACKAGE_DIR)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="dedicated sandbox uids need root"),
    pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="reproduces a clone with its own .venv: run in a venv"),
]

IN_CLONE = """
import json, os, sys
import cuda_eval
from cuda_eval.sandbox import config as sandbox_config
from cuda_eval.sandbox import environment as sandbox_environment
from cuda_eval.sandbox import identity as sandbox_identity
from cuda_eval.sandbox import runner as sb
info = sandbox_identity.isolation()
code = ("import json, os, sys, cuda_eval, cuda_eval._native, torch\\n"
        "print(json.dumps(dict(uid=os.getuid(), exe=sys.executable, pkg=cuda_eval.__file__,"
        " native=cuda_eval._native.__file__, torch=torch.__file__)))")
res = sb.run_sandboxed([sys.executable, "-c", code], sys.argv[1],
                       sb.SandboxLimits(wall_timeout_s=300, address_space_bytes=None))
print(json.dumps(dict(info=info, ours=cuda_eval.__file__, exit=res["exit_code"], uid=res["uid"],
                      out=res["stdout"].decode(), err=res["stderr"].decode()[-3000:])))
"""


def _modes(root: str) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames + ["."]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_uid)
    return out


@pytest.fixture
def private_clone():
    """<0700 dir>/clone with cuda_eval/ (and its built .so) and .venv/ (our venv, hard-linked)."""
    parent = tempfile.gettempdir()
    if os.stat(parent).st_dev != os.stat(sys.prefix).st_dev:
        pytest.skip(f"{parent} and {sys.prefix} are on different filesystems: no fast private copy of the venv")
    private = tempfile.mkdtemp(prefix="cuda_eval_private_")  # 0700, like mktemp -d
    try:
        clone = os.path.join(private, "clone")
        os.mkdir(clone, 0o755)
        shutil.copytree(PACKAGE_DIR, os.path.join(clone, "cuda_eval"), ignore=shutil.ignore_patterns("__pycache__"))
        venv = os.path.join(clone, ".venv")
        subprocess.run(["cp", "-al", sys.prefix, venv], check=True)
        site_packages = [os.path.join(dp, d) for dp, ds, _ in os.walk(os.path.join(venv, "lib")) for d in ds
                         if d == "site-packages"][0]
        for name in os.listdir(site_packages):  # `pip install -e .` from the private clone
            if name.startswith("__editable__") and name.endswith(".py"):
                p = os.path.join(site_packages, name)
                text = open(p).read().replace(REPO, clone)
                os.unlink(p)  # a fresh file: the hard-linked original stays as it is
                with open(p, "w") as f:
                    f.write(text)
        yield private, clone
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_a_clone_in_a_private_folder_runs_sandboxed_from_staged_copies(private_clone, sandbox_tmp):
    private, clone = private_clone
    python = os.path.join(clone, ".venv", "bin", "python")
    runtime = str(sandbox_tmp / "runtime")  # a fresh one: everything is staged in this test
    before = _modes(private)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CUDA_EVAL_SANDBOX_RUNTIME_DIR"] = runtime
    out = subprocess.run([python, "-c", IN_CLONE, str(sandbox_tmp / "work")], capture_output=True, text=True,
                         cwd=clone, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ours"] == os.path.join(clone, "cuda_eval", "__init__.py")  # the evaluator ran the private copy
    assert got["exit"] == 0, got["err"]
    inside = json.loads(got["out"])
    assert got["info"]["identity"] == "dedicated" and inside["uid"] == got["uid"] >= sandbox_config.IDENTITY.uid_base
    for key in ("exe", "pkg", "native", "torch"):
        assert inside[key].startswith(runtime + os.sep), (key, inside[key])
    assert inside["native"].endswith(".so")
    staged = " ".join(got["info"]["staged"])
    assert f"venv {clone}/.venv" in staged and f"package {clone}/cuda_eval" in staged
    # nothing was made readable in place: same modes and owners everywhere in the private folder
    assert _modes(private) == before
    assert os.stat(private).st_mode & 0o777 == 0o700
