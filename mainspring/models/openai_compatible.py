"""OpenAICompatibleModel: ChatModel over any OpenAI-compatible /v1/chat/completions endpoint (httpx)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import httpx
from httpx_sse import EventSource, SSEError

from mainspring.billing.usage import from_openai
from mainspring.models.base import ChatModel, Completion, CompletionChunk, Message, Tool, ToolCall, UpstreamError, Usage
from mainspring.retry import backoff_delay
from mainspring.tool_calls import new_call_id


def _usage(u: dict | None, status: int) -> Usage:
    try:
        rec = from_openai(u or {}, "")
    except ValueError as e:
        raise UpstreamError(status, f"malformed usage: {e}") from e
    return Usage(rec.input_total, rec.cache_read, rec.output_total)


def _error_message(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if err or body.get("detail") or body.get("message"):
            return str(err or body.get("detail") or body.get("message"))
    return fallback


class OpenAICompatibleModel(ChatModel):
    """POST {base_url}/chat/completions, e.g. base_url "https://api.openai.com/v1" or a vLLM server.

    408, 409, 429 and 5xx answers and connection failures are retried `max_retries` times with exponential
    backoff (honouring Retry-After up to 30 s); other errors raise UpstreamError at once.
    """

    RETRY_STATUS = frozenset({408, 409, 429})  # and every 5xx; the same set the openai SDK retries

    def __init__(self, base_url: str, api_key: str | None = None, model: str = "", timeout: float = 60.0,
                 max_retries: int = 3, backoff_s: float = 0.5) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key, self.model, self.timeout = api_key, model, timeout
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx.AsyncClient:
        # A client's connection pool belongs to one event loop; tests and CLIs may run several loops.
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client, self._loop = httpx.AsyncClient(timeout=self.timeout, headers=headers), loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _payload(self, messages, tools, tool_choice, response_format, max_tokens, temperature, seed, stop,
                 stream: bool) -> dict:
        p: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                             "temperature": temperature}
        optional = {"tools": tools or None, "tool_choice": tool_choice if tools else None,
                    "response_format": response_format, "seed": seed, "stop": stop or None}
        p.update({k: v for k, v in optional.items() if v is not None})
        if stream:
            p["stream"], p["stream_options"] = True, {"include_usage": True}
        return p

    async def _send(self, payload: dict, stream: bool) -> httpx.Response:
        """The first non-retryable answer; a 2xx streaming response is returned still open."""
        client = self._http()
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                resp = await client.send(client.build_request("POST", self.url, json=payload), stream=stream)
            except httpx.TransportError as e:  # refused, reset, timed out: worth another try
                if last:
                    raise UpstreamError(None, f"{type(e).__name__}: {e} ({self.url})") from e
                await asyncio.sleep(self._delay(attempt, None))
                continue
            if resp.is_success:
                return resp
            await resp.aread()
            await resp.aclose()
            if (resp.status_code in self.RETRY_STATUS or resp.status_code >= 500) and not last:
                await asyncio.sleep(self._delay(attempt, resp.headers.get("retry-after")))
                continue
            try:
                body = resp.json()
            except ValueError:
                body = resp.text
            raise UpstreamError(resp.status_code, _error_message(body, resp.text[:500] or resp.reason_phrase), body)
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        try:
            if retry_after is not None:
                return min(max(float(retry_after), 0.0), 30.0)
        except ValueError:
            pass  # an HTTP date: fall back to our own backoff
        return backoff_delay(attempt, self.backoff_s, 8.0)

    async def chat(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                   response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                   seed: int | None = None, stop: list[str] | str | None = None) -> Completion:
        payload = self._payload(messages, tools, tool_choice, response_format, max_tokens, temperature, seed,
                                stop, stream=False)
        resp = await self._send(payload, stream=False)
        try:
            body = resp.json()
            choice = body["choices"][0]
            msg = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise UpstreamError(resp.status_code, f"malformed chat completion: {resp.text[:300]}") from e
        calls = [ToolCall(c.get("id") or new_call_id(), c["function"]["name"], c["function"].get("arguments") or "{}")
                 for c in msg.get("tool_calls") or []]
        return Completion(msg.get("content") or "", calls, choice.get("finish_reason"),
                          _usage(body.get("usage"), resp.status_code), body.get("model") or self.model)

    async def stream(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                     response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                     seed: int | None = None, stop: list[str] | str | None = None) -> AsyncIterator[CompletionChunk]:
        payload = self._payload(messages, tools, tool_choice, response_format, max_tokens, temperature, seed,
                                stop, stream=True)
        resp = await self._send(payload, stream=True)
        finish, usage = None, None
        calls: dict[int, list[str]] = {}  # index -> [id, name, arguments so far]
        try:
            async for sse in EventSource(resp).aiter_sse():
                data = sse.data.strip()
                if not data:
                    continue
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except ValueError as e:
                    raise UpstreamError(resp.status_code, f"malformed stream event: {data[:200]}") from e
                if "error" in event:
                    raise UpstreamError(resp.status_code, _error_message(event, data), event)
                if event.get("usage"):
                    usage = _usage(event["usage"], resp.status_code)
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    for c in delta.get("tool_calls") or []:
                        slot = calls.setdefault(c.get("index", len(calls)), ["", "", ""])
                        f = c.get("function") or {}
                        slot[0] = c.get("id") or slot[0]
                        slot[1] += f.get("name") or ""
                        slot[2] += f.get("arguments") or ""
                    if delta.get("content"):
                        yield CompletionChunk(delta["content"])
                    finish = choice.get("finish_reason") or finish
        except SSEError as e:  # not an event stream at all
            raise UpstreamError(resp.status_code, f"malformed stream: {e}") from e
        finally:
            await resp.aclose()
        tool_calls = [ToolCall(i or new_call_id(), n, a or "{}") for i, n, a in (calls[k] for k in sorted(calls))]
        yield CompletionChunk("", finish, usage, tool_calls)
