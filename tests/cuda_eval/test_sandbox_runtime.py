"""What a sandbox uid can read, and the staged runtime used when it cannot read ours (cuda_eval.sandbox_runtime)."""
import os
import subprocess

from cuda_eval import sandbox as sb
from cuda_eval.sandbox_runtime import RuntimeView, runtime_view, world_readable


def test_world_readable(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    f = open_dir / "f.txt"
    f.write_text("x")
    os.chmod(tmp_path, 0o711)
    os.chmod(open_dir, 0o755)
    os.chmod(f, 0o644)
    parents_ok = all(os.stat(p).st_mode & 0o001 for p in list(tmp_path.parents)[:-1])
    assert world_readable(str(f)) == parents_ok
    os.chmod(f, 0o600)
    assert not world_readable(str(f))
    os.chmod(f, 0o644)
    os.chmod(open_dir, 0o700)
    assert not world_readable(str(f))
    assert not world_readable(str(tmp_path / "missing"))


def test_map_path_longest_prefix_first():
    view = RuntimeView(python="/staged/python", path_map=(("/root/py/lib/python3", "/s/lib"), ("/root/py", "/s")))
    assert view.map_path("/root/py/lib/python3/os.py") == "/s/lib/os.py"
    assert view.map_path("/root/py/include") == "/s/include"
    assert view.map_path("/root/python") == "/root/python"  # a prefix match must end at a path boundary


def test_the_view_runs_for_the_sandbox_uid():
    view = runtime_view()
    assert world_readable(view.python) or os.geteuid() != 0
    if sb.identity_mode() == "dedicated":
        env = dict(view.env)
        out = subprocess.run([view.python, "-c", "import cuda_eval, torch; print('ok')"], capture_output=True,
                             text=True, env={**os.environ, **env}, timeout=120)
        assert out.stdout.strip() == "ok", out.stderr[-500:]
