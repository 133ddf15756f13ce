"""benchmarks/sampler_round.py runs end to end on a tiny config on CPU (so the GPU run does not fail on a typo), and
its streamed round keeps the slots busier than one call per group on the same tokens."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_sampler_round_benchmark_tiny(tmp_path):
    out = tmp_path / "round.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "benchmarks/sampler_round.py", "--tiny", "--roofline-tb-s", "0.05",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    per_call, streamed = results["modes"]["per_call"], results["modes"]["streamed"]
    for r in (per_call, streamed):
        assert r["lengths_as_forced"] and r["tok_s"] > 0 and 0 < r["round_vs_full_batch_roofline"] < 1
        assert "partial" not in r
    assert per_call["generated_tokens"] == streamed["generated_tokens"] and results["same_tokens"] == "12/12"
    assert streamed["decode_steps"] < per_call["decode_steps"]
    assert streamed["slot_occupancy"] > per_call["slot_occupancy"]
    assert "| streamed |" in proc.stdout and "streamed / per_call tokens/s" in proc.stdout
    bad = subprocess.run([sys.executable, "benchmarks/sampler_round.py", "--tiny", "--modes", "streamd", "--out",
                          str(tmp_path / "bad.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--modes" in bad.stderr and not (tmp_path / "bad.json").exists()
