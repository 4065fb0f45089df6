"""Upstream providers: OpenAI-compatible endpoints served through our API, with our accounting.

An operator lists endpoints in a YAML file (MAINSPRING_UPSTREAMS_FILE):

    upstreams:
      - name: openai                        # reported as `owned_by` in /v1/models
        base_url: https://api.openai.com/v1
        api_key: sk-...
        models: [gpt-4o-mini, {name: house-chat, upstream_name: gpt-4.1-nano}]
        timeout_s: 600

A request for one of these models is forwarded as the client sent it (only `model` is renamed to the
upstream's name, and a stream always asks for usage) with the upstream's key, never the caller's.
The call goes through the same hooks as a local one: admission (rate limits, a budget reservation
priced from the model's own entry in the price sheet; an unpriced model is refused before anything
is forwarded), then the ledger, priced from the usage the upstream reports (cached tokens at the
cached rate). Where the upstream reports no usage (a stream cut short), our tokenizer counts what
was relayed. Upstream 4xx answers pass through as they are, except 401/403 (the gateway's own key is
wrong: an operator problem); those, 5xx and an unreachable upstream become 502 with an OpenAI error
body. There are no retries here: the client's SDK retries a 502 itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import httpx
import yaml
from fastapi import Request
from fastapi.responses import Response
from httpx_sse import EventSource
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mainspring.api import hooks, project_policy
from mainspring.api.errors import APIError, error_body
from mainspring.api.routes import new_id
from mainspring.api.sse import DONE, EventStreamResponse, sse_data
from mainspring.billing.prices import PriceError
from mainspring.billing.usage import from_openai
from mainspring.engine.outputs import Usage

log = logging.getLogger(__name__)
TOKENS_PER_MESSAGE = 4  # role and separators around each chat message (OpenAI's counting uses 3-4)


class UpstreamConfigError(ValueError):
    """The upstreams file cannot be read or is invalid."""


# ---- configuration ---------------------------------------------------------------------------------
class UpstreamModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)  # what clients ask for, and what the price sheet and ledger call it
    upstream_name: str | None = None  # what the upstream calls it; default: the same

    @property
    def remote(self) -> str:
        return self.upstream_name or self.name


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://")
    api_key: str = ""
    models: list[UpstreamModel] = Field(min_length=1)
    timeout_s: float = Field(600.0, gt=0)

    @field_validator("models", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        # a bare string is a model the upstream and our clients call by the same name
        return [{"name": m} if isinstance(m, str) else m for m in v] if isinstance(v, list) else v

    def url(self, endpoint: str) -> str:
        """'/v1/chat/completions' -> '{base_url}/chat/completions' (base_url already ends in /v1)."""
        return self.base_url.rstrip("/") + endpoint.removeprefix("/v1")


class UpstreamsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    upstreams: list[UpstreamConfig] = []

    @model_validator(mode="after")
    def _unique(self) -> UpstreamsFile:
        seen: dict[str, str] = {}
        for up in self.upstreams:
            for m in up.models:
                if m.name in seen:
                    raise ValueError(f"model {m.name!r} is listed by both {seen[m.name]!r} and {up.name!r}")
                seen[m.name] = up.name
        return self


@dataclass(frozen=True)
class Route:
    upstream: UpstreamConfig
    model: UpstreamModel


class Upstreams:
    """The configured upstreams, and one HTTP connection pool per upstream."""

    def __init__(self, config: UpstreamsFile | None = None) -> None:
        self.config = config or UpstreamsFile()
        self.routes = {m.name: Route(up, m) for up in self.config.upstreams for m in up.models}
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def load(cls, path: str | Path | None) -> Upstreams:
        """Read the YAML file; None or "" means no upstreams."""
        if not path:
            return cls()
        p = Path(path).expanduser()
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
            return cls(UpstreamsFile.model_validate(data))
        except OSError as exc:
            raise UpstreamConfigError(f"cannot read upstreams file {p}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise UpstreamConfigError(f"upstreams file {p} is not valid YAML: {exc}") from None
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
            raise UpstreamConfigError(f"upstreams file {p}: {problems}") from None

    def get(self, model: str) -> Route | None:
        return self.routes.get(model)

    def client(self, up: UpstreamConfig) -> httpx.AsyncClient:
        # a pool belongs to one event loop; a new loop (tests, a restarted server) gets new pools
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._clients, self._loop = {}, loop
        c = self._clients.get(up.name)
        if c is None or c.is_closed:
            c = self._clients[up.name] = httpx.AsyncClient(timeout=httpx.Timeout(up.timeout_s))
        return c

    async def aclose(self) -> None:
        clients, loop = list(self._clients.values()), self._loop
        self._clients, self._loop = {}, None
        if loop is not asyncio.get_running_loop():
            return  # pools of another (finished) event loop cannot be closed from this one
        for c in clients:
            await c.aclose()


_NONE = Upstreams()


def upstreams_of(request: Request) -> Upstreams:
    return getattr(request.app.state, "upstreams", None) or _NONE


def serves(request: Request, model: str) -> bool:
    """Is `model` one of the upstream models (the routes dispatch on this before anything else)?"""
    return upstreams_of(request).get(model) is not None


def model_cards(request: Request, created: int) -> list[dict[str, Any]]:
    """/v1/models entries of the upstream models; the context window is the price sheet's, if priced."""
    sheet = request.app.state.economics.sheet
    cards = []
    for name, route in upstreams_of(request).routes.items():
        ctx = sheet.models[name].context_window if name in sheet.models else None
        cards.append({"id": name, "object": "model", "created": created, "owned_by": route.upstream.name,
                      "tier": "standard", "context_window": ctx})
    return cards


# ---- estimates (admission, and usage an upstream did not report) ------------------------------------
def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: only text parts carry tokens we can count
        return "\n".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def estimate_prompt_tokens(tokenizer: Any, payload: dict[str, Any]) -> int:
    """Prompt tokens by our tokenizer: the upstream's own count may differ, it settles the bill."""
    if "messages" in payload:
        parts = [json.dumps(payload["tools"])] if payload.get("tools") else []
        for m in payload.get("messages") or []:
            if isinstance(m, dict):
                parts.append(_text(m.get("content")))
                parts += [json.dumps(c.get("function", c)) for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        n_messages = len(payload.get("messages") or [])
        return sum(len(tokenizer.encode(p)) for p in parts if p) + TOKENS_PER_MESSAGE * n_messages + 3
    prompt = payload.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt or [])
    return sum(len(tokenizer.encode(p)) if isinstance(p, str) else len(p) for p in prompts)


def _prompt_count(payload: dict[str, Any]) -> int:
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def max_output_tokens(request: Request, body: Any, payload: dict[str, Any], model: str) -> int:
    """The most the call can produce: the requested cap (or the sheet's) × choices × prompts."""
    asked = getattr(body, "max_completion_tokens", None) or getattr(body, "max_tokens", None)
    if asked is None:
        try:
            asked = request.app.state.economics.sheet.model(model).max_output_tokens
        except PriceError:
            asked = 0  # admission refuses an unpriced model with a clear error; nothing to reserve
    return asked * max(1, getattr(body, "n", 1) or 1) * _prompt_count(payload)


def _usage(reported: Any, info: hooks.CallInfo, texts: dict[int, list[str]], tokenizer: Any) -> Usage:
    """The upstream's usage; without it (or if it is malformed), our count of what was relayed."""
    if isinstance(reported, dict):
        try:
            rec = from_openai(reported, info.model)
            if rec.input_total or rec.output_total:  # an all-zero usage object is no report at all
                return Usage(rec.input_total, rec.cache_read, rec.output_total)
        except ValueError:
            log.warning("upstream sent malformed usage for %s: %r", info.request_id, reported)
    completion = sum(len(tokenizer.encode("".join(t))) for t in texts.values() if t)
    return Usage(info.prompt_tokens, 0, completion)


def _collect(choices: Any, texts: dict[int, list[str]], finish: dict[int, str]) -> None:
    """Text (and tool-call arguments) of each choice, from a response or a stream chunk."""
    for i, ch in enumerate(choices if isinstance(choices, list) else []):
        if not isinstance(ch, dict):
            continue
        idx = ch.get("index", i) if isinstance(ch.get("index", i), int) else i
        part = ch.get("delta") or ch.get("message") or {}
        bits = [ch.get("text"), part.get("content") if isinstance(part, dict) else None]
        for c in (part.get("tool_calls") if isinstance(part, dict) else None) or []:
            f = c.get("function") if isinstance(c, dict) else None
            if isinstance(f, dict):
                bits += [f.get("name"), f.get("arguments")]
        texts.setdefault(idx, []).extend(b for b in bits if isinstance(b, str))
        if ch.get("finish_reason"):
            finish[idx] = str(ch["finish_reason"])


# ---- one proxied call ------------------------------------------------------------------------------
@dataclass
class _Call:
    request: Request
    info: hooks.CallInfo
    reservation: Any
    tokenizer: Any
    texts: dict[int, list[str]] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    usage: Any = None  # the upstream's usage object, once seen
    settled: bool = False

    async def settle(self, status: str, count: bool = True) -> None:
        """`hooks.after_call`, exactly once; shielded so a disconnected client's call still records.
        `count=False`: the upstream produced nothing billable (an error answer)."""
        if self.settled:
            return
        self.settled = True
        usage = _usage(self.usage, self.info, self.texts, self.tokenizer) if count else Usage(0, 0, 0)
        outcome = hooks.CallOutcome(status, tuple(self.finish[k] for k in sorted(self.finish)))
        with anyio.CancelScope(shield=True):
            try:
                await hooks.after_call(usage, self.request, self.info, self.reservation, outcome)
            except Exception:  # the response is decided; a failing recorder must not change it
                log.exception("after_call hook failed for %s", self.info.request_id)


def _upstream_failure(up: UpstreamConfig, what: str) -> APIError:
    return APIError(502, f"upstream {up.name!r} failed: {what}", code="upstream_error")


async def _error_answer(call: _Call, up: UpstreamConfig, resp: httpx.Response) -> Response:
    """A 4xx passes through as the upstream wrote it (the client's request was wrong there too), except
    401/403: those are about the gateway's own key, an operator problem. Those and 5xx become 502; the
    upstream's words go to our log only (they can name our key or the upstream's internals)."""
    await call.settle("error", count=False)
    if resp.status_code >= 500 or resp.status_code in (401, 403):
        log.warning("upstream %s answered %s: %s", up.name, resp.status_code, resp.text[:500])
        what = "it refused the gateway's API key" if resp.status_code < 500 else "it had an internal error"
        raise _upstream_failure(up, f"HTTP {resp.status_code} ({what})")
    return Response(resp.content, status_code=resp.status_code,
                    media_type=resp.headers.get("content-type", "application/json"))


async def proxy(request: Request, body: Any, endpoint: str) -> Response:
    """Serve `body` (a request model the route validated) from the upstream that serves `body.model`."""
    route = upstreams_of(request).get(body.model)
    assert route is not None, "proxy() is only called for upstream models (see serves())"
    await project_policy.refuse_if_local_only(request, body.model)  # before anything is reserved or forwarded
    up = route.upstream
    # What the client sent: only the fields it set (no defaults of ours), its extra fields included.
    # Not the raw body: batch lines call the route in-process, with no body to read.
    payload = body.model_dump(mode="json", exclude_unset=True, by_alias=True)
    payload["model"] = route.model.remote
    stream = bool(getattr(body, "stream", False))
    if stream:  # always metered: a client that did not ask for usage must not stream for free
        payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
    tokenizer = request.app.state.engine.tokenizer
    info = hooks.CallInfo(
        endpoint=endpoint, model=body.model, tier="standard", stream=stream,
        prompt_tokens=await asyncio.to_thread(estimate_prompt_tokens, tokenizer, payload),
        max_output_tokens=max_output_tokens(request, body, payload, body.model),
        num_choices=max(1, getattr(body, "n", 1) or 1),
        request_id=new_id("chatcmpl-" if endpoint.endswith("chat/completions") else "cmpl-"))
    call = _Call(request, info, await hooks.before_call(request, info), tokenizer)  # 402/429/500 unpriced
    out = await _forward(call, upstreams_of(request).client(up), up, endpoint, payload,
                         include_usage=bool(getattr(body, "include_usage", False)))
    out.headers["x-request-id"] = info.request_id  # the ledger's request_id (the openai SDK: `._request_id`)
    return out


async def _forward(call: _Call, client: httpx.AsyncClient, up: UpstreamConfig, endpoint: str,
                   payload: dict[str, Any], include_usage: bool) -> Response:
    headers = {"Authorization": f"Bearer {up.api_key}"} if up.api_key else {}
    stream = call.info.stream
    try:
        resp = await client.send(client.build_request("POST", up.url(endpoint), json=payload, headers=headers),
                                 stream=stream)
        if stream and resp.status_code >= 400:
            try:
                await resp.aread()
            finally:
                await resp.aclose()
    except httpx.HTTPError as exc:
        await call.settle("error", count=False)
        raise _upstream_failure(up, f"{type(exc).__name__} reaching {up.url(endpoint)}") from None
    except BaseException:  # cancelled while waiting (shutdown): the reservation is still settled
        await call.settle("cancelled", count=False)
        raise
    if resp.status_code >= 400:
        return await _error_answer(call, up, resp)
    if stream:
        return EventStreamResponse(_relay(call, up, resp, include_usage), on_close=lambda: _close(call, resp))
    return await _answer(call, up, resp)


async def _answer(call: _Call, up: UpstreamConfig, resp: httpx.Response) -> Response:
    try:
        data = resp.json()
    except ValueError:
        await call.settle("error", count=False)
        log.warning("upstream %s answered %s with non-JSON: %r", up.name, resp.status_code, resp.text[:500])
        raise _upstream_failure(up, "its answer is not JSON") from None
    if isinstance(data, dict):
        call.usage = data.get("usage")
        _collect(data.get("choices"), call.texts, call.finish)
    await call.settle("ok")
    return Response(resp.content, status_code=resp.status_code, media_type="application/json")


async def _close(call: _Call, resp: httpx.Response) -> None:
    """What the relay's own `finally` does, for a relay closed before its first step."""
    with anyio.CancelScope(shield=True):
        await resp.aclose()
    await call.settle("stream_interrupted")


async def _relay(call: _Call, up: UpstreamConfig, resp: httpx.Response, include_usage: bool) -> AsyncIterator[str]:
    """Upstream SSE events to the client as they arrive; usage is recorded, and its chunk dropped
    when the client did not ask for it. Closing this generator closes the upstream request."""
    status = "stream_interrupted"  # unless the upstream finishes: the client broke off
    failed = False  # an in-band error event from the upstream
    events = EventSource(resp).aiter_sse()
    try:
        async for sse in events:
            data = sse.data
            if not data:
                continue  # nothing to relay: a `retry:` or a bare `id:` (comments are dropped by the parser)
            if data == "[DONE]":
                status = "error" if failed else "ok"
                break
            try:
                event = json.loads(data)
            except ValueError:
                event = None
            if isinstance(event, dict):
                if event.get("error"):
                    failed = True
                if event.get("usage"):
                    call.usage = event["usage"]
                    if not include_usage:
                        if not event.get("choices"):
                            continue  # the usage chunk the client never asked for
                        event.pop("usage")
                        data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
                _collect(event.get("choices"), call.texts, call.finish)
            # each line of a multi-line `data` goes out on its own `data:` line, or the frame would break
            yield "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"
        else:  # the upstream ended without [DONE]; complete if it got as far as usage
            status = "ok" if call.usage and not failed else "error"
        yield DONE
    except httpx.HTTPError as exc:  # headers are sent: report in-band, as OpenAI does
        status = "error"
        yield sse_data(error_body(_upstream_failure(up, f"{type(exc).__name__} while streaming"), False))
        yield DONE
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()
            await resp.aclose()
        await call.settle(status)
