"""benchmarks/sampler.py runs end to end on a tiny config on CPU (so the GPU run does not fail on a typo)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_sampler_benchmark_tiny(tmp_path):
    out = tmp_path / "sampler.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "benchmarks/sampler.py", "--tiny", "--batches", "4", "--new-tokens", "12",
                           "--hf-new-tokens", "4", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    runs = {r["scenario"]: r for r in results["runs"]}
    assert set(runs) == {"uniform", "varied"}
    for run in runs.values():
        assert "error" not in run, run
        assert run["decode_tok_s"] > 0 and run["step_ms"] > 0 and run["bytes_per_step_gb"] > 0
    assert runs["uniform"]["generated_tokens"] == 4 * 12 and runs["uniform"]["reused_prefix_tokens"] > 0
    assert results["hf"][0]["decode_tok_s"] > 0
    # the copy roofline: torch's copy_ needs a GPU (skipped here), JAX's elementwise copy runs anywhere
    assert "bf16" in results["bf16_gap"] and results["copy"]["jax"]["tb_s"] > 0
    assert results["roofline_tb_s"] == results["copy"]["jax"]["tb_s"] and "skipped" in results["copy"]["torch"]
    assert "| tiny | 4 | uniform |" in proc.stdout


def test_sampler_benchmark_tensor_parallel_tiny(tmp_path):
    """--gpus 2 on 2 fake CPU devices: every section of the tensor-parallel benchmark runs (its numbers mean nothing
    here), so that the 4-GPU run does not fail on a typo."""
    out = tmp_path / "sampler_tp.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "benchmarks/sampler.py", "--tiny", "--gpus", "2", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tp = json.loads(out.read_text())["tp"]["tiny"]
    assert tp["gpus"] == 2 and tp["tensor"] == 2 and "2-way tensor parallel" in tp["sampling_mesh"]
    assert set(tp["steps"]) == {"2", "4"}
    for step in tp["steps"].values():
        assert "error" not in step, step
        assert step["decode_tok_s"] > 0 and step["bytes_per_step_gb"] > 0 and step["roofline_fraction"] > 0
    for part in ("no KV reads", "at the end-to-end context", "attention (Pallas, TP)", "lm head + sampling (TP)",
                 "one GPU's shard (no collectives)", "one GPU's shard, no KV reads"):
        assert "ms_per_step" in tp["breakdown"][part], (part, tp["breakdown"][part])
    assert tp["e2e"]["prefill_tok_s"] > 0 and tp["e2e"]["decode_tok_s"] > 0
    assert "KV pool:" in tp["pool_line"] and "| batch | mean context | decode tok/s |" in proc.stdout
    assert "derived: KV reads" in proc.stdout


def test_sampler_benchmark_end_to_end_alone_tiny(tmp_path):
    """--tp-parts e2e: the end to end in a process of its own (what runs/kevin32b.sh does at 32B, where the decode
    sections' buffers left the prefill no room), none of the other sections run; a misspelt part is refused."""
    out = tmp_path / "sampler_e2e.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "benchmarks/sampler.py", "--tiny", "--gpus", "2", "--tp-parts", "e2e",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tp = json.loads(out.read_text())["tp"]["tiny"]
    assert tp["e2e"]["prefill_tok_s"] > 0 and tp["e2e"]["decode_tok_s"] > 0
    assert tp["steps"] == {} and tp["breakdown"] == {}
    assert "prefill" in proc.stdout and "| batch | mean context" not in proc.stdout   # no empty decode table
    bad = subprocess.run([sys.executable, "benchmarks/sampler.py", "--tiny", "--gpus", "2", "--tp-parts", "prefil",
                          "--out", str(tmp_path / "bad.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "unknown part(s) prefil" in bad.stderr
    assert not (tmp_path / "bad.json").exists()
