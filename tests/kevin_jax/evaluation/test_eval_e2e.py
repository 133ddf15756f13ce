"""launch/eval.py end to end: the pipeline with a scripted policy fake and an evaluator fake (outputs, re-scoring,
re-evaluation, beam search, bad input), restoring a training checkpoint (and refusing one that does not match the
config), and a real run of the tiny CPU config (JAX sampler + cuda_eval in compile-only mode)."""
import itertools
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from kevin_env_fakes import EvaluatorFake, ScriptedPolicyFake, chatml_tokenizer, scripted_answer

from kevin_jax.env.trajectory import read_trajectories, write_trajectories
from kevin_jax.evaluation import pipeline
from kevin_jax.evaluation.pipeline import EvalOptions
from kevin_jax.logs import read_scalars
from kevin_jax.tasks import builtin_solutions, load_builtin_tasks

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))          # config files import configs.common, as under launch/eval.py
from configs import tiny_cpu  # noqa: E402

TASKS = load_builtin_tasks().tasks
TASK_IDS = ("L1/1_LeakyReLU", "L2/6_Gemm_ScaledSigmoid_Sum")
SOLUTIONS = {(s.task_id, s.kind): s.source for s in builtin_solutions()}


def config(num_turns=3, num_trajectories=4, **tasks_overrides):
    c = tiny_cpu.get_config()
    c.env.num_turns, c.env.num_trajectories = num_turns, num_trajectories
    c.env.max_prompt_tokens, c.env.max_response_tokens = 200_000, 100_000
    c.sampler.max_seq_len = 400_000
    for k, v in tasks_overrides.items():
        c.tasks[k] = v
    return c


def task_in(prompt_text):
    return next(t for t in TASKS if t.source.strip() in prompt_text)


def refine_script(speedups=(None, 1.5, 2.5)):
    """Turn 0: the wrong solution; later turns: the correct one at the given speedup (every trajectory alike)."""
    def script(prompt_text, turn):
        task = task_in(prompt_text)
        s = speedups[turn]
        if s is None:
            return scripted_answer(SOLUTIONS[(task.task_id, "wrong")], summary="first try")
        return scripted_answer(SOLUTIONS[(task.task_id, "correct")], summary=f"faster, SPEEDUP={s}")
    return script


def run_fake(tmp_path, script=None, name="out", cfg=None, **options):
    tok = chatml_tokenizer()
    policy = ScriptedPolicyFake(tok, script or refine_script())
    opts = EvalOptions(out_dir=str(tmp_path / name), **{"tasks": TASK_IDS, **options})
    outcome = pipeline.run(cfg or config(), opts, evaluator=EvaluatorFake(), policy=policy, tokenizer=tok)
    return outcome, policy


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    width, height = struct.unpack(">II", data[16:24])
    return data[:8] == b"\x89PNG\r\n\x1a\n" and width > 300 and height > 200 and len(data) > 10_000


# ------------------------------------------------------------------------------------------------ with fakes
def test_policy_evaluation_writes_every_output(tmp_path):
    outcome, policy = run_fake(tmp_path)
    m = outcome.metrics
    assert (m["num_tasks"], m["trajectories_per_task"], m["turns"], m["ks"]) == (2, 4, 3, [1, 2, 4])
    # every trajectory: wrong, then 1.5x, then 2.5x
    by_turn = {row["turns"]: row for row in m["by_turn"]}
    assert by_turn[1]["correct"]["best@4"] == 0.0
    assert by_turn[2]["correct"]["avg"] == 1.0 and by_turn[2]["eager"]["performance"]["best@4"] == 1.5
    assert by_turn[2]["eager"]["fast_2"]["best@4"] == 0.0
    assert by_turn[3]["eager"]["performance"]["avg"] == 2.5 and by_turn[3]["eager"]["fast_2"]["avg"] == 1.0
    assert [(p["trajectories"], p["turns"]) for p in m["fixed_budget"][0]["points"]] == [(4, 1), (2, 2)]
    # one policy call per round and pipeline group (env.pipeline_groups=2: a task each) for all its trajectories
    assert [len(c["prompts"]) for c in policy.calls] == [4] * 6

    out = outcome.out_dir
    for name in ("trajectories.jsonl", "metrics.json", "table.txt", "turns.png", "best_at_k.png",
                 "fixed_budget.png"):
        assert (out / name).is_file(), name
    for name in ("turns.png", "best_at_k.png", "fixed_budget.png"):
        assert is_png(out / name), name
    trajectories = read_trajectories(out / "trajectories.jsonl")[0]
    assert len(trajectories) == 8 and all(len(t.turns) == 3 for t in trajectories)
    assert trajectories[0].turns[2].verdict["speedup"] == 2.5 and trajectories[0].turns[0].response_tokens
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["metrics"] == json.loads(json.dumps(m))
    assert saved["meta"]["tasks"] == list(TASK_IDS) and saved["meta"]["source_kind"] == "policy"
    assert saved["meta"]["config"]["env"]["num_turns"] == 3 and saved["input"] is None
    table = (out / "table.txt").read_text()
    assert "best@4" in table and "2.50x" in table and "Fixed budget" in table and table == outcome.table
    tb = read_scalars(out / "tensorboard")
    assert tb["eval/eager/performance/best@4"] == [(0, pytest.approx(2.5))]
    assert tb["eval/after_1_turns/correct/avg"] == [(0, 0.0)]
    assert tb["eval/budget_4/2x2/eager/performance"][0][1] == pytest.approx(1.5)


def test_rescore_recomputes_metrics_from_saved_verdicts_without_an_evaluator(tmp_path):
    first, _ = run_fake(tmp_path)
    # no evaluator is passed and there is no GPU here: re-scoring must not need one
    again = pipeline.run(config(), EvalOptions(out_dir=str(tmp_path / "re"),
                                               rescore=str(first.files["trajectories"])))
    assert again.metrics == first.metrics
    assert json.loads((tmp_path / "re" / "metrics.json").read_text())["input"]["garbage_lines"] == 0


def test_rescore_counts_and_reports_garbage_lines(tmp_path):
    first, _ = run_fake(tmp_path)
    path = tmp_path / "dirty.jsonl"
    lines = first.files["trajectories"].read_text().splitlines()
    path.write_text("\n".join([lines[0], "this is not json", "[1, 2]", '{"task_id": "L1/1_LeakyReLU"}',
                               *lines[1:], lines[3], ""]) + "\n")
    again = pipeline.run(config(), EvalOptions(out_dir=str(tmp_path / "re"), rescore=str(path)))
    assert again.metrics == first.metrics
    report = json.loads((tmp_path / "re" / "metrics.json").read_text())["input"]
    assert (report["lines"], report["accepted"], report["garbage_lines"]) == (12, 8, 4)
    reasons = [p["reason"] for p in report["problems"]]
    assert "not JSON" in reasons[0] and "not an object" in reasons[1] and "missing" in reasons[2]
    assert "duplicate trajectory" in reasons[3]
    assert "4 garbage line(s) refused" in again.table and "line 2: not JSON" in again.table


def test_reevaluate_runs_the_evaluator_again_on_saved_responses(tmp_path):
    first, _ = run_fake(tmp_path)
    strict = EvaluatorFake(judge=lambda r: dict(correct=False, speedup=None, feedback="mismatch"))
    again = pipeline.run(config(), EvalOptions(out_dir=str(tmp_path / "re"),
                                               reevaluate=str(first.files["trajectories"])), evaluator=strict)
    assert sum(len(b) for b in strict.batches) == 24 and len(strict.batches) == 1
    assert again.metrics["summary"]["correct"]["best@4"] == 0.0
    assert first.metrics["summary"]["correct"]["best@4"] == 1.0


def test_unknown_tasks_and_mixed_steps_in_a_trajectories_file_are_errors(tmp_path):
    first, _ = run_fake(tmp_path)
    trajectories = read_trajectories(first.files["trajectories"])[0]
    trajectories[0].task_id = "L9/1_NotATask"
    write_trajectories(tmp_path / "unknown.jsonl", trajectories)
    with pytest.raises(ValueError, match=r"1 task\(s\) that are not in the loaded task set.*L9/1_NotATask"):
        pipeline.run(config(), EvalOptions(out_dir=str(tmp_path / "x"), rescore=str(tmp_path / "unknown.jsonl")))
    trajectories = read_trajectories(first.files["trajectories"])[0]
    trajectories[1].step = 7
    write_trajectories(tmp_path / "mixed.jsonl", trajectories)
    with pytest.raises(ValueError, match="mixes trajectories of steps"):
        pipeline.run(config(), EvalOptions(out_dir=str(tmp_path / "x"), rescore=str(tmp_path / "mixed.jsonl")))
    (tmp_path / "garbage.jsonl").write_text("nope\n{}\n")
    with pytest.raises(ValueError, match="no valid record.*2 garbage line"):
        pipeline.run(config(), EvalOptions(out_dir=str(tmp_path / "x"), rescore=str(tmp_path / "garbage.jsonl")))


def test_empty_task_selection_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no tasks to evaluate: the split's 'holdout' part is empty"):
        run_fake(tmp_path, cfg=config(holdout_fraction=0.0), tasks=())
    with pytest.raises(ValueError, match="--tasks refers to 1 task"):
        run_fake(tmp_path, tasks=("L1/999_Nope",))


def test_default_selection_is_the_holdout_part(tmp_path):
    outcome, _ = run_fake(tmp_path, tasks=())
    held = json.loads((outcome.out_dir / "metrics.json").read_text())["meta"]
    from kevin_jax.tasks import TasksConfig, default_split
    assert held["tasks"] == list(default_split(TASKS, TasksConfig().holdout_fraction, 0).holdout)
    assert "holdout of the config's default split" in held["split"]


def test_beam_search_keeps_the_fastest_trajectory_and_copies_it(tmp_path):
    first_turn_speedups = itertools.cycle([1.0, 3.0, 0.5, 2.0])

    def script(prompt_text, turn):
        task = task_in(prompt_text)
        speedup = next(first_turn_speedups) if turn == 0 else 1.1
        return scripted_answer(SOLUTIONS[(task.task_id, "correct")], summary=f"SPEEDUP={speedup}")

    outcome, policy = run_fake(tmp_path, script=script, beam_width=1, beam_block_turns=1)
    finals = read_trajectories(outcome.files["trajectories"])[0]
    assert len(finals) == 8 and all(len(t.turns) == 3 for t in finals)
    # after turn 1 only the 3.0x trajectory survives (4 copies); every later prompt carries its attempt
    assert all(t.turns[0].verdict["speedup"] == 3.0 for t in finals)
    tok = chatml_tokenizer()
    for call in policy.calls[1:]:
        for prompt in call["prompts"]:
            assert "SPEEDUP=3.0" in tok.decode(prompt)
    beam = json.loads((outcome.out_dir / "beam.json").read_text())
    assert beam["prunings"] == 4 and beam["surviving_origins"] == {t: [1] for t in TASK_IDS}
    first = [s for s in beam["selections"] if s["after_turns"] == 1]
    assert all(s["kept"][0]["best_speedup"] == 3.0 and s["copies"] == 4 for s in first)
    assert len(read_trajectories(outcome.out_dir / "beam_pruned.jsonl")[0]) == 2 * (3 + 3)
    m = outcome.metrics
    assert not m["parallel_samples"] and m["ks"] == [4] and "fixed_budget" not in m
    assert m["summary"]["eager"]["performance"]["best@4"] == 3.0
    assert "beam search" in outcome.table
    # re-scoring the saved beams knows they are not independent samples
    rescore = EvalOptions(out_dir=str(tmp_path / "re"), rescore=str(outcome.files["trajectories"]))
    again = pipeline.run(config(), rescore)
    assert not again.metrics["parallel_samples"] and again.metrics["summary"] == m["summary"]


def test_beam_width_must_divide_the_trajectories(tmp_path):
    with pytest.raises(ValueError, match="beam_width=3 must divide"):
        run_fake(tmp_path, beam_width=3)


def test_export_prompts_for_external_models(tmp_path):
    path = pipeline.export_prompts(config(), EvalOptions(out_dir="", export_prompts=str(tmp_path / "p.jsonl"),
                                                         tasks=TASK_IDS))
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [r["task_id"] for r in rows] == list(TASK_IDS)
    by_id = {t.task_id: t for t in TASKS}
    assert by_id[TASK_IDS[0]].source.strip() in rows[0]["prompt"] and "ModelNew" in rows[0]["prompt"]


def test_option_conflicts_are_errors():
    with pytest.raises(ValueError, match="choose one of"):
        EvalOptions(out_dir="x", rescore="a", external="b")
    with pytest.raises(ValueError, match="takes no --checkpoint"):
        EvalOptions(out_dir="x", external="b", checkpoint="c")
    with pytest.raises(ValueError, match="part must be one of"):
        EvalOptions(out_dir="x", part="test")
    with pytest.raises(ValueError, match="output directory is required"):
        EvalOptions(out_dir="")


def test_no_gpu_and_no_compile_only_request_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "visible_gpu_count", lambda: 0)
    c = config()
    c.eval.mode = "auto"
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU.*compile_only"):
        pipeline.run(c, EvalOptions(out_dir=str(tmp_path / "x"), external=str(tmp_path / "e.jsonl")))


# ------------------------------------------------------------------------------------------------ checkpoints
def _save_tiny_checkpoint(workdir: Path, step: int = 3, seed: int = 5):
    """A checkpoint exactly as the trainer writes it (train state + meta with the split). The parameters are random
    numpy arrays put in their shards (a jitted model init costs ~30 s on the 2-core CI box with 8 fake devices)."""
    import jax
    import numpy as np
    from flax import nnx

    from kevin_jax import checkpoint as ckpt_lib
    from kevin_jax import parallel, run_config
    from kevin_jax.model import qwen2, shapes
    from kevin_jax.rl import state as rl_state
    from kevin_jax.tasks import TasksConfig, default_split

    spec = run_config.parse_config(tiny_cpu.get_config())
    mesh = parallel.make_mesh(spec.mesh)
    _, abstract = nnx.split(qwen2.abstract_model(shapes.named_config("tiny"), spec.model_options))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda a, s: jax.device_put(rng.standard_normal(a.shape).astype(a.dtype), s), abstract,
                          qwen2.param_shardings(abstract, mesh))
    state = rl_state.init_state(params, rl_state.make_optimizer(spec.optim, 10))
    split = default_split(TASKS, TasksConfig().holdout_fraction, 0)
    checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", ckpt_lib.CheckpointConfig(async_save=False))
    checkpointer.save(step, state, {"step": step, "seed": 0, "split": {
        "train": list(split.train), "holdout": list(split.holdout), "seed": 0, "content_hashes": {}}})
    checkpointer.close()
    (workdir / "config.json").write_text(json.dumps(tiny_cpu.get_config().to_dict(), default=str))
    return spec, mesh, params, split


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny_run")
    return (workdir, *_save_tiny_checkpoint(workdir))


def test_restore_checkpoint_gives_the_saved_parameters_and_split(tiny_run, tmp_path):
    import jax
    import numpy as np

    from flax import nnx

    from kevin_jax.evaluation import policy_source

    workdir, spec, mesh, params, split = tiny_run
    for where in (workdir, workdir / "checkpoints"):
        loaded = policy_source.restore_checkpoint(spec, mesh, where)
        assert loaded.step == 3 and loaded.split.holdout == split.holdout
        restored = nnx.split(loaded.model)[1]
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match=r"no checkpoint of step 9 .* steps \[3\]"):
        policy_source.restore_checkpoint(spec, mesh, workdir, step=9)
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        policy_source.restore_checkpoint(spec, mesh, _empty_dir(tmp_path))


def _empty_dir(tmp_path):
    d = tmp_path / "empty"
    d.mkdir(exist_ok=True)
    return d


def test_checkpoint_that_does_not_match_the_config_is_a_clear_error(tiny_run):
    from kevin_jax import run_config
    from kevin_jax.evaluation import policy_source

    workdir, _, mesh, _, _ = tiny_run
    c = tiny_cpu.get_config()
    c.model.shape = "qwen2.5_0.5b"
    other = run_config.parse_config(c)
    with pytest.raises(policy_source.CheckpointMismatchError) as e:
        policy_source.restore_checkpoint(other, mesh, workdir)
    text = str(e.value)
    assert "does not match the config's model" in text
    assert re.search(r"embed_tokens/embedding: checkpoint \(8192, 64\) vs model \(\d+, 896\)", text)
    assert "the run's config.json has model=" in text and "'shape': 'tiny'" in text


# ------------------------------------------------------------------------------------------------ the real thing
@pytest.mark.slow
def test_tiny_cpu_config_end_to_end_with_compile_only_verdicts(tiny_run, tmp_path):
    """launch/eval.py as a user runs it: a tiny checkpoint, the JAX sampler, cuda_eval compile-only."""
    out = tmp_path / "eval"
    cmd = [sys.executable, str(REPO / "launch" / "eval.py"), f"--config={REPO / 'configs' / 'tiny_cpu.py'}",
           f"--checkpoint={tiny_run[0]}", f"--out={out}", "--part=all", "--tasks=L1/1_LeakyReLU",
           "--config.env.max_response_tokens=24", "--config.warm_start.steps=0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((out / "metrics.json").read_text())
    m = saved["metrics"]
    assert m["mode"] == "compile_only" and m["metric_correct"] == "compiled"
    assert (m["num_tasks"], m["trajectories_per_task"], m["turns"]) == (1, 2, 2)
    assert saved["meta"]["step"] == 3 and "checkpoint" in saved["meta"]["source"]
    trajectories = read_trajectories(out / "trajectories.jsonl")[0]
    assert len(trajectories) == 2
    for traj in trajectories:
        for turn in traj.turns:
            assert turn.verdict["mode"] == "compile_only" and len(turn.response_tokens) <= 24
    assert is_png(out / "turns.png") and (out / "table.txt").read_text().startswith("checkpoint ")
    assert read_scalars(out / "tensorboard")["eval/compiled/avg"][0][0] == 3
    # a mismatching config fails before sampling, with exit code 2 and the reason
    bad = subprocess.run(cmd[:-2] + ["--config.model.shape=qwen2.5_0.5b"], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert bad.returncode == 2 and "does not match the config's model" in bad.stderr
