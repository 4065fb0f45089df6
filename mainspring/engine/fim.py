"""Fill-in-the-middle prompts from a model's own FIM tokens.

Code models trained for infilling see a file as prefix, suffix and middle between marker tokens and learn to
write the middle after the last marker, then end with an end token. We lay the prompt out prefix-suffix-middle
(PSM), the order StarCoder, Qwen2.5-Coder, DeepSeek-Coder and Code Llama were trained on:

    <prefix marker> prefix <suffix marker> suffix <middle marker>   -> the model writes the middle

The file's prefix opens the prompt, so consecutive completions in one file share its KV blocks in the prefix
cache however the suffix changes. A model whose vocabulary has none of the marker sets below has no FIM
training to rely on (SmolLM2, the embedded model, has none): `fim_format` answers None and the caller refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .tokenizer import Tokenizer


@dataclass(frozen=True)
class _Family:
    name: str
    prefix: str
    suffix: str
    middle: str
    ends: tuple[str, ...]  # tokens that end the middle, besides the tokenizer's EOS
    bos: bool  # the family was trained with BOS before the prefix marker


# Marker spellings as they stand in each family's vocabulary (Code Llama's carry SentencePiece's "▁").
_FAMILIES = (
    _Family("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
            ("<|endoftext|>", "<fim_pad>", "<file_sep>"), bos=False),
    _Family("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
            ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|im_end|>"), bos=False),
    _Family("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ("<｜end▁of▁sentence｜>", "<|EOT|>"),
            bos=True),
    _Family("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", ("▁<EOT>",), bos=True),
)


@dataclass(frozen=True)
class FimFormat:
    """One model's FIM markers as token ids, and the ids that end a middle."""

    family: str
    prefix_id: int
    suffix_id: int
    middle_id: int
    stop_ids: tuple[int, ...]
    bos_id: int | None  # prepended, for families trained with it

    def prompt_ids(self, prefix_ids: Sequence[int], suffix_ids: Sequence[int]) -> list[int]:
        """The PSM prompt: the prefix first, so it is the cached part a later completion in the file reuses."""
        head = [self.bos_id] if self.bos_id is not None else []
        return [*head, self.prefix_id, *prefix_ids, self.suffix_id, *suffix_ids, self.middle_id]


def fim_format(tokenizer: Tokenizer) -> FimFormat | None:
    """The FIM markers of the first family whose three markers are all single tokens of this vocabulary."""
    for fam in _FAMILIES:
        ids = [tokenizer.token_to_id(t) for t in (fam.prefix, fam.suffix, fam.middle)]
        if any(i is None for i in ids):
            continue
        pre, suf, mid = (int(i) for i in ids if i is not None)
        ends = [tokenizer.token_to_id(t) for t in fam.ends]
        stop = dict.fromkeys([*tokenizer.eos_token_ids, *(i for i in ends if i is not None)])
        bos = tokenizer.bos_token_id if fam.bos else None
        return FimFormat(fam.name, pre, suf, mid, tuple(stop), bos)
    return None
