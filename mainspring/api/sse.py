"""Server-sent events: framing, and a streaming response that always closes its generator.

Closing matters because the generator owns engine requests: `AsyncLLMEngine.stream` aborts its
request in a `finally`, and a route's generator settles usage in its own `finally`. Starlette
cancels the sending task when the client disconnects, but if that happens while the generator is
parked at a `yield` it is left suspended until garbage collection, and the engine would keep
generating for nobody. `EventStreamResponse` closes it deterministically.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

DONE = "data: [DONE]\n\n"


def _json(obj: BaseModel | dict[str, Any]) -> str:
    if isinstance(obj, BaseModel):
        return obj.model_dump_json()
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse_data(obj: BaseModel | dict[str, Any]) -> str:
    """One OpenAI-style event: `data: {json}` and a blank line."""
    return f"data: {_json(obj)}\n\n"


def sse_event(event: str, obj: BaseModel | dict[str, Any]) -> str:
    """One named event (Anthropic style): `event: name`, `data: {json}`, blank line."""
    return f"event: {event}\ndata: {_json(obj)}\n\n"


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that closes its generator, then calls `on_close`, however it ends.

    `on_close` covers what the generator owns but may never have reached: a generator closed
    before its first step does not run its `finally`.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        # no-cache and X-Accel-Buffering keep proxies (nginx) from holding events back
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()  # no-op when the generator already ran to its end
                if self._on_close is not None:
                    await self._on_close()


async def prime(stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """Runs `stream` to its first item before any response header is sent, and replays it.

    Admission errors (a bad parameter, a grammar that does not compile) then become ordinary HTTP
    errors instead of an error event inside a 200 stream.
    """
    try:
        first = await anext(stream)  # type: ignore[call-overload]
    except StopAsyncIteration:
        return _replay(_NOTHING, stream)
    except BaseException:
        await _aclose(stream)
        raise
    return _replay(first, stream)


_NOTHING: Any = object()


async def _replay(first: Any, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        if first is not _NOTHING:
            yield first
        async for item in rest:
            yield item
    finally:
        await _aclose(rest)


async def _aclose(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
