"""The built-in tokenizer and the HF-tokenizer wrapper: ChatML like QwQ-32B, byte-level round trips, clear errors."""
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kevin_jax.model import build_tokenizer
from kevin_jax.model.tokenizer import BUILTIN_DIR, load_tokenizer


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


@pytest.mark.skipif(not os.environ.get("KEVIN_QWQ_TOKENIZER_DIR"),
                    reason="set KEVIN_QWQ_TOKENIZER_DIR to a QwQ-32B tokenizer directory to compare with the real one")
def test_renders_identically_to_real_qwq(tok):
    qwq = load_tokenizer(os.environ["KEVIN_QWQ_TOKENIZER_DIR"])
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
         {"role": "assistant", "content": "<think>\nlong\n</think>\n\nA1"}, {"role": "user", "content": "U2"}],
        [{"role": "user", "content": "U"}, {"role": "assistant", "content": "a</think>b</think>\n\nc"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "system", "content": "S2"}],
    ]
    for messages in conversations:
        for generation_prompt in (True, False):
            assert tok.render_chat(messages, generation_prompt) == qwq.render_chat(messages, generation_prompt)
    assert qwq.decode(qwq.encode("<think>\nx</think>")) == "<think>\nx</think>"


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
