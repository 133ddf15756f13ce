"""The model benchmark scripts run end to end on a tiny config (so the GPU runs of them do not fail on a typo)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _run(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_aot_memory_tiny(tmp_path):
    out = tmp_path / "aot.json"
    proc = _run(["benchmarks/aot_memory.py", "--model", "tiny", "--devices", "4", "--seq-len", "128",
                 "--attention-chunk", "64", "--logprob-chunk", "64", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())["results"][0]
    assert "error" not in result, result
    assert result["devices"] == 4 and result["xla"]["argument_size_in_bytes"] > 0
    assert "| 4 | data=1 x fsdp=4 x tensor=1" in proc.stdout


def test_mfu_tiny(tmp_path):
    out = tmp_path / "mfu.json"
    configs = json.dumps([dict(remat="full", batch=2, attention="chunked", param_dtype="bfloat16"),
                          dict(remat="no_such_policy", batch=2, attention="xla", param_dtype="float32")])
    proc = _run(["benchmarks/mfu.py", "--model", "tiny", "--seq-len", "128", "--steps", "2", "--warmup", "1",
                 "--peak-tflops", "0.5", "--configs", configs, "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert results[0]["tokens_per_s"] > 0 and 0 < results[0]["mfu"] < 1
    assert "no_such_policy" in results[1]["error"]            # a bad configuration is recorded, the run goes on
    assert "MFU" in proc.stdout


def test_load_checkpoint_tiny(tmp_path):
    """benchmarks/load_checkpoint.py on a checkpoint from scripts/write_hf_checkpoint.py, 4 CPU devices, cold."""
    from kevin_jax.model.random_checkpoint import write_random_checkpoint

    ckpt = tmp_path / "ckpt"
    write_random_checkpoint(ckpt, "tiny", workers=1, max_shard_bytes=500_000, fsync=False)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, "benchmarks/load_checkpoint.py", "--checkpoint", str(ckpt), "--cold",
                           "--repeats", "2", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["repeat"] for r in rows] == [0, 1] and all(r["devices"] == 4 and r["cold"] for r in rows)
    assert rows[0]["param_dtype"] == "float32" and rows[0]["mesh"].startswith("data=1 x fsdp=4 x tensor=1")
    assert rows[0]["load_s"] > 0 and rows[1]["GB_per_s"] >= 0 and rows[1]["checkpoint_GB"] > 0
    assert "| checkpoint_GB | devices |" in proc.stdout
