"""Sampling parameters of one request (vLLM / OpenAI vocabulary), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mainspring.engine.errors import InvalidRequestError

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100 effectively bans a token, +100 effectively forces it
_FLOAT_FIELDS = (
    "temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"
)


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (-1 is accepted as "off" too, as vLLM clients send it)
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # >1 discourages tokens already in prompt or output (CTRL-style)
    presence_penalty: float = 0.0  # OpenAI: subtract once if the token appeared in the output
    frequency_penalty: float = 0.0  # OpenAI: subtract per occurrence in the output
    max_tokens: int = 256  # 0 only with prompt_logprobs: score the prompt, generate nothing
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    seed: int | None = None
    logprobs: int | None = None  # None = off; k = chosen token + k top alternatives
    # The same for every prompt token after the first (what evaluation harnesses score). The prompt
    # is then computed whole, never served from the prefix cache: a cached token has no logits.
    prompt_logprobs: int | None = None
    # token id -> a bias added to its logit before sampling (OpenAI's logit_bias), in [-100, 100]
    logit_bias: dict[int, float] | None = None
    # Constrained decoding (at most one): output must match a JSON schema, be any JSON object,
    # match a regex, or a Lark grammar. Enforced by masking logits every step (engine/grammar.py).
    guided_json: dict | None = None
    guided_json_object: bool = False
    guided_regex: str | None = None
    guided_grammar: str | None = None
    # KV policy of this request over the engine's default (engine/kv_policy.py); None = the
    # engine's choice, 0 = off. A window lets the request run past the model's trained context.
    attention_window: int | None = None
    attention_sinks: int | None = None
    kv_hot_tokens: int | None = None
    kv_snap_tokens: int | None = None

    @property
    def guided(self) -> bool:
        return bool(self.guided_json is not None or self.guided_json_object or self.guided_regex or self.guided_grammar)

    def __post_init__(self) -> None:
        # None means "no stop strings" for clients that send null; a bare string is one stop string.
        if self.stop is None:
            self.stop = []
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        # A non-iterable here must surface as InvalidRequestError naming the field, not a TypeError.
        for name in ("stop", "stop_token_ids"):
            try:
                setattr(self, name, list(getattr(self, name)))
            except TypeError:
                raise InvalidRequestError(
                    f"invalid sampling parameter {name}={getattr(self, name)!r}: must be a list"
                ) from None
        if isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k == -1:
            self.top_k = 0
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        def bad(name: str, why: str) -> None:
            raise InvalidRequestError(f"invalid sampling parameter {name}={getattr(self, name)!r}: {why}")

        # Type checks first: comparisons on a str/None would raise TypeError instead of a 400, and
        # bool is an int subclass that must not pass as a number. Floats must be finite (inf/nan).
        for name in _FLOAT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                bad(name, "must be a finite number")
        for name in ("top_k", "max_tokens", "min_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                bad(name, "must be an integer")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")
        for name in ("logprobs", "prompt_logprobs"):
            lp = getattr(self, name)
            if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int)):
                bad(name, "must be an integer or null")
        self._validate_logit_bias()
        for name in ("attention_window", "attention_sinks", "kv_hot_tokens", "kv_snap_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                bad(name, "must be a non-negative integer or null (0 turns it off)")

        if not 0.0 <= self.temperature <= 100.0:
            bad("temperature", "must be between 0 and 100 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.top_k < 0:
            bad("top_k", "must be >= 0 (0 or -1 disables it)")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        if not self.repetition_penalty > 0.0:
            bad("repetition_penalty", "must be > 0 (1 disables it)")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", "must be between -2 and 2")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", "must be between -2 and 2")
        if self.max_tokens < (0 if self.prompt_logprobs is not None else 1):
            bad("max_tokens", "must be at least 1 (0 only with prompt_logprobs, to score the prompt)")
        if not 0 <= self.min_tokens <= self.max_tokens:
            bad("min_tokens", "must be between 0 and max_tokens")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "stop strings must be non-empty strings")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be non-negative token ids")
        for name in ("logprobs", "prompt_logprobs"):
            lp = getattr(self, name)
            if lp is not None and not 0 <= lp <= MAX_LOGPROBS:
                bad(name, f"must be between 0 and {MAX_LOGPROBS}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            bad("seed", "must be an integer")

    def _validate_logit_bias(self) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict):
            raise InvalidRequestError(f"invalid sampling parameter logit_bias={bias!r}: must map token ids to biases")
        for t, v in bias.items():
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidRequestError(f"invalid sampling parameter logit_bias={t!r}: keys must be token ids")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS:
                raise InvalidRequestError(f"invalid sampling parameter logit_bias={v!r} (token {t}): a bias must be "
                                          f"a number between {-MAX_LOGIT_BIAS:g} and {MAX_LOGIT_BIAS:g}")
