"""Seams for the economics layer (keys, budgets, ledger): no-ops until billing/ fills them in.

Every generation route calls them in this order, exactly once each per HTTP call:

    principal   = await authenticate(request)                      # router dependency, before parsing
    reservation = await before_call(request, CallInfo(...))        # after validation, before the engine
    ...generation (one or more engine requests: n choices, several prompts)...
    await after_call(usage, request, info, reservation, outcome)   # always, also on errors and cut-off streams

`after_call` runs for every call whose `before_call` returned (whatever happens next), and gets
the tokens actually produced: a stream the client broke off reports what was
generated up to that point with status "stream_interrupted"; a non-streamed call whose client left
reports "cancelled"; an engine failure reports "error". An exception raised by `authenticate` or
`before_call` (an `APIError`, e.g. 401 or 402/429) becomes the HTTP answer in the route's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from mainspring.engine.outputs import Usage


@dataclass(frozen=True)
class CallInfo:
    """What is known about a call before it runs, enough to price a reservation."""

    endpoint: str  # "/v1/chat/completions" | "/v1/completions" | "/v1/messages"
    model: str  # the served model id, e.g. "SmolLM2-135M-Instruct-fast"
    tier: str  # "standard" | "fast"
    stream: bool
    prompt_tokens: int  # all prompts, each counted once
    max_output_tokens: int  # summed over every choice: the most this call can produce
    num_choices: int = 1
    request_id: str = ""  # the response id (chatcmpl-..., cmpl-..., msg_...)


@dataclass(frozen=True)
class CallOutcome:
    status: str  # "ok" | "error" | "cancelled" | "stream_interrupted"
    finish_reasons: tuple[str | None, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


async def authenticate(request: Request) -> Any:
    """Identify the caller from its API key (`Authorization: Bearer ...` or `x-api-key`).

    Return a principal (key id, project) to be kept on `request.state.principal`, or raise
    `APIError(401, ...)`. Now: everyone is anonymous (None).
    """
    return None


async def before_call(request: Request, info: CallInfo) -> Any:
    """Admission: check rate limits and budgets, reserve the worst-case cost of `info`.

    Return an opaque reservation handed back to `after_call`, or raise `APIError(402 | 429, ...)`.
    Now: nothing is reserved.
    """
    return None


async def after_call(usage: Usage, request: Request, info: CallInfo, reservation: Any, outcome: CallOutcome) -> None:
    """Record what the call actually used and settle its reservation; called exactly once per call.

    `usage` sums every choice: prompt tokens once per prompt, cached tokens of those, completion
    tokens of all choices. Must not raise: the response is already decided. Now: nothing is recorded.
    """
    return None
