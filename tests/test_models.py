"""ChatModel implementations: LocalModel on the embedded engine, OpenAICompatibleModel against a real
local HTTP server that speaks OpenAI's chat completions (JSON and SSE), and the tool-call helpers."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.outputs import Usage
from mainspring.models import Completion, LocalModel, OpenAICompatibleModel, ToolCall, UpstreamError
from mainspring.tool_calls import (ToolChoice, call_schema, openai_messages, openai_tool_choice, openai_tools,
                                   parse_tool_calls, template_messages)
from tests.ports import free_port
from tests.scripted_model import ScriptedModel
from tests.servers import serve

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def run(coro):
    return asyncio.run(coro)


async def collect(agen):
    return [c async for c in agen]


# -- a fake OpenAI endpoint on a real socket ------------------------------------------------------
def _completion_body(content="Paris.", tool_calls=None, finish="stop"):
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "upstream-model",
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107,
                      "prompt_tokens_details": {"cached_tokens": 64}}}


def _sse(events):
    async def gen():
        for e in events:
            yield f"data: {json.dumps(e)}\n\n".encode()
        yield b"data: [DONE]\n\n"
    return StreamingResponse(gen(), media_type="text/event-stream")


def _chunk(delta, finish=None):
    return {"id": "c1", "object": "chat.completion.chunk", "model": "upstream-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


STREAM_EVENTS = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "The capital "}),
    _chunk({"content": "is Paris."}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
    _chunk({}, finish="tool_calls"),
    {"id": "c1", "object": "chat.completion.chunk", "choices": [],
     "usage": {"prompt_tokens": 50, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 32}}},
]


@pytest.fixture(scope="module")
def upstream():
    """`script` is a list of responses to hand out in order; `seen` records (headers, body) per request."""
    state = {"script": [], "seen": []}
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request):
        body = await request.json()
        state["seen"].append((dict(request.headers), body))
        status, payload = state["script"].pop(0)
        if status == "sse":
            return _sse(payload)
        return JSONResponse(payload, status_code=status)

    with serve(app, None) as srv:
        state["url"] = srv.openai_url
        yield state


@pytest.fixture
def remote(upstream):
    upstream["script"].clear()
    upstream["seen"].clear()
    return OpenAICompatibleModel(upstream["url"], api_key="sk-test", model="upstream-model", timeout=10,
                                 max_retries=2, backoff_s=0.01)


def test_remote_chat_text_and_cached_usage(remote, upstream):
    upstream["script"].append((200, _completion_body()))
    out = run(remote.chat([{"role": "user", "content": "Capital of France?"}], max_tokens=16, temperature=0,
                          seed=3, stop=["\n"]))
    assert out == Completion("Paris.", [], "stop", Usage(100, 64, 7), "upstream-model")
    headers, body = upstream["seen"][0]
    assert headers["authorization"] == "Bearer sk-test"
    assert body["model"] == "upstream-model" and body["max_tokens"] == 16 and body["seed"] == 3
    assert body["stop"] == ["\n"] and "tools" not in body and "stream" not in body


def test_remote_tool_calls(remote, upstream):
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]
    upstream["script"].append((200, _completion_body(content=None, tool_calls=calls, finish="tool_calls")))
    out = run(remote.chat([{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER], tool_choice="auto"))
    assert out.tool_calls == [ToolCall("call_1", "get_weather", '{"city":"Oslo"}')]
    assert out.text == "" and out.finish_reason == "tool_calls"
    assert upstream["seen"][0][1]["tools"] == [WEATHER] and upstream["seen"][0][1]["tool_choice"] == "auto"
    assert out.to_message()["tool_calls"][0]["function"]["name"] == "get_weather"


def test_remote_stream(remote, upstream):
    upstream["script"].append(("sse", STREAM_EVENTS))
    chunks = run(collect(remote.stream([{"role": "user", "content": "hi"}])))
    assert "".join(c.delta_text for c in chunks) == "The capital is Paris."
    last = chunks[-1]
    assert last.finish_reason == "tool_calls" and last.usage == Usage(50, 32, 9)
    assert last.tool_calls == [ToolCall("call_a", "get_weather", '{"city": "Paris"}')]
    assert all(c.finish_reason is None for c in chunks[:-1])
    body = upstream["seen"][0][1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_remote_retries_500_then_succeeds(remote, upstream):
    upstream["script"] += [(500, {"error": {"message": "overloaded"}}), (503, {}), (200, _completion_body())]
    out = run(remote.chat([{"role": "user", "content": "x"}]))
    assert out.text == "Paris." and len(upstream["seen"]) == 3


def test_remote_stream_retries_before_first_byte(remote, upstream):
    upstream["script"] += [(429, {"error": {"message": "slow down"}}), ("sse", STREAM_EVENTS)]
    chunks = run(collect(remote.stream([{"role": "user", "content": "x"}])))
    assert chunks[-1].usage == Usage(50, 32, 9) and len(upstream["seen"]) == 2


def test_remote_400_is_upstream_error_without_retry(remote, upstream):
    upstream["script"].append((400, {"error": {"message": "messages must not be empty", "type": "invalid_request"}}))
    with pytest.raises(UpstreamError) as e:
        run(remote.chat([]))
    assert e.value.status == 400 and e.value.message == "messages must not be empty"
    assert "400" in str(e.value) and len(upstream["seen"]) == 1


def test_remote_retries_are_bounded(remote, upstream):
    upstream["script"] += [(500, {"error": {"message": "down"}})] * 3
    with pytest.raises(UpstreamError) as e:
        run(remote.chat([{"role": "user", "content": "x"}]))
    assert e.value.status == 500 and e.value.message == "down" and len(upstream["seen"]) == 3  # 1 + 2 retries


def test_remote_unreachable():
    model = OpenAICompatibleModel(f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=1, backoff_s=0.01)
    with pytest.raises(UpstreamError) as e:
        run(model.chat([{"role": "user", "content": "x"}]))
    assert e.value.status is None and "unreachable" in str(e.value)


# -- tool-call helpers and the scripted model ------------------------------------------------------
def test_parse_tool_calls():
    tools = openai_tools([WEATHER])
    _, [call] = parse_tool_calls('```json\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n```', tools)
    assert call.name == "get_weather" and json.loads(call.arguments_json) == {"city": "Rome"}
    assert call.id.startswith("call_")
    assert len(parse_tool_calls('[{"name":"get_weather","arguments":"{}"},{"name":"get_weather"}]', tools)[1]) == 2
    assert parse_tool_calls("The weather is nice.", tools) == ("The weather is nice.", [])
    assert parse_tool_calls('{"name": "rm_rf", "arguments": {}}', tools)[1] == []


def test_tool_schema_and_local_messages():
    tools = openai_tools([WEATHER])
    schema = call_schema(tools, ToolChoice("required"))
    assert schema["properties"]["name"] == {"const": "get_weather"}
    # only declared arguments: a grammar-led small model would otherwise invent properties forever
    assert schema["properties"]["arguments"]["additionalProperties"] is False
    assert "additionalProperties" not in WEATHER["function"]["parameters"]  # the caller's tool is untouched
    msgs, native = template_messages(openai_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]), tools, openai_tool_choice(None, tools), chat_template="{{ messages }}")  # a template without tools
    assert native is None
    # the tools first, then the system text (prompts of runs with other system texts share the tools)
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("# Tools")
    assert msgs[0]["content"].endswith("\n\nBe brief.")
    assert msgs[1]["content"] == "Weather?"
    assert msgs[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert msgs[3]["role"] == "user" and 'name="get_weather"' in msgs[3]["content"]
    assert msgs[3]["content"].endswith("sunny\n</tool_response>")


def test_scripted_model():
    m = ScriptedModel(["hello there", ToolCall("c1", "get_weather", "{}"), RuntimeError("boom")])
    assert run(m.chat([{"role": "user", "content": "hi"}])).text == "hello there"
    chunks = run(collect(m.stream([{"role": "user", "content": "hi"}], tools=[WEATHER])))
    assert chunks[-1].tool_calls[0].name == "get_weather" and chunks[-1].finish_reason == "tool_calls"
    with pytest.raises(RuntimeError, match="boom"):
        run(m.chat([]))
    with pytest.raises(AssertionError, match="ran out"):
        run(m.chat([]))
    assert m.calls[1]["tools"] == [WEATHER]


# -- LocalModel on the embedded engine ----------------------------------------------------------------
@pytest.fixture(scope="module")
def local(embedded):
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=256)))
    yield LocalModel(engine)
    engine.close()


PARIS = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.slow
def test_local_chat_and_stream(local):
    out = run(local.chat(PARIS, max_tokens=24, temperature=0))
    assert "Paris" in out.text and out.tool_calls == [] and out.model == local.model
    assert out.usage.prompt_tokens > 5 and 0 < out.usage.completion_tokens <= 24
    chunks = run(collect(local.stream(PARIS, max_tokens=24, temperature=0)))
    assert "".join(c.delta_text for c in chunks) == out.text
    assert (chunks[-1].finish_reason == out.finish_reason
            and chunks[-1].usage.completion_tokens == out.usage.completion_tokens)
    assert chunks[-1].usage.cached_tokens > 0  # the same prompt again: its full blocks come from the prefix cache


@pytest.mark.slow
def test_local_required_tool_call_is_guided(local):
    msgs = [{"role": "user", "content": "What's the weather in Rome?"}]
    out = run(local.chat(msgs, tools=[WEATHER], tool_choice="required", max_tokens=48, temperature=0))
    assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1
    assert out.tool_calls[0].name == "get_weather" and isinstance(json.loads(out.tool_calls[0].arguments)["city"], str)


@pytest.mark.slow
def test_local_json_object_and_bad_tool_choice(local):
    out = run(local.chat([{"role": "user", "content": "Give me a JSON object describing a cat."}],
                         response_format={"type": "json_object"}, max_tokens=64, temperature=0))
    if out.finish_reason == "stop":  # a length cut leaves the object unfinished
        assert isinstance(json.loads(out.text), dict)
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"],
              "additionalProperties": False}
    out = run(local.chat(PARIS, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
                         max_tokens=32, temperature=0))
    assert out.finish_reason == "stop" and set(json.loads(out.text)) == {"capital"}
    with pytest.raises(InvalidRequestError):
        run(local.chat(PARIS, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}))
    with pytest.raises(InvalidRequestError):
        run(local.chat(PARIS, response_format={"type": "json_schema", "json_schema": {"name": "no schema"}}))
