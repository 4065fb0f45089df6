"""Constrained decoding: a request's output must match a JSON schema, any JSON object, a regex or a
Lark grammar. Backed by llguidance (no transformers, no torch.compile): every step the request's
matcher writes a bitmask of the tokens that keep the output matchable, the sampler sets the others'
logits to -inf, and the engine feeds the chosen token back with `accept`.

Measured on SmolLM2 (49,152-token vocab, 1 torch thread, shared 2-core machine): the llguidance
tokenizer takes 0.3-0.6 s to build, once per engine, on the first guided request; compiling a new
5-property JSON schema or regex takes ~1.2-1.8 ms (a cached one ~0.02 ms); per decode step a mask
fill takes ~0.03 ms median (0.1-0.4 ms at p90) and applying it to the logits row ~0.13 ms.

Termination: once the grammar is complete (nothing but EOS may follow) the engine finishes the
request with "stop" without waiting for EOS; an EOS the grammar allows ends it too, and its text is
not part of the output. max_tokens still applies: a guided output cut by it ("length") is only a
prefix of a match (e.g. JSON that does not parse yet).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch

from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.json_schema import prepare_schema
from mainspring.engine.params import SamplingParams
from mainspring.engine.transfers import upload

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions  # stubs only: not re-exported at runtime

    from mainspring.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# Compiled grammars kept per engine, as warmed-up template matchers: building an LLMatcher takes
# ~1-3 ms and its first mask fill (lexer construction) up to a few more, while deep_copy of a
# template whose lexer is built takes ~2-15 us and its copies' first fills are as fast as later ones.
_CACHE_SIZE = 256
_SHIFTS = torch.arange(32, dtype=torch.int32)
# JSON whitespace: llguidance allows any run of it between tokens by default, and a small model can
# spend its whole budget on newlines and spaces there. Bounding each run (enough for a newline and
# indentation ~20 levels deep) keeps pretty-printing possible and runaway whitespace impossible.
# These are defaults: a schema's own "x-guidance" options override them.
_JSON_DEFAULTS: JsonCompileOptions = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,40}"}


def bitmask_words(vocab_size: int) -> int:
    """int32 words in one row of a token bitmask (bit t of the row = token t allowed)."""
    return (vocab_size + 31) // 32


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [rows, V] of tokens whose bit is 0 in bitmask [rows, W] (int32) to -inf, in place.

    An eager shift-and-mask unpack plus one masked_fill_ costs ~0.12-0.19 ms for a 49,152 vocab on
    one thread, 2-3x less than llguidance's torch.compile'd helper measured on the same row (and it
    needs no compiler at run time). Bits past the vocab (the last word's padding) are dropped.
    """
    rows, vocab = logits.shape
    shifts = upload(_SHIFTS, bitmask.device)
    banned = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(rows, -1)[:, :vocab] == 0
    logits.masked_fill_(banned, float("-inf"))


def grammar_key(params: SamplingParams) -> tuple[str, str] | None:
    """(kind, spec) of the request's guided-decoding constraint, None if unguided; the cache key.

    At most one constraint may be set: combining them has no single meaning."""
    set_ = [
        name for name, on in (
            ("guided_json", params.guided_json is not None),
            ("guided_json_object", bool(params.guided_json_object)),
            # truthiness as in SamplingParams.guided: "" means "no regex", as clients send it
            ("guided_regex", bool(params.guided_regex)),
            ("guided_grammar", bool(params.guided_grammar)),
        ) if on
    ]
    if not set_:
        return None
    if len(set_) > 1:
        raise InvalidRequestError(f"at most one guided-decoding option may be set, got {', '.join(set_)}")
    if params.guided_json is not None:
        schema = params.guided_json
        if isinstance(schema, str):  # a client may send the schema as JSON text
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise InvalidRequestError(f"invalid guided_json: not valid JSON ({e})") from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError("invalid guided_json: a JSON schema must be an object")
        schema = prepare_schema(schema)
        # Not sort_keys: properties are generated in the schema's order, so order is part of the key.
        return "json", json.dumps(schema)
    if params.guided_json_object:
        return "json", '{"type": "object"}'
    name, kind, value = (("guided_regex", "regex", params.guided_regex) if params.guided_regex
                         else ("guided_grammar", "lark", params.guided_grammar))
    if not isinstance(value, str):
        raise InvalidRequestError(f"invalid {name}: must be a string")
    return kind, value


class GrammarMatcher:
    """The constraint state of one request: which tokens may come next, given the output so far.

    It follows the output tokens only, which preemption by recompute keeps, so it survives
    preemption unchanged. Drop it when the request ends."""

    __slots__ = ("_m", "_eos", "num_accepted")

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: list[int]) -> None:
        self._m = matcher
        self._eos = eos_token_ids
        self.num_accepted = 0

    def fill_mask(self, row: torch.Tensor) -> None:
        """Write the allowed next tokens into `row`, one contiguous int32 CPU bitmask row of
        bitmask_words(vocab) words. Once the grammar is complete only EOS is allowed."""
        if row.dtype != torch.int32 or not row.is_contiguous() or row.device.type != "cpu":
            raise ValueError("the mask row must be a contiguous int32 CPU tensor")
        # llguidance writes through the raw pointer (no copy); it rejects a wrong byte size itself.
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        if self._m.is_error():
            # A matcher in error (e.g. a parser limit hit mid-request) must still let the request
            # end: EOS only, never an all -inf row. llguidance 1.9 writes this mask itself; doing it
            # here keeps it true whatever the version.
            log.warning("grammar matcher failed: %s", self._m.get_error().splitlines()[0])
            row.zero_()
            for t in self._eos:
                if 0 <= t < row.numel() * 32:
                    row[t // 32] |= _bit(t % 32)

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar does not allow it (the matcher is
        then in an error state for good)."""
        ok = bool(self._m.consume_token(token_id))
        self.num_accepted += ok
        return ok

    def is_terminated(self) -> bool:
        """True once nothing but EOS can follow (the output is complete), or after an error."""
        return bool(self._m.is_stopped())

    def is_accepting(self) -> bool:
        """True if the output so far is a complete match (more may still be allowed)."""
        return bool(self._m.is_accepting())

    def rollback(self, num_tokens: int) -> bool:
        """Undo the last `num_tokens` accepted tokens (speculative decoding rejects drafts)."""
        if not 0 <= num_tokens <= self.num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} of {self.num_accepted} accepted tokens")
        ok = bool(self._m.rollback(num_tokens))
        if ok:
            self.num_accepted -= num_tokens
        return ok

    @property
    def error(self) -> str | None:
        """llguidance's message once the matcher is in an error state, else None."""
        return _summary(self._m.get_error()) if self._m.is_error() else None


def _bit(i: int) -> int:
    # bit 31 of an int32 word is its sign bit: as a Python int it must be the negative value.
    return -(1 << 31) if i == 31 else 1 << i


class GrammarCompiler:
    """Compiles guided-decoding specs into per-request matchers, for one tokenizer.

    The llguidance tokenizer (a token trie over every vocabulary entry's bytes) takes ~0.3-1 s to
    build, so it is built on the first guided request, not at engine start, and kept. It is built
    from the model's own `tokenizers` JSON, so llguidance tokenizes exactly as the model does.
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None) -> None:
        self._tokenizer = tokenizer
        # The model's logits may be wider than the tokenizer (padded embeddings): masks cover them all.
        self.vocab_size = max(vocab_size or 0, tokenizer.vocab_size)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._templates: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            with self._lock:
                if self._ll_tokenizer is None:
                    self._ll_tokenizer = self._build_tokenizer()
        return self._ll_tokenizer

    def _build_tokenizer(self) -> llguidance.LLTokenizer:
        import llguidance

        tk = self._tokenizer
        eos = tk.eos_token_ids
        if not eos:
            raise InvalidRequestError("guided decoding needs an end-of-sequence token and this model has none")
        raw = getattr(tk, "hf_tokenizer", None)  # test vocabularies may not wrap tokenizers
        if raw is not None:
            try:
                return llguidance.LLTokenizer(raw.to_str(), n_vocab=self.vocab_size, eos_token=eos)
            except ValueError as e:  # llguidance reads ByteLevel and byte-fallback decoders only
                log.info("llguidance cannot read this tokenizer's JSON (%s); using token bytes", e)
        # Fallback: the exact bytes of every token (Tokenizer.token_bytes), encoding via our tokenizer.
        return llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_BytesTokenizer(tk, self.vocab_size)), n_vocab=self.vocab_size,
            eos_token=eos)

    def compile(self, params: SamplingParams) -> GrammarMatcher | None:
        """A fresh matcher for the request's constraint; None if it has none.

        Raises InvalidRequestError (with llguidance's message) for an invalid schema, regex or grammar.
        """
        key = grammar_key(params)
        if key is None:
            return None
        llt = self.ll_tokenizer
        with self._lock:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
        if template is None:
            template = self._template(key, llt)
            with self._lock:
                self._templates[key] = template
                while len(self._templates) > _CACHE_SIZE:
                    self._templates.popitem(last=False)
        # The template stays in its initial state (mask fills do not advance it): copies start fresh.
        return GrammarMatcher(template.deep_copy(), self._tokenizer.eos_token_ids)

    def _template(self, key: tuple[str, str], llt: llguidance.LLTokenizer) -> llguidance.LLMatcher:
        import llguidance

        matcher = llguidance.LLMatcher(llt, self._compile(key, llt), log_level=0)
        if not matcher.is_error():  # one fill builds the lexer that every copy then shares
            scratch = torch.empty(bitmask_words(self.vocab_size), dtype=torch.int32)
            matcher.unsafe_compute_mask_ptr(scratch.data_ptr(), scratch.numel() * 4)
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {_KIND_NAMES[key[0]]}: {_summary(matcher.get_error())}")
        return matcher

    def _compile(self, key: tuple[str, str], llt: llguidance.LLTokenizer) -> str:
        from llguidance import LLMatcher, regex_to_lark

        kind, spec = key
        try:
            if kind == "json":
                grammar = LLMatcher.grammar_from_json_schema(spec, defaults=_JSON_DEFAULTS)
            elif kind == "regex":
                # llguidance's own regexes are Rust's, where \d and \w are Unicode: SmolLM2 then
                # prefers the first byte of an exotic digit (U+1FBF8) to "5". Clients mean ASCII (as
                # JSON Schema, outlines and xgrammar do), so \d / \w become [0-9] / [0-9a-zA-Z_].
                grammar = LLMatcher.grammar_from_lark(f"start: /{regex_to_lark(spec, 'dw')}/")
            else:
                grammar = LLMatcher.grammar_from_lark(spec)
        except ValueError as e:
            raise InvalidRequestError(f"invalid {_KIND_NAMES[kind]}: {e}") from None
        # Validation against our tokenizer checks the whole grammar (schema types, regex syntax, Lark
        # rules) up front, so a bad request fails in add_request, never mid-generation.
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, llt)
        if is_error:
            raise InvalidRequestError(f"invalid {_KIND_NAMES[kind]}: {_summary(messages[0])}")
        for m in messages:
            log.debug("grammar warning: %s", m)
        return grammar

    @property
    def num_cached(self) -> int:
        return len(self._templates)


_KIND_NAMES = {"json": "guided_json schema", "regex": "guided_regex", "lark": "guided_grammar (Lark)"}


def _summary(msg: str) -> str:
    # llguidance appends its parser state and the whole grammar to some errors; the first lines
    # carry the problem, the rest would echo the request back at the client.
    head = msg.split("\n<state>", 1)[0].split("\n<grammar>", 1)[0].strip()
    return head or msg.strip()


class _BytesTokenizer:
    """What llguidance.TokenizerWrapper needs: token bytes, eos/bos ids and an encode function."""

    def __init__(self, tk: Tokenizer, vocab_size: int) -> None:
        self._tk = tk
        self.eos_token_id = tk.eos_token_ids[0]
        self.bos_token_id = tk.bos_token_id
        self.tokens = [tk.token_bytes(i) for i in range(vocab_size)]
        self.special_token_ids = sorted(tk.special_token_ids)

    def __call__(self, s: Any) -> list[int]:
        text = s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s
        return self._tk.encode(text)
