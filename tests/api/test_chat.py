"""/v1/chat/completions and /v1/models through the official `openai` SDK against a real server."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pytest

from mainspring.api import hooks
from mainspring.tool_calls import ToolCallStream, ToolSpec, parse_tool_calls

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                        "required": ["tz"]}}}


# ---- with the model -------------------------------------------------------------------------------
@pytest.mark.slow
def test_models_lists_each_model_and_its_fast_variant(oai):
    models = {m.id: m for m in oai.models.list().data}
    assert set(models) == {"SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-fast"}
    assert models["SmolLM2-135M-Instruct-fast"].model_extra["tier"] == "fast"
    assert oai.models.retrieve("smollm2").id == "SmolLM2-135M-Instruct"


@pytest.mark.slow
def test_plain_chat(oai):
    r = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32)
    assert "Paris" in r.choices[0].message.content
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.created > 0
    assert r.model == "SmolLM2-135M-Instruct" and r.system_fingerprint
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.role == "assistant"
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 32
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and u.prompt_tokens_details.cached_tokens >= 0


@pytest.mark.slow
def test_stream_concatenates_to_the_greedy_answer(oai):
    args = dict(model="SmolLM2-135M-Instruct-fast", messages=QUESTION, temperature=0, max_completion_tokens=24)
    plain = oai.chat.completions.create(**args)
    chunks = list(oai.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == plain.usage.completion_tokens
    assert last.usage.prompt_tokens == plain.usage.prompt_tokens and last.model == "SmolLM2-135M-Instruct-fast"
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.slow
def test_n_choices_with_seed_use_seed_plus_i(oai):
    args = dict(model="smollm2", messages=[{"role": "user", "content": "Write a short poem about rain."}],
                temperature=1.0, max_tokens=16)
    two = oai.chat.completions.create(**args, n=2, seed=7)
    assert [c.index for c in two.choices] == [0, 1]
    second = oai.chat.completions.create(**args, seed=8)  # choice 1 of seed 7 is sampled with seed 8
    assert two.choices[1].message.content == second.choices[0].message.content
    again = oai.chat.completions.create(**args, n=2, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in two.choices]
    assert two.usage.prompt_tokens == second.usage.prompt_tokens  # one prompt, counted once for n choices


@pytest.mark.slow
def test_stop_string_ends_the_answer_before_it(oai):
    r = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32, stop=["Paris"])
    assert "Paris" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    r = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=32,
                                    stop=" France", stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
    assert "France" not in text


@pytest.mark.slow
def test_logprobs_in_openai_shape(oai):
    r = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=8, logprobs=True,
                                    top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and bytes(t.bytes).decode("utf-8", "replace")
        assert t.logprob == pytest.approx(max(a.logprob for a in t.top_logprobs), abs=1e-4)  # greedy took the best
    stream = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=8,
                                         logprobs=True, stream=True)
    streamed = [t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]


@pytest.mark.slow
def test_repeated_long_prompt_reports_cached_tokens(oai):
    system = "You are a meticulous assistant for a travel agency. " + " ".join(
        f"Rule {i}: always check the visa requirements, opening hours and prices for destination number {i}."
        for i in range(30))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Suggest a weekend trip."}]
    first = oai.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=4)
    assert first.usage.prompt_tokens > 550
    second = oai.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=4)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens - 16 <= cached < second.usage.prompt_tokens  # all but the last partial block


@pytest.mark.slow
def test_json_schema_response_format(oai):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = oai.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give the largest city of France as JSON."}],
        temperature=0, max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


@pytest.mark.slow
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call(oai, tool_choice):
    msgs = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    r = oai.chat.completions.create(model="smollm2", messages=msgs, tools=[WEATHER, TIME], tool_choice=tool_choice,
                                    temperature=0, max_tokens=60)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    if isinstance(tool_choice, dict):
        assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.slow
def test_forced_tool_call_streams_as_tool_call_deltas(oai):
    stream = oai.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0, max_tokens=60,
        stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)


@pytest.mark.slow
def test_tool_results_in_the_conversation_render(oai):
    msgs = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "-3 degrees, snow"}]
    r = oai.chat.completions.create(model="smollm2", messages=msgs, tools=[WEATHER], tool_choice="none",
                                    temperature=0, max_tokens=16)
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.slow
def test_client_disconnect_aborts_the_engine_request_and_settles(server, monkeypatch):
    settled = []

    async def after_call(usage, request, info, reservation, outcome):
        settled.append((usage, info, outcome))

    monkeypatch.setattr(hooks, "after_call", after_call)
    body = {"model": "smollm2", "messages": QUESTION, "max_tokens": 2000, "min_tokens": 2000, "stream": True}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{server.openai_url}/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [line for line, _ in zip(lines, range(8)) if line.startswith("data:")]
            assert got
    engine = server.engine.engine
    deadline = time.monotonic() + 10
    while (engine.num_requests or not settled) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_requests == 0  # aborted, not left running to 2000 tokens
    ((usage, info, outcome),) = settled
    assert outcome.status == "stream_interrupted" and info.stream and info.endpoint == "/v1/chat/completions"
    assert 0 < usage.completion_tokens < 2000 and usage.prompt_tokens == info.prompt_tokens


@pytest.mark.slow
def test_client_leaving_a_non_streamed_call_aborts_it(server, monkeypatch):
    settled = []

    async def after_call(usage, request, info, reservation, outcome):
        settled.append(outcome.status)

    monkeypatch.setattr(hooks, "after_call", after_call)
    body = {"model": "smollm2", "messages": QUESTION, "max_tokens": 2000, "min_tokens": 2000, "n": 2}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.openai_url}/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.5))
    engine = server.engine.engine
    deadline = time.monotonic() + 10
    while (engine.num_requests or not settled) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_requests == 0 and settled == ["cancelled"]


@pytest.mark.slow
def test_auto_tool_choice_answers_or_calls(oai):
    r = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                    tools=[WEATHER], temperature=0, max_tokens=48)
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == "get_weather"
        assert isinstance(json.loads(c.message.tool_calls[0].function.arguments), dict)
    else:
        assert c.message.content and c.finish_reason in ("stop", "length")


@pytest.mark.slow
def test_hooks_called_once_per_call_with_summed_usage(oai, monkeypatch):
    calls = []

    async def before_call(request, info):
        calls.append(("before", info))
        return "reservation-1"

    async def after_call(usage, request, info, reservation, outcome):
        calls.append(("after", usage, reservation, outcome))

    monkeypatch.setattr(hooks, "before_call", before_call)
    monkeypatch.setattr(hooks, "after_call", after_call)
    r = oai.chat.completions.create(model="smollm2-fast", messages=QUESTION, temperature=0, max_tokens=6, n=2)
    (_, info), (_, usage, reservation, outcome) = calls
    assert info.tier == "fast" and info.num_choices == 2 and info.max_output_tokens == 12
    assert reservation == "reservation-1" and outcome.status == "ok"
    assert usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens


# ---- tool-call parsing, no model ----------------------------------------------------------------------
TOOLS = [ToolSpec("get_weather"), ToolSpec("get_time")]


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    '```json\n{"name": "get_weather", "parameters": {"city": "Oslo"}}\n```',
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>',
])
def test_parse_tool_calls_accepts_the_usual_shapes(text):
    content, calls = parse_tool_calls(text, TOOLS)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert content in (None, "Let me check.") and calls[0].id.startswith("call_")


@pytest.mark.parametrize("text", ["Paris is the capital.", '{"name": "unknown", "arguments": {}}', '{"name": "get_'])
def test_parse_tool_calls_leaves_other_text_alone(text):
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_tool_call_stream_passes_content_and_holds_calls():
    s = ToolCallStream(TOOLS)
    out = "".join(s.feed(d) for d in ["It is ", "sunny <tool", "_call>\n{\"name\": \"get_time\", ",
                                      "\"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>"])
    assert out == "It is sunny "
    rest, calls = s.finish()
    assert rest == "" and [c.name for c in calls] == ["get_time"]
    plain = ToolCallStream(TOOLS)
    assert "".join(plain.feed(d) for d in ["Hello", " <b>", " world"]) + plain.finish()[0] == "Hello <b> world"
