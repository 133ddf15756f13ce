"""Supervised fine-tuning (kevin_jax.sft) and the warm-start corpus: the shipped corpus is in sync with the built-in
solutions and covers every task with every quality; its refinement examples are rendered exactly like the
environment's later-turn prompts; the loss counts response tokens only and falls on a tiny model; bad data files give
errors that name the file and line; launch's run() writes an HF checkpoint that loads back."""
import collections
import importlib.util
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cuda_eval.orchestrator import feedback
from cuda_eval.api import EvalResult

from kevin_jax import parallel, policy_init, sft
from kevin_jax.env.episode import EnvConfig, EpisodeRunner
from kevin_jax.env.prompts import PromptRenderer
from kevin_jax.reward import RewardConfig
from kevin_jax.model import qwen2, shapes
from kevin_jax.model.tokenizer import load_tokenizer
from kevin_jax.rl import batch as rl_batch
from kevin_jax.rl.loss import RLConfig
from kevin_jax.sft import WarmStartConfig, warm_start_examples
from kevin_jax.tasks import TasksConfig, builtin_solutions, load_tasks

sys.path.insert(0, str(Path(__file__).parent))
from kevin_env_fakes import EvaluatorFake, ScriptedPolicyFake  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GPU_NAME = "NVIDIA H100"


def _generator():
    spec = importlib.util.spec_from_file_location("make_warm_start_corpus",
                                                  REPO / "scripts" / "make_warm_start_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plain_corpus_path(tmp_path_factory):
    """The corpus the generator writes without measurements (one plain solution per task, illustrative speedups),
    through a file as sft reads any corpus: the properties below are the generator's, whatever data is shipped."""
    path = tmp_path_factory.mktemp("corpus") / "plain.jsonl"
    path.write_text(_generator().corpus_text(None), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def corpus(plain_corpus_path):
    return sft.read_jsonl(plain_corpus_path)


@pytest.fixture(scope="module")
def shipped():
    """kevin_jax/data/warm_start_corpus.jsonl: the speed mix from the shipped GPU measurements."""
    return sft.read_jsonl("builtin")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in load_tasks(TasksConfig()).tasks}


# ---------------------------------------------------------------------------------------------------- corpus
def test_shipped_corpus_is_what_the_generator_writes():
    gen = _generator()
    expected = gen.corpus_text(gen.load_speedups(gen.DEFAULT_SPEEDUPS))  # the measured speed mix
    assert sft.BUILTIN_CORPUS.read_text(encoding="utf-8") == expected, "run: python scripts/make_warm_start_corpus.py"
    # the plain corpus is ~1.7 MB; with measured speed variants (repeated records: scripts/make_warm_start_corpus.py)
    # ~4 MB
    assert sft.BUILTIN_CORPUS.stat().st_size < 5 << 20


def test_corpus_covers_every_builtin_task_with_every_quality(corpus, shipped, tasks):
    assert set(tasks) == {s.task_id for s in builtin_solutions()}
    expected = {"first_turn/correct", "first_turn/wrong", "first_turn/compile_error", "refinement/correct"}
    for examples in (corpus, shipped):
        labels = collections.defaultdict(set)
        for ex in examples:
            labels[ex.task_id].add(ex.label)
        assert {t: labels[t] for t in tasks} == {t: expected for t in tasks}
    chains = collections.Counter((ex.task_id, _keeps(ex), len(ex.attempts)) for ex in corpus
                                 if ex.kind == "refinement")
    # fixes: after a compile error, after a wrong output, after both; kept: after a correct kernel at turns 2-4
    assert all(chains[(t, False, 1)] == 2 and chains[(t, False, 2)] == 1 for t in tasks)
    assert all(chains[(t, True, 1)] == 1 and chains[(t, True, 2)] == 3 and chains[(t, True, 3)] == 2 for t in tasks)


def _keeps(ex) -> bool:
    """A refinement example after a correct attempt (it answers with the same correct program)."""
    return bool(ex.attempts) and ex.attempts[-1].feedback.startswith("Your kernel is correct")


def test_corpus_answers_are_the_solutions_and_one_deliberate_compile_error(corpus, shipped):
    from kevin_jax.env.parse import parse_response
    sources = {(s.task_id, s.name): s.source.strip() for s in builtin_solutions()}
    plain = _generator().PLAIN_SOLUTIONS

    def of_kind(task_id, kind):
        return {v for (t, name), v in sources.items() if t == task_id and name.startswith(kind)}
    for ex in corpus:
        code = parse_response(ex.response, prompt_opens_thought=True).code
        if ex.quality == "correct":     # without measured speedups: the task's plain solution, never a variant
            assert code.strip() == sources[(ex.task_id, plain[ex.task_id])]
        elif ex.quality == "wrong":
            assert code.strip() in of_kind(ex.task_id, "wrong")
        else:
            good = sources[(ex.task_id, plain[ex.task_id])]
            assert code.count("threadIdx_x") == 1 and code.replace("threadIdx_x", "threadIdx.x", 1).strip() == good
    for ex in shipped:  # the speed mix: any correct solution of the task (slow or fast), the same wrong ones
        code = parse_response(ex.response, prompt_opens_thought=True).code.strip()
        if ex.quality == "correct":
            assert code in of_kind(ex.task_id, "correct")
        elif ex.quality == "wrong":
            assert code in of_kind(ex.task_id, "wrong")
        else:
            assert code.count("threadIdx_x") == 1
            assert code.replace("threadIdx_x", "threadIdx.x", 1) in of_kind(ex.task_id, "correct")


@pytest.mark.parametrize("which", ["plain", "shipped"])
def test_corpus_feedback_is_the_evaluators_rendering(corpus, shipped, which):
    """Every feedback is cuda_eval's feedback.render of the verdict it describes; only correct attempts show timings:
    the generator's illustrative speedups without measurements, the measured ones in the shipped corpus."""
    gen = _generator()
    data = gen.load_speedups(gen.DEFAULT_SPEEDUPS)
    name_of = {(s.task_id, s.source.strip()): s.name for s in builtin_solutions()}
    shown = set()
    for ex in corpus if which == "plain" else shipped:
        for a in ex.attempts:
            if a.feedback.startswith("Your kernel is correct"):
                speedup = float(a.feedback.split("a speedup of ")[1].split("x.")[0])
                ref_ms = float(a.feedback.split(" versus ")[1].split(" ms")[0])
                shown.add(speedup)
                if which == "shipped":  # the measurement of the solution shown, unrounded
                    m = gen.measured(data, ex.task_id, name_of[(ex.task_id, a.code.strip())])
                    speedup, ref_ms = m["speedup"], m["ref_ms"]
                expected = gen.correct_feedback(ex.task_id, a.code, speedup, ref_ms)
                assert a.feedback == expected
                continue
            assert "speedup" not in a.feedback.lower() and " ms " not in a.feedback
            if a.feedback.startswith("Your kernel failed to compile"):
                broken = a.code
                _, log = gen.with_compile_error(broken.replace("threadIdx_x", "threadIdx.x", 1))
                expected = feedback.render(EvalResult("x", ex.task_id, "full", True, compiled=False, compile_log=log))
                assert a.feedback == expected
                line = log.splitlines()[0]
                number = int(line[line.index("(") + 1:line.index(")")])
                cuda_string = broken.split('r"""', 1)[1].split('"""', 1)[0]
                assert "threadIdx_x" in cuda_string.split("\n")[number - 1]    # the line the log names
            else:
                assert a.feedback == ("Your kernel compiled and ran, but its output is incorrect (trial 1 of 5): "
                                      "outputs differ.")
    if which == "plain":
        assert shown == set(gen.ILLUSTRATIVE_SPEEDUPS)
    else:
        measured = {round(x["speedup"], 2) for sols in gen.load_speedups(gen.DEFAULT_SPEEDUPS)["solutions"].values()
                    for x in sols.values() if x["correct"]}
        assert shown and shown <= measured


def test_refinement_examples_render_exactly_like_the_environments_later_turns(corpus, tokenizer, tasks):
    """A scripted episode answers the corpus' non-compiling answer, then its wrong answer; the evaluator fake gives
    the verdicts the corpus' feedback describes. The environment's turn-2 and turn-3 prompts are the corpus'
    refinement examples' prompts, token for token."""
    task = tasks["L1/1_LeakyReLU"]
    mine = [ex for ex in corpus if ex.task_id == task.task_id]
    first = {ex.quality: ex for ex in mine if ex.kind == "first_turn"}
    broken_log = _generator().with_compile_error(
        next(s.source for s in builtin_solutions() if s.task_id == task.task_id
             and s.name == _generator().PLAIN_SOLUTIONS[task.task_id]))[1]

    def judge(request):
        if "threadIdx_x" in request.response:
            result = EvalResult("x", task.task_id, "full", True, compiled=False, compile_log=broken_log)
        else:
            result = EvalResult("x", task.task_id, "full", True, compiled=True, correct=False, meta={"num_trials": 5},
                                trials=[{"trial": 0, "max_abs_err": None, "max_rel_err": None,
                                         "mismatch_frac": None, "passed": False, "message": None}])
        return dict(compiled=result.compiled, correct=result.correct, speedup=None, compile_log=result.compile_log,
                    feedback=feedback.render(result))

    script = {0: first["compile_error"].response, 1: first["wrong"].response, 2: "Okay\n</think>\n\nSummary: done"}
    env = EnvConfig(num_turns=3, num_trajectories=1, max_prompt_tokens=16384, max_response_tokens=4096,
                    gpu_name=GPU_NAME)
    runner = EpisodeRunner(ScriptedPolicyFake(tokenizer.hf, lambda text, turn: script[turn]), EvaluatorFake(judge),
                           tokenizer, env, RewardConfig())
    turns = runner.run([task]).trajectories[0].turns
    renderer = PromptRenderer(tokenizer, env.max_prompt_tokens, GPU_NAME, env.one_shot)
    refinements = {tuple(ex.attempts): ex for ex in mine if ex.kind == "refinement"}
    one = next(ex for ex in refinements.values() if len(ex.attempts) == 1 and "compile" in ex.attempts[0].feedback)
    two = next(ex for ex in refinements.values() if len(ex.attempts) == 2 and not _keeps(ex))
    sources = {task.task_id: task.source}
    assert sft.prompt_tokens(first["correct"], renderer, sources) == turns[0].prompt_tokens
    assert sft.prompt_tokens(one, renderer, sources) == turns[1].prompt_tokens
    assert sft.prompt_tokens(two, renderer, sources) == turns[2].prompt_tokens

    # after a correct first answer, the turn-2 prompt is the corpus' "kept" example, token for token
    kept = next(ex for ex in mine if _keeps(ex) and len(ex.attempts) == 1)

    def judge_correct(request):
        return dict(compiled=True, correct=True, speedup=0.62, compile_log=None, feedback=kept.attempts[0].feedback)

    script = {0: first["correct"].response, 1: "Okay\n</think>\n\nSummary: done"}
    env2 = EnvConfig(num_turns=2, num_trajectories=1, max_prompt_tokens=16384, max_response_tokens=4096,
                     gpu_name=GPU_NAME)
    runner = EpisodeRunner(ScriptedPolicyFake(tokenizer.hf, lambda text, turn: script[turn]),
                           EvaluatorFake(judge_correct), tokenizer, env2, RewardConfig())
    turns = runner.run([task]).trajectories[0].turns
    assert sft.prompt_tokens(kept, renderer, sources) == turns[1].prompt_tokens


def test_warm_start_with_the_corpus_uses_training_tasks_only(tokenizer, tasks, plain_corpus_path):
    renderer = PromptRenderer(tokenizer, 16384, GPU_NAME)
    train = [tasks["L1/1_LeakyReLU"], tasks["L1/6_LayerNorm"]]
    samples = warm_start_examples(WarmStartConfig(steps=1, corpus=plain_corpus_path), train, renderer,
                                  tokenizer.eos_id)
    assert len(samples) == 2 * 12         # per task: correct, wrong, compile error, 3 fixes, 6 kept
    only = warm_start_examples(WarmStartConfig(steps=1, corpus=plain_corpus_path, solution_tasks="L1/6_LayerNorm"),
                               train, renderer, tokenizer.eos_id)
    assert len(only) == 12
    first_prompts = {tuple(renderer.first_turn(t.source).token_ids) for t in train}
    assert sum(tuple(s.prompt_tokens) in first_prompts for s in samples) == 2 * 3
    for s in samples:
        assert s.response_tokens[-1] == tokenizer.eos_id and s.weight == pytest.approx(1 / len(s.response_tokens))
    with pytest.raises(ValueError, match="answer_every_prompt"):
        WarmStartConfig(steps=1, corpus="builtin", answer_every_prompt=True)


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("content, message", [
    ("", "has no examples"),
    ("\n\n", "has no examples"),
    ('{"prompt": "a", "response": "b"}\n{"prompt": "a", "response": \n', r":2: not valid JSON"),
    ('{"prompt": "a", "response": "b"}\n\n[1, 2]\n', r":3: expected a JSON object"),
    ('{"prompt": "a"}\n', r":1: 'response' must be a string"),
    ('{"prompt": "a", "response": "  "}\n', r":1: empty 'response'"),
    ('{"response": "b"}\n', r":1: a record needs exactly one of"),
    ('{"prompt": "a", "messages": [], "response": "b"}\n', r":1: a record needs exactly one of"),
    ('{"messages": [{"role": "user", "content": "a"}]}\n', r":1: 'messages' must be a list of at least two"),
    ('{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}\n',
     r":1: the last message must be the assistant's"),
    ('{"messages": [{"role": "robot", "content": "a"}, {"role": "assistant", "content": "b"}]}\n',
     r":1: messages\[0\] must be"),
    ('{"task_id": "L1/1_LeakyReLU", "response": "b", "quality": "great"}\n', r":1: unknown quality 'great'"),
    ('{"task_id": "L1/1_LeakyReLU", "response": "b", "attempts": [{"code": "x"}]}\n', r":1: attempts\[0\] must be"),
])
def test_bad_data_files_give_errors_with_file_and_line(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    with pytest.raises(sft.SFTDataError, match=message) as info:
        sft.read_jsonl(path)
    assert str(path) in str(info.value)


def test_missing_file_directory_and_unknown_task(tmp_path, tokenizer):
    with pytest.raises(sft.SFTDataError, match="does not exist"):
        sft.read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(sft.SFTDataError, match="is not a file"):
        sft.read_jsonl(tmp_path)
    path = tmp_path / "d.jsonl"
    path.write_text('{"task_id": "L9/nope", "response": "b"}\n')
    renderer = PromptRenderer(tokenizer, 4096, GPU_NAME)
    with pytest.raises(sft.SFTDataError, match=r"d.jsonl:1: task 'L9/nope' is not among"):
        sft.to_samples(sft.read_jsonl(path), renderer, tokenizer.eos_id, {"L1/1_LeakyReLU": "x"})


def test_examples_over_the_token_limits_are_left_out_and_none_left_is_an_error(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "short", "response": "ok"}) + "\n"
                    + json.dumps({"prompt": "long " * 500, "response": "ok"}) + "\n"
                    + json.dumps({"prompt": "short", "response": "long " * 500}) + "\n")
    renderer = PromptRenderer(tokenizer, 200, GPU_NAME)
    samples = sft.to_samples(sft.read_jsonl(path), renderer, tokenizer.eos_id, {}, max_response_tokens=100)
    assert len(samples) == 1
    with pytest.raises(sft.SFTDataError, match="none of the 3 examples fits"):
        sft.to_samples(sft.read_jsonl(path), PromptRenderer(tokenizer, 5, GPU_NAME), tokenizer.eos_id, {})


def test_user_formats_render_with_the_chat_template(tmp_path, tokenizer):
    path = tmp_path / "d.jsonl"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}]
    path.write_text(json.dumps({"prompt": "hi", "response": "hello"}) + "\n" + json.dumps({"messages": messages}))
    renderer = PromptRenderer(tokenizer, 4096, GPU_NAME)
    plain, chat = sft.to_samples(sft.read_jsonl(path), renderer, tokenizer.eos_id, {})
    assert plain.prompt_tokens == renderer.encode(renderer.render_text("hi"))
    assert tokenizer.decode(chat.prompt_tokens) == tokenizer.hf.apply_chat_template(
        messages[:2], add_generation_prompt=True, tokenize=False)
    assert plain.response_tokens == chat.response_tokens == renderer.encode("hello") + [tokenizer.eos_id]


# ---------------------------------------------------------------------------------------------------- training
RL = RLConfig(min_row_len=64, logprob_chunk=64)


@pytest.fixture(scope="module")
def tiny():
    mesh = parallel.make_mesh(parallel.ParallelConfig(), jax.devices()[:1])
    options = qwen2.ModelOptions(dtype="float32", attention="xla", remat="none")
    graphdef, params = nnx.split(qwen2.init_sharded(shapes.named_config("tiny"), options, mesh, seed=0))
    return graphdef, params, mesh


def _samples(tokenizer):
    renderer = PromptRenderer(tokenizer, 4096, GPU_NAME)
    pairs = [("Write a ReLU kernel.", "Okay\n</think>\n\nout[i] = x[i] > 0 ? x[i] : 0;\n\nSummary: relu"),
             ("Write an add kernel.", "Okay\n</think>\n\nout[i] = a[i] + b[i];\n\nSummary: add")]
    examples = [sft.Example(r, prompt=p) for p, r in pairs]
    return sft.to_samples(examples, renderer, tokenizer.eos_id, {})


def test_loss_counts_response_tokens_only(tiny, tokenizer):
    graphdef, params, mesh = tiny
    sample = _samples(tokenizer)[0]
    (mb,), _ = rl_batch.micro_batches([sample], RL)
    loss = float(jax.jit(sft.response_nll_fn(graphdef, mesh, RL))(params, {k: jnp.asarray(v) for k, v in mb.items()}))
    seq = np.array(list(sample.prompt_tokens) + list(sample.response_tokens), np.int32)[None]
    logp = np.asarray(nnx.merge(graphdef, params).token_logprobs(jnp.asarray(seq[:, :-1]), None, None,
                                                                 jnp.asarray(seq[:, 1:]), chunk_size=64))[0]
    p, r = len(sample.prompt_tokens), len(sample.response_tokens)
    response_part = logp[p - 1:p - 1 + r]                 # positions predicting the response tokens
    assert loss == pytest.approx(-response_part.mean(), rel=1e-4)
    assert abs(loss + logp.mean()) > 10 * 1e-4 * loss     # 10x the tolerance: the all-position mean differs
    assert mb["loss_mask"].sum() == r


def test_loss_promises_right_padded_rows_unless_packed(tiny, tokenizer, monkeypatch):
    """Unpacked rows reach the model as right-padded (cuDNN flash attention on GPU, as in the RL update); packed rows
    do not. Without the promise the warm start ran blockwise attention at <1% MFU."""
    graphdef, params, mesh = tiny
    seen, original = [], qwen2.Qwen2ForCausalLM.token_logprobs

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("right_padded", False))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(qwen2.Qwen2ForCausalLM, "token_logprobs", spy)
    losses = []
    for pack in (False, True):
        config = RLConfig(min_row_len=64, logprob_chunk=64, pack=pack)
        (mb,), _ = rl_batch.micro_batches(_samples(tokenizer), config)
        losses.append(float(sft.response_nll_fn(graphdef, mesh, config)(params, {k: jnp.asarray(v)
                                                                             for k, v in mb.items()})))
    assert seen == [True, False]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)      # same samples, same loss either way


def test_batch_order_random_and_length_bucketed():
    """length_buckets=0 keeps the warm start's seeded random batches (the same draws as before the option, so earlier
    runs reproduce); K > 0 gives full batches of similar length, each example at most once per epoch, every example
    within the first two epochs, seeded, and much less padding once laid out as the update lays it out."""
    rng = np.random.default_rng(7)
    # the shape of configs/one_gpu.py's warm-start lengths (p10/p50/p90 ~1700/2550/4150 tokens)
    lengths = np.clip(rng.lognormal(np.log(2550), 0.35, size=397), 600, 7800).astype(int).tolist()
    old = np.random.default_rng(np.random.SeedSequence([3, 0x5F7]))
    assert sft.batch_order(lengths, 8, 20, seed=3) == [sorted(old.choice(397, 8, replace=False).tolist())
                                                        for _ in range(20)]
    order = sft.batch_order(lengths, 8, 120, seed=3, length_buckets=8)
    assert order == sft.batch_order(lengths, 8, 120, seed=3, length_buckets=8)
    assert order != sft.batch_order(lengths, 8, 120, seed=4, length_buckets=8)
    assert len(order) == 120 and all(len(b) == 8 for b in order)
    per_epoch = 397 // 64 * 8 + (397 % 64) // 8          # runs of 64 cut into 8s; the 13 left give one batch
    first = [j for b in order[:per_epoch] for j in b]
    assert len(first) == len(set(first))                 # an epoch draws each example at most once
    assert set(first) | {j for b in order[per_epoch:2 * per_epoch] for j in b} == set(range(397))

    def padded(batches):
        return sum(rl_batch.plan_layout([lengths[j] for j in b], RLConfig(pack=False, micro_batch_tokens=32768))[0]
                   .padded_tokens for b in batches)
    spread = np.mean([max(lengths[j] for j in b) - min(lengths[j] for j in b) for b in order])
    assert spread < 0.25 * np.mean([max(lengths[j] for j in b) - min(lengths[j] for j in b)
                                    for b in sft.batch_order(lengths, 8, 120, seed=3)])
    assert padded(order) < 0.8 * padded(sft.batch_order(lengths, 8, 120, seed=3))
    with pytest.raises(ValueError, match="length_buckets"):
        WarmStartConfig(length_buckets=-1)


def test_learning_rate_schedule_comes_from_the_warm_start_section():
    # the defaults: a tenth of the steps warming up (at least 1, at most 50), then a cosine decay to a tenth of the peak
    schedule = sft.learning_rate_schedule(WarmStartConfig(steps=400, learning_rate=3e-4))
    assert float(schedule(0)) == 0.0 and float(schedule(20)) == pytest.approx(1.5e-4)
    assert float(schedule(40)) == pytest.approx(3e-4) and float(schedule(400)) == pytest.approx(3e-5)
    assert float(schedule(220)) == pytest.approx(3e-5 + 0.5 * (3e-4 - 3e-5))        # half way down the cosine
    capped = sft.learning_rate_schedule(WarmStartConfig(steps=2000, learning_rate=1e-3))
    assert float(capped(50)) == pytest.approx(1e-3) and float(capped(25)) == pytest.approx(5e-4)
    assert float(sft.learning_rate_schedule(WarmStartConfig(steps=5, learning_rate=1e-3))(1)) == pytest.approx(1e-3)
    # every number is the section's
    custom = sft.learning_rate_schedule(WarmStartConfig(steps=100, learning_rate=1e-3, warmup_fraction=0.2,
                                                        max_warmup_steps=10, final_learning_rate_fraction=0.5))
    assert float(custom(5)) == pytest.approx(5e-4) and float(custom(10)) == pytest.approx(1e-3)
    assert float(custom(100)) == pytest.approx(5e-4)
    with pytest.raises(ValueError, match="final_learning_rate_fraction"):
        WarmStartConfig(final_learning_rate_fraction=1.5)
    with pytest.raises(ValueError, match="max_warmup_steps"):
        WarmStartConfig(max_warmup_steps=0)


def test_loss_falls_in_a_few_steps_on_a_tiny_model(tiny, tokenizer):
    graphdef, params, mesh = tiny
    _, stats = sft.fine_tune(graphdef, params, _samples(tokenizer), mesh, RL,
                             WarmStartConfig(steps=12, learning_rate=1e-2, batch_size=2), seed=0)
    assert stats["sft/last_nll"] < 0.5 * stats["sft/first_nll"], stats
    assert stats["sft/first_nll"] > 5 and stats["sft/examples"] == 2
    # the speed report of the last log interval: real numbers, MFU only where the peak is known (not on CPU)
    assert stats["sft/seconds_per_step"] > 0 and stats["sft/tokens_per_second"] > 0
    assert 0 <= stats["sft/padding_fraction"] < 1 and 0 < stats["sft/host_fraction"] < 1
    assert ("sft/mfu" in stats) == (jax.devices()[0].platform != "cpu")


def test_run_writes_an_hf_checkpoint_that_loads_back(tmp_path):
    """launch/sft.py's library call on the tiny CPU config with a user JSONL (short rows: a fast compile)."""
    sys.path.insert(0, str(REPO))
    from configs import tiny_cpu
    from kevin_jax.model import hf

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"kernel {i}", "response": f"Okay\n</think>\n\nanswer {i}"}) + "\n"
                            for i in range(3)))
    config = tiny_cpu.get_config()
    config.warm_start.corpus = str(data)
    config.warm_start.answer_every_prompt = False
    config.warm_start.solution_tasks = ""
    config.warm_start.steps = 2
    config.rl.min_row_len = 64
    out = tmp_path / "sft"
    stats = policy_init.run_sft(config, out)
    assert stats["warm_start/examples"] == 3 and np.isfinite(stats["warm_start/last_nll"])
    assert json.loads((out / "sft_stats.json").read_text()) == stats
    loaded = hf.load_hf_checkpoint(out, qwen2.ModelOptions(dtype="float32", attention="xla", remat="none"))
    assert loaded.config.num_hidden_layers == shapes.named_config("tiny").num_hidden_layers
    with pytest.raises(FileExistsError, match="not an empty directory"):
        policy_init.run_sft(config, out)
