"""Seams between the routes and the economics layer (mainspring/api/economics.py).

Every generation route calls them in this order, exactly once each per HTTP call:

    principal   = await authenticate(request)                      # router dependency, before parsing
    reservation = await before_call(request, CallInfo(...))        # after validation, before the engine
    ...generation (one or more engine requests: n choices, several prompts)...
    await after_call(usage, request, info, reservation, outcome)   # always, also on errors and cut-off streams

`after_call` runs for every call whose `before_call` returned (whatever happens next), and gets
the tokens actually produced: a stream the client broke off reports what was
generated up to that point with status "stream_interrupted"; a non-streamed call whose client left
reports "cancelled"; an engine failure reports "error". The hold `before_call` takes never expires
while the call runs, however long; if the server dies first, the next start releases it (billing/holds.py).
An exception raised by `authenticate` or
`before_call` (an `APIError`, e.g. 401 or 402/429) becomes the HTTP answer in the route's error shape.
"""

from __future__ import annotations

import asyncio
import time
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


def _economics(request: Request):
    return request.app.state.economics


async def authenticate(request: Request) -> Any:
    """The caller's API key row (`Authorization: Bearer ...` or Anthropic's `x-api-key`), or None
    for an anonymous caller where keys are optional; raises APIError(401)."""
    auth = request.headers.get("authorization", "")
    secret = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
    return await asyncio.to_thread(_economics(request).authenticate, secret)


async def before_call(request: Request, info: CallInfo) -> Any:
    """Rate limits, then the budget: reserve the worst-case cost of `info` or raise APIError(429 | 402)."""
    return await asyncio.to_thread(
        _economics(request).admit, request.state.principal, info.request_id, info.model, info.tier,
        info.prompt_tokens, info.max_output_tokens)


async def after_call(usage: Usage, request: Request, info: CallInfo, reservation: Any, outcome: CallOutcome) -> None:
    """Price what the call used, append it to the ledger and settle the reservation.

    `usage` sums every choice: prompt tokens once per prompt, cached tokens of those, completion
    tokens of all choices. A broken-off stream is billed for the tokens it produced."""
    finish = next((f for f in outcome.finish_reasons if f), None)
    cost_u = await asyncio.to_thread(
        _economics(request).record, request.state.principal, reservation, info.request_id, info.endpoint,
        info.model, info.tier, info.stream, usage, outcome.status, finish)
    request.state.cost_u = cost_u
    recorder = getattr(request.app.state, "trace_recorder", None)
    segments = getattr(request.state, "trace_segments", None)
    if recorder is not None and segments is not None:  # MAINSPRING_RECORD_TRACE (mainspring/billing/trace.py)
        key = request.state.principal
        await asyncio.to_thread(recorder.record_call, segments, t=time.time(), key=key.id if key else "anonymous",
                                project=str(key.project_id) if key else "", model=info.model, tier=info.tier,
                                output_tokens=usage.completion_tokens, max_output_tokens=info.max_output_tokens)
