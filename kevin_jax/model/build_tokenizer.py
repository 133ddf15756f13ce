"""Builds the embedded default tokenizer (kevin_jax/model/builtin_tokenizer/) from this repository's own text.

    python -m kevin_jax.model.build_tokenizer            # re-run whenever the corpus (tasks, code, docs) grows

Byte-level BPE (every byte sequence encodes, decode(encode(s)) == s) trained with the `tokenizers` library on the
repository's Python / CUDA / C++ / Markdown files, including the built-in KernelBench-style tasks under
kevin_jax/tasks/builtin/. The pre-tokenizer regex is Qwen2's. Special tokens match QwQ-32B's names (<|endoftext|>,
<|im_start|>, <|im_end|>, and the non-special added tokens <think>, </think>), the chat template renders like QwQ's
(ChatML, earlier chains of thought dropped, generation prompt "<|im_start|>assistant\\n<think>\\n"). Saved in HF
format (tokenizer.json + tokenizer_config.json), loadable with transformers.AutoTokenizer. Training is
deterministic for a given corpus (files are read in sorted order).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Iterator

CORPUS_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".md", ".txt", ".toml", ".cfg")
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", "builtin_tokenizer",
             "node_modules", ".eggs"}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")          # added, but not "special": they survive skip_special_tokens
# Qwen2's pre-tokenization: contractions, letters, single digits, punctuation runs, newlines, other whitespace.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")

# Our ChatML template. Renders like QwQ-32B's for system / user / assistant messages: a leading system message,
# each turn as <|im_start|>role\n...<|im_end|>\n, assistant turns with everything up to the last </think> removed
# (earlier chains of thought are dropped), and a generation prompt that opens the thinking block.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + message['content'].split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' -}}"
    "{%- elif message['role'] in ('system', 'user') -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- raise_exception('unsupported chat role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' -}}"
    "{%- endif -%}"
)

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin_tokenizer")
DEFAULT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def corpus_files(root: str) -> list[str]:
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith("."))
        found += [os.path.join(directory, f) for f in sorted(files) if f.endswith(CORPUS_SUFFIXES)]
    return sorted(found)


def read_corpus(files: list[str]) -> Iterator[str]:
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()


def build(root: str = DEFAULT_ROOT, out: str = DEFAULT_OUT, vocab_size: int = 8192) -> dict:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = corpus_files(root)
    if not files:
        raise FileNotFoundError(f"no corpus files ({', '.join(CORPUS_SUFFIXES)}) under {root}")
    texts = list(read_corpus(files))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(THINK_TOKENS), min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=131072,
                                   clean_up_tokenization_spaces=False)
    os.makedirs(out, exist_ok=True)
    for stale in os.listdir(out):
        os.remove(os.path.join(out, stale))
    fast.save_pretrained(out)
    # transformers 5 writes tokenizer_class "TokenizersBackend" and the template to chat_template.jinja; transformers
    # 4.x (e.g. a vLLM server) knows neither, so name the class both read and inline the template too.
    config_path = os.path.join(out, "tokenizer_config.json")
    with open(config_path) as f:
        tokenizer_config = json.load(f)
    tokenizer_config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    with open(config_path, "w") as f:
        json.dump(tokenizer_config, f, indent=2, sort_keys=True)
    digest = hashlib.sha256()
    for path, text in zip(files, texts):
        digest.update(os.path.relpath(path, root).encode())
        digest.update(text.encode("utf-8", errors="replace"))
    info = {"vocab_size": len(fast), "corpus_files": len(files), "corpus_bytes": sum(len(t.encode()) for t in texts),
            "corpus_sha256": digest.hexdigest(), "built_by": "python -m kevin_jax.model.build_tokenizer"}
    with open(os.path.join(out, "build_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=DEFAULT_ROOT, help="corpus root (default: this repository)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: the built-in tokenizer)")
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    info = build(args.root, args.out, args.vocab_size)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
