"""POST /v1/responses and the stored responses, through the official openai SDK against a real server.

Where a response and a chat completion get the same conversation at temperature 0 they must produce the same
text: that checks that input items, instructions, tool calls and their outputs become the same prompt.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from mainspring.billing import ledger
from mainspring.billing.keys import create_key
from mainspring.store.db import session

from .conftest import serve

pytestmark = pytest.mark.slow
MODEL = "smollm2"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": WEATHER_PARAMS, "strict": True}
TIME = {"type": "function", "name": "get_time", "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}
CHAT_WEATHER = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}


def chat_text(oai, messages, max_tokens: int, **kw) -> str:
    r = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens, **kw)
    return r.choices[0].message.content


# ---- one turn ----------------------------------------------------------------------------------------------
def test_text_response_is_the_chat_answer_with_usage(oai):
    r = oai.responses.create(model=MODEL, input="What is the capital of France?", temperature=0,
                             max_output_tokens=40)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "SmolLM2-135M-Instruct"
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.output_text == chat_text(oai, [{"role": "user", "content": "What is the capital of France?"}], 40)
    assert "Paris" in r.output_text
    u = r.usage
    assert u.input_tokens > 5 and 0 < u.output_tokens <= 40 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0 and u.input_tokens_details.cached_tokens >= 0
    assert r.status == ("incomplete" if u.output_tokens == 40 else "completed")


def test_streamed_events_arrive_in_order_and_add_up(oai):
    args = dict(model=MODEL, input="Name three colors.", temperature=0, max_output_tokens=30)
    plain = oai.responses.create(**args)
    events = list(oai.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and kinds == ["response.created", "response.in_progress", "response.output_item.added",
                                "response.content_part.added", *["response.output_text.delta"] * len(deltas),
                                "response.output_text.done", "response.content_part.done",
                                "response.output_item.done", f"response.{plain.status}"]
    text = "".join(d.delta for d in deltas)
    assert text == plain.output_text == events[-4].text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    assert final.id == events[0].response.id != plain.id and final.output_text == text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert {d.item_id for d in deltas} == {final.output[0].id}


def test_stream_helper_returns_the_final_response(oai):
    with oai.responses.stream(model=MODEL, input="Say hello.", temperature=0, max_output_tokens=200) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == text and text


def test_instructions_are_the_system_message(oai):
    system, question = "You are a pirate. Answer like a pirate.", "Where is the treasure?"
    r = oai.responses.create(model=MODEL, instructions=system, input=question, temperature=0, max_output_tokens=24)
    plain = oai.responses.create(model=MODEL, input=question, temperature=0, max_output_tokens=24)
    assert r.instructions == system and r.output_text != plain.output_text
    assert r.output_text == chat_text(oai, [{"role": "system", "content": system},
                                            {"role": "user", "content": question}], 24)


def test_max_output_tokens_makes_the_response_incomplete(oai):
    r = oai.responses.create(model=MODEL, input="Write a long story about a dragon.", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output[0].status == "incomplete"
    events = list(oai.responses.create(model=MODEL, input="Write a long story about a dragon.",
                                       max_output_tokens=5, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == \
        "max_output_tokens"


# ---- tools -------------------------------------------------------------------------------------------------
def test_forced_function_call_round_trip(oai):
    question = {"role": "user", "content": "What is the weather in Paris, in celsius?"}
    r = oai.responses.create(model=MODEL, input=[question], tools=[WEATHER, TIME], temperature=0,
                             tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    assert r.tools[0].name == "get_weather" and r.tools[0].strict is True and r.status == "completed"
    # the result goes back as a function_call_output item; the answer is chat's answer to the same conversation
    follow = oai.responses.create(
        model=MODEL, tools=[WEATHER], tool_choice="none", temperature=0, max_output_tokens=16,
        input=[question, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "-3 degrees, snow"}])
    assert follow.output[0].type == "message" and follow.output_text
    assert follow.output_text == chat_text(oai, [
        question, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "-3 degrees, snow"}], 16,
        tools=[CHAT_WEATHER], tool_choice="none")


def test_streamed_function_call_events(oai):
    events = list(oai.responses.create(model=MODEL, input="Weather in Rome?", tools=[WEATHER], tool_choice="required",
                                       temperature=0, max_output_tokens=60, stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    added, delta, done, item_done, completed = events[2:]
    assert added.item.type == "function_call" and added.item.arguments == "" and added.item.name == "get_weather"
    assert delta.delta == done.arguments == item_done.item.arguments == completed.response.output[0].arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER_PARAMS)
    assert item_done.item.call_id == added.item.call_id == completed.response.output[0].call_id


def test_a_forced_call_cut_off_is_an_incomplete_function_call(oai):
    r = oai.responses.create(model=MODEL, input="Weather in Rome?", tools=[WEATHER], tool_choice="required",
                             max_output_tokens=8)
    (call,) = r.output
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert call.type == "function_call" and call.status == "incomplete" and call.name == "get_weather"
    assert r.usage.output_tokens == 8


def test_allowed_tools_restrict_the_choice(oai):
    r = oai.responses.create(model=MODEL, input="What time is it in Tokyo?", tools=[WEATHER, TIME], temperature=0,
                             max_output_tokens=60, tool_choice={"type": "allowed_tools", "mode": "required",
                                                                "tools": [{"type": "function", "name": "get_time"}]})
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_time"


# ---- structured output -------------------------------------------------------------------------------------
class City(BaseModel):
    city: str
    population: int


def test_parse_with_a_pydantic_text_format(oai):
    r = oai.responses.parse(model=MODEL, input="Give the largest city of France as JSON.", text_format=City,
                            temperature=0, max_output_tokens=60)
    assert isinstance(r.output_parsed, City) and r.output_parsed.city
    assert r.text.format.type == "json_schema" and r.text.format.name == "City"


def test_json_schema_and_json_object_formats(oai):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = oai.responses.create(model=MODEL, input="Invent a person.", temperature=0, max_output_tokens=60,
                             text={"format": {"type": "json_schema", "name": "person", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    r = oai.responses.create(model=MODEL, input='Return {"ok": true} as JSON.', temperature=0, max_output_tokens=40,
                             text={"format": {"type": "json_object"}})
    assert r.status == "completed" and isinstance(json.loads(r.output_text), dict)
    assert r.text.format.type == "json_object"


# ---- stored responses --------------------------------------------------------------------------------------
def test_store_retrieve_list_input_items_and_delete(oai):
    given = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "Hi!"},
                                          {"type": "input_text", "text": "How are you?"}]}]
    r = oai.responses.create(model=MODEL, input=given, temperature=0, max_output_tokens=12, metadata={"k": "v"})
    got = oai.responses.retrieve(r.id)
    assert got.output_text == r.output_text and got.usage == r.usage and got.metadata == {"k": "v"}
    assert got.created_at == r.created_at and got.status == r.status and got.output[0].id == r.output[0].id
    items = oai.responses.input_items.list(r.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "developer"), ("message", "user")]
    assert [p.text for p in items[1].content] == ["Hi!", "How are you?"] and items[1].content[0].type == "input_text"
    newest = oai.responses.input_items.list(r.id, limit=1)  # newest first by default, as on OpenAI
    assert [i.id for i in newest.data] == [items[1].id] and newest.has_more
    assert [i.id for i in oai.responses.input_items.list(r.id, after=items[1].id).data] == [items[0].id]
    oai.responses.delete(r.id)
    for call in (lambda: oai.responses.retrieve(r.id), lambda: oai.responses.delete(r.id),
                 lambda: oai.responses.input_items.list(r.id)):
        with pytest.raises(openai.NotFoundError):
            call()


def test_store_false_keeps_nothing(oai):
    r = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.create(model=MODEL, input="Hi", max_output_tokens=4, previous_response_id=r.id)
    assert e.value.param == "previous_response_id"


def test_previous_response_id_continues_the_conversation(oai):
    first = oai.responses.create(model=MODEL, instructions="Be friendly.", input="My name is Alice.",
                                 temperature=0, max_output_tokens=20)
    second = oai.responses.create(model=MODEL, previous_response_id=first.id, input="What is my name?",
                                  temperature=0, max_output_tokens=20)
    assert second.previous_response_id == first.id and second.instructions is None  # instructions not carried
    assert second.output_text == chat_text(oai, [{"role": "user", "content": "My name is Alice."},
                                                 {"role": "assistant", "content": first.output_text},
                                                 {"role": "user", "content": "What is my name?"}], 20)
    items = oai.responses.input_items.list(second.id, order="asc").data
    assert [i.role for i in items] == ["user", "assistant", "user"] and items[1].id == first.output[0].id
    # a chain survives the deletion of its start: each response keeps every item it saw
    oai.responses.delete(first.id)
    third = oai.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks.", max_output_tokens=4)
    assert len(oai.responses.input_items.list(third.id).data) == 5


# ---- keys, projects, the ledger ----------------------------------------------------------------------------
@pytest.fixture
def paid(async_engine, tmp_path):
    """A server that requires keys, and clients of two keys of project acme and one of project rival."""
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", require_auth=True), engine=async_engine)
    with session(app.state.economics.db) as s:
        secrets = [create_key(s, p).secret for p in ("acme", "acme", "rival")]
    with serve(app, async_engine) as srv:
        yield app, [openai.OpenAI(base_url=srv.openai_url, api_key=k, max_retries=0, timeout=120) for k in secrets]


def test_usage_is_charged_on_the_ledger(paid):
    app, (acme, *_) = paid
    r = acme.responses.create(model=MODEL, input="Hello there", max_output_tokens=8)
    streamed = list(acme.responses.create(model=MODEL, input="Hello there", max_output_tokens=8, stream=True))[-1]
    with session(app.state.economics.db, readonly=True) as s:
        for resp, stream in ((r, False), (streamed.response, True)):
            (entry,) = ledger.entries(s, request_id=resp.id)
            assert entry.endpoint == "/v1/responses" and entry.stream is stream
            assert entry.tokens_output == resp.usage.output_tokens > 0
            assert entry.tokens_input_uncached + entry.tokens_cache_read == resp.usage.input_tokens
            assert entry.cost_total_u > 0


def test_another_projects_response_is_not_found(paid):
    _, (acme, colleague, rival) = paid
    r = acme.responses.create(model=MODEL, input="A secret: 42.", max_output_tokens=4)
    assert colleague.responses.retrieve(r.id).id == r.id  # any key of the project sees it
    assert colleague.responses.create(model=MODEL, previous_response_id=r.id, input="And?", max_output_tokens=2)
    for call in (lambda: rival.responses.retrieve(r.id), lambda: rival.responses.input_items.list(r.id),
                 lambda: rival.responses.delete(r.id),
                 lambda: rival.responses.create(model=MODEL, previous_response_id=r.id, input="?",
                                                max_output_tokens=2)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert acme.responses.retrieve(r.id).output_text == r.output_text  # the rival's delete deleted nothing


# ---- bad input ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change,param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),  # chat's nested shape
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "#/$defs/nope"}}}},
     "text.format.schema"),  # found when the grammar compiles, in the engine
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": []}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id"),
])
def test_bad_or_unsupported_input_is_a_4xx_naming_the_field(server, change, param):
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **change}
    r = httpx.post(f"{server.openai_url}/responses", json=body, timeout=60)
    assert r.status_code == (404 if param == "previous_response_id" else 400), r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]


def test_sdk_raises_bad_request_for_a_built_in_tool(oai):
    with pytest.raises(openai.BadRequestError, match="web_search") as e:
        oai.responses.create(model=MODEL, input="news?", tools=[{"type": "web_search"}])
    assert e.value.param == "tools[0].type"
