"""ChatModel: the one interface the agent runtime uses to talk to a model.

`LocalModel` runs the embedded engine; `OpenAICompatibleModel` calls any OpenAI-compatible
/v1/chat/completions endpoint; `ScriptedModel` (tests only) replays canned answers. All three take
OpenAI-shaped messages and tools and return the same `Completion` with the engine's normalized
`Usage`, so billing prices a run the same way whichever model served it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

import httpx

from mainspring.tool_calls import call_items
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.json_schema import prepare_schema
from mainspring.engine.outputs import Usage
from mainspring.engine.params import SamplingParams

if TYPE_CHECKING:
    from mainspring.engine.async_engine import AsyncLLMEngine

Message = dict[str, Any]  # OpenAI chat message: role, content, tool_calls, tool_call_id, name
Tool = dict[str, Any]  # OpenAI tool: {"type": "function", "function": {name, description, parameters}}


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, exactly as OpenAI returns it; the caller validates it


@dataclass
class Completion:
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None  # "stop" | "length" | "tool_calls" | "abort" | upstream's own
    usage: Usage
    model: str

    def to_message(self) -> Message:
        """The assistant message to append to the conversation for the next turn."""
        msg: Message = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls]
        return msg


@dataclass
class CompletionChunk:
    """Text as it is produced; the last chunk carries finish_reason, usage and any tool calls."""

    delta_text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


class UpstreamError(RuntimeError):
    """An OpenAI-compatible endpoint answered with an error (or not at all: status None)."""

    def __init__(self, status: int | None, message: str, body: Any = None) -> None:
        super().__init__(f"upstream {'error ' + str(status) if status else 'unreachable'}: {message}")
        self.status, self.message, self.body = status, message, body


class ChatModel(ABC):
    model: str

    @abstractmethod
    async def chat(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                   response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                   seed: int | None = None, stop: list[str] | str | None = None) -> Completion: ...

    @abstractmethod
    def stream(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
               response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
               seed: int | None = None, stop: list[str] | str | None = None) -> AsyncIterator[CompletionChunk]: ...

    async def aclose(self) -> None:
        """Release connections; the base model holds none."""


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# -- tools for the local model ---------------------------------------------------------------------
def _functions(tools: list[Tool]) -> list[dict]:
    """The function specs of OpenAI tools (bare {"name", "parameters"} dicts are accepted too)."""
    out = []
    for t in tools:
        f = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise InvalidRequestError("each tool must be {'type': 'function', 'function': {'name': ...}}")
        out.append(f)
    return out


def _select(functions: list[dict], tool_choice: Any) -> tuple[str, list[dict]]:
    """-> (mode, candidate functions): mode "none" | "auto" | "required"; a named choice is required."""
    if not functions or tool_choice == "none":
        return "none", []
    if tool_choice in (None, "auto"):
        return "auto", functions
    if tool_choice == "required":
        return "required", functions
    if isinstance(tool_choice, dict):  # {"type":"function","function":{"name":X}} or Responses' {"name":X}
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        picked = [f for f in functions if f["name"] == name]
        if not picked:
            raise InvalidRequestError(f"tool_choice names {name!r}, which is not among the tools")
        return "required", picked
    raise InvalidRequestError(f"invalid tool_choice {tool_choice!r}")


def _closed(params: dict | None) -> dict:
    # JSON Schema allows unlisted properties by default, and a small model under a grammar happily
    # invents them forever; like OpenAI's strict mode, arguments get only the declared properties.
    params = dict(params or {"type": "object"})
    if "properties" in params and "additionalProperties" not in params:
        params["additionalProperties"] = False
    return params


def tool_call_schema(functions: list[dict]) -> dict:
    """JSON schema of one call {"name": ..., "arguments": {...}} to any of `functions`; each one's
    parameters move under /properties/arguments, so their local $refs are rebased there."""
    def at(i: int) -> str:
        return ("" if len(functions) == 1 else f"/anyOf/{i}") + "/properties/arguments"

    options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": f["name"]},
                               "arguments": prepare_schema(_closed(f.get("parameters")), at=at(i))}}
               for i, f in enumerate(functions)]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _tools_prompt(functions: list[dict], required: bool) -> str:
    lines = ["You can call these tools:"]
    for f in functions:
        lines.append(json.dumps({"name": f["name"], "description": f.get("description", ""),
                                 "parameters": f.get("parameters") or {"type": "object"}}))
    lines.append('To call a tool, reply with only a JSON object: {"name": <tool name>, "arguments": {...}}.'
                 + ("" if required else " Otherwise answer normally."))
    return "\n".join(lines)


def parse_tool_calls(text: str, names: set[str]) -> list[ToolCall]:
    """Tool calls if the whole reply is a JSON call (or a list of them) to known tools, else []."""
    s = text.strip()
    if s.startswith("```"):  # small models like to fence JSON
        s = s.strip("`").removeprefix("json").strip()
    try:
        value, end = json.JSONDecoder().raw_decode(s)
    except ValueError:
        return []
    if s[end:].strip():
        return []
    return [ToolCall(new_call_id(), name, json.dumps(args)) for name, args in call_items(value, names)]


def _text_content(content: Any) -> str:
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _local_messages(messages: list[Message], tools_prompt: str | None) -> list[Message]:
    """OpenAI messages -> plain role/content turns any chat template renders.

    Tool calls are written the way the model is asked to write them, and tool results become user
    turns, because many templates (SmolLM2's included) know nothing of tool roles.
    """
    out: list[Message] = []
    for m in messages:
        role, content = m.get("role"), _text_content(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                f = c.get("function", c) if isinstance(c, dict) else {"name": c.name, "arguments": c.arguments}
                try:
                    args = json.loads(f.get("arguments") or "{}")
                except ValueError:
                    args = f.get("arguments")
                calls.append({"name": f.get("name"), "arguments": args})
            content = "\n".join(x for x in (content, json.dumps(calls[0] if len(calls) == 1 else calls)) if x)
        elif role == "tool":
            role, content = "user", f"Tool result ({m.get('name') or m.get('tool_call_id', 'call')}):\n{content}"
        out.append({"role": role, "content": content})
    if tools_prompt:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tools_prompt}
        else:
            out.insert(0, {"role": "system", "content": tools_prompt})
    return out


class LocalModel(ChatModel):
    """The embedded engine behind ChatModel: chat template, SamplingParams, guided JSON for tools."""

    def __init__(self, engine: AsyncLLMEngine, model: str | None = None, cache_salt: str | None = None) -> None:
        self.engine = engine
        self.model = model or engine.engine.name
        self.cache_salt = cache_salt  # tenant isolation of the prefix cache

    def _prepare(self, messages, tools, tool_choice, response_format, max_tokens, temperature, seed, stop):
        mode, functions = _select(_functions(tools or []), tool_choice)
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, stop=stop or [])
        if mode == "required":
            params.guided_json = tool_call_schema(functions)
        elif response_format:
            kind = response_format.get("type")
            if kind == "json_schema":
                spec = response_format.get("json_schema") or {}
                params.guided_json = spec.get("schema") if isinstance(spec, dict) else None
                if not isinstance(params.guided_json, dict):
                    raise InvalidRequestError("response_format json_schema needs a 'schema' object")
            elif kind == "json_object":
                params.guided_json_object = True
            elif kind not in (None, "text"):
                raise InvalidRequestError(f"unsupported response_format type {kind!r}")
        tools_prompt = _tools_prompt(functions, mode == "required") if functions else None
        prompt = self.engine.tokenizer.apply_chat_template(_local_messages(messages, tools_prompt))
        return prompt, params, {f["name"] for f in functions}

    def _finish(self, text: str, reason: str | None, usage: Usage | None, names: set[str]) -> Completion:
        calls = parse_tool_calls(text, names) if names else []
        return Completion("" if calls else text, calls, "tool_calls" if calls else reason,
                          usage or Usage(0, 0, 0), self.model)

    async def chat(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                   response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                   seed: int | None = None, stop: list[str] | str | None = None) -> Completion:
        prompt, params, names = self._prepare(messages, tools, tool_choice, response_format, max_tokens,
                                              temperature, seed, stop)
        out = await self.engine.generate(prompt, params, cache_salt=self.cache_salt)
        return self._finish(out.text, out.finish_reason, out.usage, names)

    async def stream(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                     response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                     seed: int | None = None, stop: list[str] | str | None = None) -> AsyncIterator[CompletionChunk]:
        prompt, params, names = self._prepare(messages, tools, tool_choice, response_format, max_tokens,
                                              temperature, seed, stop)
        async for out in self.engine.stream(prompt, params, cache_salt=self.cache_salt):
            # With tools we cannot tell text from a JSON call until the end, so nothing is streamed early.
            if out.delta_text and not names:
                yield CompletionChunk(out.delta_text)
            if out.finished:
                done = self._finish(out.text, out.finish_reason, out.usage, names)
                yield CompletionChunk(done.text if names else "", done.finish_reason, done.usage, done.tool_calls)


# -- any OpenAI-compatible endpoint ---------------------------------------------------------------
def _usage(u: dict | None) -> Usage:
    u = u or {}
    details = u.get("prompt_tokens_details") or {}
    return Usage(int(u.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0),
                 int(u.get("completion_tokens") or 0))


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
        return min(self.backoff_s * 2 ** attempt, 8.0)

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
        return Completion(_text_content(msg.get("content")), calls, choice.get("finish_reason"),
                          _usage(body.get("usage")), body.get("model") or self.model)

    async def stream(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                     response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                     seed: int | None = None, stop: list[str] | str | None = None) -> AsyncIterator[CompletionChunk]:
        payload = self._payload(messages, tools, tool_choice, response_format, max_tokens, temperature, seed,
                                stop, stream=True)
        resp = await self._send(payload, stream=True)
        finish, usage, calls = None, None, {}  # calls: index -> [id, name, arguments so far]
        try:
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, comments (": keep-alive"), event: lines
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except ValueError as e:
                    raise UpstreamError(resp.status_code, f"malformed stream event: {data[:200]}") from e
                if "error" in event:
                    raise UpstreamError(resp.status_code, _error_message(event, data), event)
                if event.get("usage"):
                    usage = _usage(event["usage"])
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
        finally:
            await resp.aclose()
        tool_calls = [ToolCall(i or new_call_id(), n, a or "{}") for i, n, a in (calls[k] for k in sorted(calls))]
        yield CompletionChunk("", finish, usage, tool_calls)


# -- tests only -------------------------------------------------------------------------------------
class ScriptedModel(ChatModel):
    """TEST-ONLY: replays `responses` in order (str, Completion, ToolCall, list[ToolCall] or an
    exception to raise) and records every call's arguments in `calls`. Usage counts words, not tokens.
    """

    def __init__(self, responses: list[Any], model: str = "scripted") -> None:
        self.responses, self.model, self.calls = list(responses), model, []

    def _next(self, messages: list[Message], kwargs: dict) -> Completion:
        self.calls.append({"messages": messages, **kwargs})
        if not self.responses:
            raise AssertionError(f"ScriptedModel ran out of responses after {len(self.calls) - 1} calls")
        r = self.responses.pop(0)
        if isinstance(r, BaseException):
            raise r
        if isinstance(r, Completion):
            return r
        prompt = sum(len(_text_content(m.get("content")).split()) for m in messages)
        calls = [r] if isinstance(r, ToolCall) else r if isinstance(r, list) else []
        text = r if isinstance(r, str) else ""
        return Completion(text, calls, "tool_calls" if calls else "stop",
                          Usage(prompt, 0, max(1, len(text.split()))), self.model)

    async def chat(self, messages: list[Message], **kwargs: Any) -> Completion:
        return self._next(messages, kwargs)

    async def stream(self, messages: list[Message], **kwargs: Any) -> AsyncIterator[CompletionChunk]:
        done = self._next(messages, kwargs)
        words = done.text.split(" ") if done.text else []
        for i, w in enumerate(words):
            yield CompletionChunk(w if i == len(words) - 1 else w + " ")
        yield CompletionChunk("", done.finish_reason, done.usage, done.tool_calls)
