"""One normalised usage record, and the two wire views (OpenAI, Anthropic) made from it.

The conventions differ and mixing them is the most common way cached tokens get billed twice:
OpenAI's `prompt_tokens` INCLUDES cached tokens (`prompt_tokens_details.cached_tokens` is a part
of it); Anthropic's `input_tokens` EXCLUDES cache reads and writes (they are separate counts).
Everything here goes through `UsageRecord`, whose `input_total` is all prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

# our tier <-> Anthropic's `service_tier` (OpenAI reports the tier on the response, not in usage)
_TO_ANTHROPIC_TIER = {"standard": "standard", "fast": "priority", "batch": "batch"}
_FROM_ANTHROPIC_TIER = {v: k for k, v in _TO_ANTHROPIC_TIER.items()}


class EngineUsage(Protocol):  # read-only members: the engine's Usage is a frozen dataclass
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...


@dataclass(frozen=True)
class UsageRecord:
    """Token counts of one request. `input_total` counts every prompt token (cached or not);
    `reasoning` is a part of `output_total`, not in addition to it."""

    model: str
    input_total: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output_total: int = 0
    reasoning: int = 0
    tier: str = "standard"
    batch_id: str | None = None
    stream: bool = False
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        for name in ("input_total", "cache_read", "cache_write", "output_total", "reasoning"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"usage {name} must be an integer >= 0, got {v!r}")

    @property
    def input_uncached(self) -> int:
        # clamped: an upstream that reports more cached than total tokens must not produce a credit
        return max(0, self.input_total - self.cache_read - self.cache_write)

    @property
    def total_tokens(self) -> int:
        return self.input_total + self.output_total

    def with_(self, **changes: Any) -> UsageRecord:
        return replace(self, **changes)

    def to_openai(self) -> dict[str, Any]:
        prompt_details: dict[str, int] = {"cached_tokens": self.cache_read}
        if self.cache_write:
            prompt_details["cache_write_tokens"] = self.cache_write  # OpenRouter's field; OpenAI has none
        return {
            "prompt_tokens": self.input_total,
            "completion_tokens": self.output_total,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": prompt_details,
            "completion_tokens_details": {"reasoning_tokens": self.reasoning},
        }

    def to_anthropic(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_uncached,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_write,
            "output_tokens": self.output_total,
            "service_tier": _TO_ANTHROPIC_TIER.get(self.tier, self.tier),
        }


def from_engine(usage: EngineUsage, model: str, tier: str = "standard", **extra: Any) -> UsageRecord:
    """The engine's `Usage(prompt_tokens, cached_tokens, completion_tokens)`; our prefix cache has no
    write charge, so cache_write stays 0. `extra`: batch_id, stream, finish_reason."""
    return UsageRecord(model=model, tier=tier, input_total=usage.prompt_tokens, cache_read=usage.cached_tokens,
                       output_total=usage.completion_tokens, **extra)


def _count(d: dict[str, Any] | None, key: str) -> int:
    v = (d or {}).get(key) or 0  # providers send null for "not applicable"
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"usage field {key!r} must be an integer >= 0, got {v!r}")
    return v


def from_openai(usage: dict[str, Any], model: str, tier: str = "standard", **extra: Any) -> UsageRecord:
    """Parse an OpenAI Chat Completions usage object (`prompt_tokens` already includes cached ones).
    Responses-API names (`input_tokens`, `input_tokens_details`) are accepted too."""
    responses_api = "prompt_tokens" not in usage and "input_tokens" in usage
    p_key, c_key = ("input_tokens", "output_tokens") if responses_api else ("prompt_tokens", "completion_tokens")
    p_det = usage.get("input_tokens_details" if responses_api else "prompt_tokens_details")
    c_det = usage.get("output_tokens_details" if responses_api else "completion_tokens_details")
    return UsageRecord(
        model=model, tier=tier,
        input_total=_count(usage, p_key),
        cache_read=_count(p_det, "cached_tokens"),
        cache_write=_count(p_det, "cache_write_tokens"),
        output_total=_count(usage, c_key),
        reasoning=_count(c_det, "reasoning_tokens"),
        **extra,
    )


def from_anthropic(usage: dict[str, Any], model: str, tier: str | None = None, **extra: Any) -> UsageRecord:
    """Parse an Anthropic usage object: `input_tokens` EXCLUDES cache reads and writes, so the total
    is their sum. The tier comes from `service_tier` unless given."""
    read, write = _count(usage, "cache_read_input_tokens"), _count(usage, "cache_creation_input_tokens")
    split = usage.get("cache_creation") or {}
    if not write and split:  # only the 5m/1h breakdown was sent
        write = _count(split, "ephemeral_5m_input_tokens") + _count(split, "ephemeral_1h_input_tokens")
    if tier is None:
        tier = _FROM_ANTHROPIC_TIER.get(usage.get("service_tier") or "standard", "standard")
    return UsageRecord(model=model, tier=tier, input_total=_count(usage, "input_tokens") + read + write,
                       cache_read=read, cache_write=write, output_total=_count(usage, "output_tokens"), **extra)
