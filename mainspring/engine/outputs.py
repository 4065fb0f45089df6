"""What the engine hands back: text, token ids, finish reason, logprobs and usage."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Usage:
    """Normalized token usage; `cached_tokens` are prompt tokens served from the prefix cache."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's log-probability under the model, with the top alternatives."""

    token_id: int
    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass
class RequestOutput:
    """A request's state after an engine step; `delta_*` hold what this step added."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_text: str = ""
    logprobs: list[TokenLogprob] | None = None
    # with SamplingParams.prompt_logprobs: one per prompt token, None for the first (nothing precedes it)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    usage: Usage | None = None
