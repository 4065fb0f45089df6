"""Request bodies are bounded before a route reads them, and JSON text that cannot be UTF-8 never reaches one.

A 50 MB JSON body once held the event loop for 30 s. `BodyLimit` (pure ASGI, outside every route) answers 413
with the route's error body as soon as the body is known to be too large: at once from Content-Length, or while
a chunked body streams in, counting bytes. The rest of a too-large body is read and dropped (up to `DRAIN_BYTES`)
before the 413 is sent, so a client still writing its body reads the answer instead of a reset connection.
/v1/files uploads (streamed to disk by their route) get their own, larger cap.

JSON's `\\ud800` escape decodes to a lone surrogate, a `str` that no UTF-8 codec accepts: every layer below
(tokenizer, database, response encoder) would fail with a 500. A JSON body is held here (it is capped) and,
only when it contains a surrogate escape or the bytes of one, parsed once off the event loop to find a lone
surrogate; one is a 400 naming the field. Pairs (`\\ud83d\\ude00`, an emoji) are fine.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mainspring.api.errors import APIError, error_body, is_anthropic

UPLOAD_PATHS = ("/v1/files",)  # routes that stream their body to disk
DRAIN_BYTES = 64 << 20  # read and dropped after a 413, so the client sees it; beyond, the connection closes
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_SURROGATE_HINT = re.compile(rb"\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")  # an escape, or CESU-8 bytes
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_OFF_LOOP_BYTES = 64 << 10


class _TooLarge(Exception):
    def __init__(self, last: Message) -> None:
        self.last = last  # the message that went past the cap


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int, upload_bytes: int) -> None:
        self.app, self.max_bytes, self.upload_bytes = app, max_bytes, upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope.get("path", "").rstrip("/") in UPLOAD_PATHS
        cap = self.upload_bytes if upload else self.max_bytes
        too_large = _too_large(cap, "MAINSPRING_MAX_UPLOAD_MB" if upload else "MAINSPRING_MAX_REQUEST_MB")
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            if int(declared) <= cap + DRAIN_BYTES and "100-continue" not in headers.get("expect", "").lower():
                await _drain(receive, cap + DRAIN_BYTES)
            return await _send_error(scope, send, too_large)
        if scope["method"] in BODY_METHODS and _is_json(headers) and not upload:
            return await self._json(scope, receive, send, cap, too_large)
        await self._streamed(scope, receive, send, cap, too_large)

    async def _json(self, scope: Scope, receive: Receive, send: Send, cap: int, too_large: APIError) -> None:
        """Hold the (capped) body, refuse lone surrogates, then hand the body to the route."""
        try:
            body = await _read(receive, cap)
        except _TooLarge as exc:
            await _drain(receive, DRAIN_BYTES, exc.last)
            return await _send_error(scope, send, too_large)
        if body is None:  # the client left
            return
        if _SURROGATE_HINT.search(body):
            if len(body) > _OFF_LOOP_BYTES:
                where = await asyncio.to_thread(lone_surrogate_field, body)
            else:
                where = lone_surrogate_field(body)
            if where is not None:
                return await _send_error(scope, send, surrogate_error(where))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # http.disconnect, when the client goes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _streamed(self, scope: Scope, receive: Receive, send: Send, cap: int, too_large: APIError) -> None:
        """Pass the body through as it arrives, counting; past the cap the route sees the client leave and the
        client gets the 413 (unless the route has already started its answer)."""
        received = 0
        started = refused = False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    refused = True
                    if not started:
                        await _drain(receive, DRAIN_BYTES, message)
                        await _send_error(scope, send, too_large)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if refused and not started:  # we answered; the route's own answer to "the client left" is dropped
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not refused:
                raise


def _is_json(headers: Headers) -> bool:
    """FastAPI parses a body as JSON when it says so, or says nothing."""
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return not kind or kind == "application/json" or kind.endswith("+json")


async def _read(receive: Receive, cap: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise _TooLarge(message)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _drain(receive: Receive, limit: int, last: Message | None = None) -> None:
    """Read and drop the rest of the body (at most `limit` bytes)."""
    dropped = 0
    while (last is None or last.get("more_body", False)) and dropped <= limit:
        last = await receive()
        if last["type"] != "http.request":
            return
        dropped += len(last.get("body", b""))


def _too_large(cap: int, setting: str) -> APIError:
    return APIError(413, f"the request body is larger than this server accepts ({cap / 2**20:g} MiB, set by "
                         f"{setting})", code="request_too_large")


def surrogate_error(where: str) -> APIError:
    return APIError(400, f"invalid value for '{where}': it contains a lone UTF-16 surrogate (such as \\ud800), "
                         "which is not valid Unicode; send UTF-8 text", param=where, code="invalid_unicode")


async def _send_error(scope: Scope, send: Send, err: APIError) -> None:
    anthropic = is_anthropic(Request(scope))
    response = JSONResponse(error_body(err, anthropic), status_code=err.status,
                            headers={**err.headers, "connection": "close"} if err.status == 413 else err.headers)
    await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


def lone_surrogate_field(body: bytes) -> str | None:
    """`lone_surrogate_path` of the JSON `body`; None if it is not JSON (the route reports that)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return lone_surrogate_path(doc)


def lone_surrogate_path(doc: Any) -> str | None:
    """The field (`messages[0].content`, `model`, or a key's own path) of the first string or key in the parsed
    JSON `doc` with a lone surrogate; None if none. Iterative, so deep nesting cannot overflow the stack."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if _LONE_SURROGATE.search(value):
                return where or "body"
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                child = f"{where}.{key}" if where else str(key)
                if _LONE_SURROGATE.search(key):
                    return child.encode("utf-8", "backslashreplace").decode()
                stack.append((item, child))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in reversed(list(enumerate(value))))
    return None
