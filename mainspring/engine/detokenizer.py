"""Streams generated text token by token, and ends a request at its stop strings.

Decoding a byte-level BPE token alone is wrong in general: one character can span several tokens
(the pieces decode to U+FFFD) and some decoders treat a sequence's first token specially (leading
space). So each step decodes a short window of recent tokens twice, with and without the new ones,
and emits the difference (the prefix/read offset scheme of HF TGI and vLLM): O(window) per token.
Stop strings are searched only in the new text plus the few characters before it, so that part is
O(window) too.
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

    Stop strings: the output ends right before the first stop string to complete in the text
    (with it, if include_stop_str_in_output); when several complete at once, the one that ends
    first wins, then the longer: the answer a character-by-character scan gives, whatever the
    tokenization. Text that could be the start of a stop string is held back until it can't be, so
    a stop string split across tokens never leaks into the stream.
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
        self._prefix = 0  # window start: context tokens, decoded and already accounted for
        self._read = len(self._ids)  # first token whose text is not decoded yet
        # A prompt cut inside a character decodes to a trailing U+FFFD that the output completes.
        self._prefix_text = self._decode(self._ids).rstrip(_REPLACEMENT)
        self._num_output = 0
        self._parts: list[str] = []  # emitted deltas
        self._text = ""  # "".join(_parts), joined lazily
        self._num_joined = 0
        self._held = ""  # decoded but not emitted: a suffix that may begin a stop string
        self._tail = ""  # last max_stop-1 decoded characters: a stop string may start in them
        self._done = False  # finished by a stop string, or flushed
        self._stop_reason: str | None = None

    # --- public API -------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """All text returned by add()/flush() so far."""
        if self._num_joined != len(self._parts):
            self._text = "".join(self._parts)
            self._parts = [self._text]
            self._num_joined = 1
        return self._text

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
        if self._done:  # finished: later tokens are ignored
            return ""
        self._ids.append(token_id)
        self._num_output += 1
        return self._process(self._decode_new(final=False))

    def flush(self) -> str:
        """The request ended for another reason (EOS, stop token, length, abort): return what is
        still held back, i.e. an incomplete trailing character (as U+FFFD, like a full decode) and
        any stop-string prefix. Idempotent. A stop string completed by the flushed bytes still
        ends the text there (finished_by_stop is then True)."""
        if self._done:
            return ""
        delta = self._process(self._decode_new(final=True))
        if not self._done:
            delta += self._emit(self._held)
            self._held = ""
            self._done = True
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

    def _process(self, new: str) -> str:
        """Take newly decoded text; return the part that is safe to emit now."""
        if not self._stops:
            return self._emit(new)
        # Every stop string that completes now ends inside `new`, so it starts within `window`.
        # Held text is a suffix of the tail (both < max_stop chars): unemitted = window[base:].
        window = self._tail + new
        base = len(self._tail) - len(self._held)
        best: tuple[int, int, str] | None = None  # (end, -start, stop): ends first, then longest
        for stop in self._stops:
            pos = window.find(stop)
            if pos >= 0 and (best is None or (pos + len(stop), -pos, stop) < best):
                best = (pos + len(stop), -pos, stop)
        if best is not None:
            # The match's start is never in emitted text: its part before `new` was a suffix of the
            # text that is also a stop-string prefix, and the longest such suffix is held back.
            end, neg_start, stop = best
            self._stop_reason, self._done, self._held = stop, True, ""
            return self._emit(window[base : end if self._include_stop else -neg_start])
        unemitted = window[base:]
        hold = self._holdback(unemitted)
        self._held = unemitted[len(unemitted) - hold :]
        self._tail = window[-(self._max_stop - 1) :] if self._max_stop > 1 else ""
        return self._emit(unemitted[: len(unemitted) - hold])

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        for n in range(min(self._max_stop - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def _emit(self, delta: str) -> str:
        if delta:
            self._parts.append(delta)
        return delta
