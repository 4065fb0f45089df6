"""/v1/messages (Anthropic Messages API) through the official `anthropic` SDK against a real server."""

from __future__ import annotations

import jsonschema
import pytest

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"extra_body": {"temperature": 0}}  # this SDK version no longer has a temperature argument
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_plain_message(ant):
    m = ant.messages.create(model="smollm2", max_tokens=32, **GREEDY, messages=QUESTION)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == "SmolLM2-135M-Instruct" and m.content[0].type == "text" and "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    u = m.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 32
    assert u.cache_creation_input_tokens == 0 and u.cache_read_input_tokens >= 0


def test_stream_events_and_final_message(ant):
    plain = ant.messages.create(model="smollm2", max_tokens=24, **GREEDY, messages=QUESTION)
    with ant.messages.stream(model="smollm2", max_tokens=24, **GREEDY, messages=QUESTION) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(types)
    assert final.content[0].text == plain.content[0].text and final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    total = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert total == plain.usage.input_tokens + plain.usage.cache_read_input_tokens


def test_system_cache_and_stop_sequence(ant):
    system = [{"type": "text", "text": "You answer geography questions. " + " ".join(
        f"Fact {i}: rivers, mountains and capitals of region {i} matter." for i in range(40))}]
    first = ant.messages.create(model="smollm2", max_tokens=16, **GREEDY, system=system, messages=QUESTION)
    second = ant.messages.create(model="smollm2", max_tokens=16, **GREEDY, system=system, messages=QUESTION,
                                 stop_sequences=["Paris"])
    assert second.usage.cache_read_input_tokens > 400
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == \
        first.usage.input_tokens + first.usage.cache_read_input_tokens
    if "Paris" in first.content[0].text:
        assert second.stop_reason == "stop_sequence" and second.stop_sequence == "Paris"
        assert "Paris" not in second.content[0].text


def test_speed_fast_uses_the_fast_variant(ant):
    m = ant.messages.create(model="smollm2", max_tokens=4, speed="fast", messages=QUESTION, **GREEDY)
    assert m.model == "SmolLM2-135M-Instruct-fast" and m.usage.speed == "fast"


def test_prefill_continues_the_assistant_turn(ant):
    m = ant.messages.create(model="smollm2", max_tokens=8, **GREEDY,
                            messages=QUESTION + [{"role": "assistant", "content": "The capital of France is"}])
    assert "Paris" in m.content[0].text and not m.content[0].text.startswith("The capital")


def test_forced_tool_use_and_tool_result_round_trip(ant):
    m = ant.messages.create(model="smollm2", max_tokens=60, **GREEDY, tools=[WEATHER],
                            tool_choice={"type": "tool", "name": "get_weather"},
                            messages=[{"role": "user", "content": "What's the weather in Paris?"}])
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses, m.content
    assert m.stop_reason == "tool_use" and uses[0].id.startswith("toolu_") and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    reply = ant.messages.create(model="smollm2", max_tokens=16, **GREEDY, tools=[WEATHER], messages=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 C, sunny"}]}])
    assert reply.content and reply.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_streamed_tool_use(ant):
    with ant.messages.stream(model="smollm2", max_tokens=60, **GREEDY, tools=[WEATHER],
                             tool_choice={"type": "any"},
                             messages=[{"role": "user", "content": "Weather in Rome?"}]) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses, final.content
    assert final.stop_reason == "tool_use"
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
