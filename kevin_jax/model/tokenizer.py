"""The tokenizer the environment and sampler use: any HF tokenizer directory (QwQ-32B's), or our built-in one.

    tok = load_tokenizer()                      # built-in byte-level BPE, no download
    tok = load_tokenizer("/ckpt/QwQ-32B")       # the checkpoint's own tokenizer files
    ids = tok.encode_chat([{"role": "user", "content": "..."}])   # ends with "<|im_start|>assistant\\n<think>\\n"
    text = tok.decode(generated_ids)
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

BUILTIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin_tokenizer")
REQUIRED_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>")


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
