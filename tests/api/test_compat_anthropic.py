"""Anthropic SDK compatibility: structured outputs (`messages.parse`, `output_config.format`) and
`messages.count_tokens`, through the official `anthropic` SDK against a real server."""

from __future__ import annotations

import json

import anthropic
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.slow

GREEDY = {"extra_body": {"temperature": 0}}  # this SDK version has no temperature argument
ASK = [{"role": "user", "content": "Marie Curie was born in 1867 in Warsaw. Describe her."}]
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class Place(BaseModel):
    city: str
    country: str


class Scientist(BaseModel):
    name: str
    born: int
    birthplace: Place  # a nested model: $defs in the schema the SDK sends


def test_messages_parse_returns_the_model(ant):
    r = ant.messages.parse(model="smollm2", max_tokens=200, messages=ASK, output_format=Scientist, **GREEDY)
    assert r.stop_reason == "end_turn"
    assert isinstance(r.parsed_output, Scientist)
    # without enforcement this 135M model answers in prose: the output is the schema's JSON
    Scientist.model_validate_json(r.content[0].text)


def test_output_config_format_streamed(ant):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
              "required": ["answer", "sure"], "additionalProperties": False}
    with ant.messages.stream(model="smollm2", max_tokens=100, messages=[{"role": "user", "content": "Capital of "
                             "France?"}], output_config={"format": {"type": "json_schema", "schema": schema}},
                             **GREEDY) as stream:
        text = "".join(stream.text_stream)
    assert set(json.loads(text)) == {"answer", "sure"}


def test_output_format_of_another_type_is_a_400(ant):
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model="smollm2", max_tokens=10, messages=ASK,
                            output_config={"format": {"type": "xml", "schema": {}}})


def test_count_tokens_is_what_messages_uses(ant):
    system = "You are a terse assistant."
    cases = [dict(messages=ASK), dict(messages=ASK, system=system),
             dict(messages=ASK, system=system, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}),
             dict(messages=[*ASK, {"role": "assistant", "content": "She was"}])]  # a prefill counts too
    counts = []
    for case in cases:
        counted = ant.messages.count_tokens(model="smollm2", **case).input_tokens
        used = ant.messages.create(model="smollm2", max_tokens=1, **GREEDY, **case).usage
        assert counted == used.input_tokens + used.cache_read_input_tokens  # Anthropic counts cached apart
        counts.append(counted)
    # the template's own default system prompt is longer than ours, so only these orders are certain
    assert counts[2] > counts[1] and counts[3] > counts[0]


def test_count_tokens_errors(ant):
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.count_tokens(model="claude-nope", messages=ASK)
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.count_tokens(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice={"type": "maybe"})
