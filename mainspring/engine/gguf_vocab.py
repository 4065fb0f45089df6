"""Rebuild a Hugging Face `tokenizer.json` from the vocabulary a GGUF file carries in its metadata.

A GGUF has no tokenizer.json: llama.cpp keeps the tokens, merges, token types and the name of its
pre-tokenizer ("tokenizer.ggml.pre"). We turn those back into a `tokenizers.Tokenizer` so the rest
of the engine only ever deals with Hugging Face folders.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from .errors import ModelLoadError, UnsupportedModelError

log = logging.getLogger(__name__)

# llama.cpp's token types (llama_token_type): 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
_CONTROL = 3
_USER_DEFINED = 4

# Split patterns of the pre-tokenizers llama.cpp names; written after tiktoken's cl100k and Qwen2's
# published patterns. They differ from GPT-2's built-in ByteLevel regex in how digits and newlines group.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_BY_PRE = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT),
}
_GPT2_PRES = (None, "default", "gpt2", "gpt-2")


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, the alphabet byte-level BPE tokens are spelled in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre == "smollm":
        # llama.cpp's "smollm" splits every digit on its own (regex \p{N}) before the GPT-2 split; that
        # is also what SmolLM's own tokenizer.json does with Digits(individual_digits=True).
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    split = _SPLIT_BY_PRE.get(pre) if pre is not None else None
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre not in _GPT2_PRES:
        # A wrong split only makes tokenization a little less like training, so serve rather than refuse.
        log.warning("GGUF pre-tokenizer %r is not known; using GPT-2's byte-level split", pre)
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def build_gguf_tokenizer(meta: dict[str, Any], source: str) -> tuple[HFTokenizer, dict[str, Any]]:
    """Build (tokenizer, tokenizer_config.json dict) from GGUF metadata; `source` names the file in errors."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(
            f"{source}: GGUF tokenizer type {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "use the model's Hugging Face folder instead"
        )
    tokens: list[str] | None = meta.get("tokenizer.ggml.tokens")
    merges_raw: list[str] | None = meta.get("tokenizer.ggml.merges")
    if not tokens or merges_raw is None:
        raise ModelLoadError(f"{source}: GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)

    alphabet = set(byte_to_unicode().values())
    to_uni = byte_to_unicode()

    def spell(tok: str) -> str:
        # Every real byte-level token is already spelled in the byte alphabet; respell the odd one out
        # so that it stays a reachable vocabulary entry instead of breaking BPE.
        if set(tok) <= alphabet:
            return tok
        return "".join(to_uni[b] for b in tok.encode("utf-8"))

    vocab = {spell(tok): i for i, tok in enumerate(tokens)}
    merges: list[tuple[str, str]] = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep or not left or not right or " " in right:
            raise ModelLoadError(f"{source}: malformed BPE merge {m!r} in GGUF metadata")
        merges.append((left, right))

    tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    tk.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|> ...) must match whole in text, or a chat template's markup would be
    # cut into ordinary bytes. A control token spelled outside the byte alphabet is a llama.cpp mislabel.
    special = [
        AddedToken(tok, special=True, normalized=False)
        for tok, ty in zip(tokens, types)
        if ty == _CONTROL and set(tok) <= alphabet
    ]
    user = [
        AddedToken(tok, special=False, normalized=False)
        for tok, ty in zip(tokens, types)
        if ty == _USER_DEFINED and tok in vocab
    ]
    if special:
        tk.add_special_tokens(special)
    if user:
        tk.add_tokens(user)

    def token_of(key: str) -> str | None:
        idx = meta.get(f"tokenizer.ggml.{key}")
        return tokens[idx] if isinstance(idx, int) and 0 <= idx < len(tokens) else None

    bos, eos = token_of("bos_token_id"), token_of("eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = [s for s in (bos if add_bos else None, "$A", eos if add_eos else None) if s is not None]
        specials = [(t, vocab[spell(t)]) for t in {bos if add_bos else None, eos if add_eos else None} if t]
        tk.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)

    tok_config: dict[str, Any] = {
        # Lets transformers read the folder too (handy as an oracle); our code ignores the class.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token_of("unknown_token_id"),
        "pad_token": token_of("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        tok_config["chat_template"] = template
    return tk, tok_config
