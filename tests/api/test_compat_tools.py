"""SDK compatibility of tools and schemas: Pydantic's $defs/$ref schemas under every constrained path,
and a forced call that max_tokens cuts off coming back as a partial call, never as content."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from mainspring.tool_calls import ToolChoice, ToolSpec, call_schema

pytestmark = pytest.mark.slow


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    address: Address


class Node(BaseModel):  # recursive: its schema refers to itself through $defs
    label: str
    children: list[Node]


ASK = [{"role": "user", "content": "Save Marie Curie, who lived in Paris, France."}]
GREEDY = {"extra_body": {"temperature": 0}}  # the anthropic SDK no longer has a temperature argument


def openai_tool(name: str, model: type[BaseModel]) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"Save a {name}",
                                             "parameters": model.model_json_schema()}}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}


def test_pydantic_schema_really_uses_refs():
    schema = Person.model_json_schema()
    assert "$defs" in schema and schema["properties"]["address"] == {"$ref": "#/$defs/Address"}


def test_call_schema_rebases_refs_under_the_wrapper():
    tools = [ToolSpec("person", "", Person.model_json_schema()), ToolSpec("node", "", Node.model_json_schema())]
    one = call_schema(tools, ToolChoice("named", "person"))
    assert one["properties"]["arguments"]["properties"]["address"] == {"$ref": "#/properties/arguments/$defs/Address"}
    both = call_schema(tools, ToolChoice("required"))
    node = both["anyOf"][1]["properties"]["arguments"]
    assert node["$defs"]["Node"]["properties"]["children"]["items"] == {
        "$ref": "#/anyOf/1/properties/arguments/$defs/Node"}
    # nested models are closed too, so a small model cannot invent keys inside them
    assert one["properties"]["arguments"]["$defs"]["Address"]["additionalProperties"] is False


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "save_person"}}])
def test_openai_forced_call_with_defs(oai, tool_choice):
    r = oai.chat.completions.create(model="smollm2", messages=ASK, temperature=0, max_tokens=160,
                                    tools=[openai_tool("save_person", Person), WEATHER], tool_choice=tool_choice)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    if tool_choice != "required":
        assert call.function.name == "save_person"
    if call.function.name == "save_person":
        Person.model_validate_json(call.function.arguments)  # nested model included


def test_recursive_schema_is_served(oai):
    r = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Make a tiny tree."}],
                                    temperature=0, max_tokens=80, tools=[openai_tool("save_tree", Node)],
                                    tool_choice="required")
    c = r.choices[0]
    (call,) = c.message.tool_calls
    assert call.function.name == "save_tree" and c.message.content is None
    if c.finish_reason == "tool_calls":
        Node.model_validate_json(call.function.arguments)
    else:  # a deep tree may not fit: then it is a partial call cut by max_tokens
        assert c.finish_reason == "length"


def test_anthropic_any_with_defs(ant):
    tools = [{"name": "save_person", "description": "Save a person", "input_schema": Person.model_json_schema()}]
    r = ant.messages.create(model="smollm2", max_tokens=160, **GREEDY, messages=ASK, tools=tools,
                            tool_choice={"type": "any"})
    assert r.stop_reason == "tool_use"
    (block,) = [b for b in r.content if b.type == "tool_use"]
    Person.model_validate(block.input)


def test_response_format_and_guided_json_with_defs(oai):
    parsed = oai.chat.completions.parse(model="smollm2", messages=ASK, temperature=0, max_tokens=160,
                                        response_format=Person)
    assert isinstance(parsed.choices[0].message.parsed, Person)
    r = oai.chat.completions.create(model="smollm2", messages=ASK, temperature=0, max_tokens=160,
                                    extra_body={"guided_json": Person.model_json_schema()})
    Person.model_validate_json(r.choices[0].message.content)


def test_a_remote_ref_is_a_clear_400(oai):
    import openai

    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "https://example.com/x.json"}}}}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8, tools=[tool], tool_choice="required")
    assert "only local references" in e.value.message and e.value.param == "tools"


# ---- a forced call cut off by max_tokens -----------------------------------------------------------
NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_cut_call_is_a_partial_tool_call(oai):
    full = oai.chat.completions.create(model="smollm2", messages=WEATHER_ASK, temperature=0, max_tokens=64,
                                       tools=[WEATHER], tool_choice=NAMED)
    assert full.choices[0].finish_reason == "tool_calls"
    complete = full.choices[0].message.tool_calls[0].function.arguments
    cut = full.usage.completion_tokens - 3  # inside the arguments: the last tokens close them
    r = oai.chat.completions.create(model="smollm2", messages=WEATHER_ASK, temperature=0, max_tokens=cut,
                                    tools=[WEATHER], tool_choice=NAMED)
    c = r.choices[0]
    assert c.finish_reason == "length" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather" and call.id
    args = call.function.arguments
    assert '"name"' not in args and args.startswith("{")
    with pytest.raises(ValueError):
        json.loads(args)  # cut off: not a whole document yet
    # the same greedy call, as far as it got (the complete one may differ only in whitespace)
    assert "".join(complete.split()).startswith("".join(args.split()))

    chunks = list(oai.chat.completions.create(model="smollm2", messages=WEATHER_ASK, temperature=0, max_tokens=cut,
                                              tools=[WEATHER], tool_choice=NAMED, stream=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    deltas = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert content == "" and finals == ["length"]
    assert deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas) == args


def test_anthropic_cut_call_is_a_tool_use_block(ant):
    args = dict(model="smollm2", max_tokens=16, **GREEDY, messages=WEATHER_ASK,
                tools=[{"name": "get_weather", "description": "Current weather in a city",
                        "input_schema": WEATHER["function"]["parameters"]}],
                tool_choice={"type": "tool", "name": "get_weather"})
    r = ant.messages.create(**args)
    assert r.stop_reason == "max_tokens"
    assert [b.type for b in r.content] == ["tool_use"]
    assert r.content[0].name == "get_weather" and isinstance(r.content[0].input, dict)
    with ant.messages.stream(**args) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].name == "get_weather"
