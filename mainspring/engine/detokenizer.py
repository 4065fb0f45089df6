"""Streams generated text token by token, and ends a request at its stop strings.

Decoding a byte-level BPE token alone is wrong in general: one character can span several tokens
(the pieces decode to U+FFFD) and some decoders treat a sequence's first token specially (leading
space). So each step decodes a short window of recent tokens twice, with and without the new ones,
and emits the difference (the prefix/read offset scheme of HF TGI and vLLM): O(window) per token.
"""

from __future__ import annotations

from typing import Protocol

from mainspring.engine.params import SamplingParams

# Prompt tokens kept as decoding context for the first output tokens (vLLM uses the same 5).
_PROMPT_CONTEXT = 5
_REPLACEMENT = "\ufffd"
# A UTF-8 character needs at most 4 byte-level tokens; more pending tokens than this means invalid
# bytes or a run of tokens that decode to nothing (special tokens): emit anyway to keep the window small.
_MAX_PENDING = 16


class SupportsDecode(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """One per request. Call `add(token_id)` for each generated token and stream what it returns;
    stop when `finished_by_stop`; if the request ends for another reason, stream `flush()` too.

    Stop strings: the output ends right before the earliest-ending match (with it, if
    include_stop_str_in_output). Text that could be the start of a stop string is held back until
    it can't be, so a stop string split across tokens never leaks into the stream.
    """

    def __init__(
        self,
        tokenizer: SupportsDecode,
        prompt_token_ids: list[int],
        params: SamplingParams,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stops = list(params.stop)
        self._include_stop = params.include_stop_str_in_output
        self._max_stop = max((len(s) for s in self._stops), default=0)
        # Only the prompt's last tokens matter as context; keeping them avoids copying the prompt.
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._prefix = 0  # window start: context tokens, decoded but already emitted
        self._read = len(self._ids)  # first token whose text is not yet decoded into _decoded
        self._prefix_text = self._decode(self._ids).rstrip(_REPLACEMENT)
        self._num_output = 0
        self._checked = 0  # length of _decoded already searched for stop strings
        self._decoded = ""  # output text decoded so far (complete characters only, until flush)
        self._emitted = 0  # length of the prefix of _decoded (or final text) already returned
        self._final: str | None = None  # set once the output text is final (stop string or flush)
        self._stop_reason: str | None = None

    # --- public API -------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """All text returned by add()/flush() so far."""
        return self._final[: self._emitted] if self._final is not None else self._decoded[: self._emitted]

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended the request, else None."""
        return self._stop_reason

    @property
    def finished_by_stop(self) -> bool:
        return self._stop_reason is not None

    @property
    def num_output_tokens(self) -> int:
        return self._num_output

    def add(self, token_id: int) -> str:
        """Feed one generated token; return the text delta safe to stream now (maybe "")."""
        if self._final is not None:  # finished: later tokens are ignored
            return ""
        self._ids.append(token_id)
        self._num_output += 1
        self._decoded += self._decode_new(final=False)
        return self._advance()

    def flush(self) -> str:
        """The request ended for another reason (EOS, stop token, length, abort): return the text
        still held back, i.e. an incomplete trailing character (as U+FFFD, like a full decode) and
        any stop-string prefix. Idempotent; a stop string completed by the flushed bytes still
        ends the text there (check finished_by_stop afterwards)."""
        if self._final is not None:
            return self._emit_final()
        self._decoded += self._decode_new(final=True)
        delta = self._advance()
        if self._final is None:
            self._final = self._decoded
            delta += self._emit_final()
        return delta

    # --- internals --------------------------------------------------------------------------------

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def _decode_new(self, final: bool) -> str:
        """Text of the tokens after the read offset, decoded with the window before them as context.
        Returns "" (and keeps the tokens pending) while they end inside a multi-byte character."""
        if self._read == len(self._ids):
            return ""
        new_text = self._decode(self._ids[self._prefix :])
        final = final or len(self._ids) - self._read >= _MAX_PENDING
        if not final and (new_text.endswith(_REPLACEMENT) or len(new_text) <= len(self._prefix_text)):
            return ""
        delta = new_text[len(self._prefix_text) :]
        # Slide the window: the tokens just decoded become the context of the next step.
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix :])
        return delta

    def _advance(self) -> str:
        """Check stop strings in the newly decoded text; return the text that is safe to emit."""
        if not self._stops:
            return self._emit_upto(len(self._decoded))
        # Matches can only end in text not yet checked, i.e. start at most max_stop-1 chars before it.
        search_from = max(0, self._checked - self._max_stop + 1)
        self._checked = len(self._decoded)
        best: tuple[int, int, str] | None = None  # (end, -start, stop): earliest end, then longest
        for stop in self._stops:
            pos = self._decoded.find(stop, search_from)
            if pos >= 0:
                cand = (pos + len(stop), -pos, stop)
                if best is None or cand < best:
                    best = cand
        if best is not None:
            end, neg_start, stop = best
            self._stop_reason = stop
            self._final = self._decoded[: end if self._include_stop else -neg_start]
            return self._emit_final()
        return self._emit_upto(len(self._decoded) - self._holdback())

    def _holdback(self) -> int:
        """Length of the longest suffix of the decoded text that is a proper prefix of a stop string."""
        text = self._decoded
        for n in range(min(self._max_stop - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def _emit_upto(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        delta = self._decoded[self._emitted : end]
        self._emitted = end
        return delta

    def _emit_final(self) -> str:
        assert self._final is not None
        delta = self._final[self._emitted :]
        self._emitted = max(self._emitted, len(self._final))
        return delta
