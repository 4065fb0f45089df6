"""Request fields that used to be accepted and then ignored or mangled: each now works or is a clear
400 through the official SDK. vLLM's guided-decoding extras work through the same constrained decoding."""

from __future__ import annotations

import json
import re

import openai
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def context_window(oai) -> int:
    return oai.models.retrieve("smollm2").model_extra["context_window"]


def test_stream_options_without_stream(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2,
                                    stream_options={"include_usage": True})
    assert e.value.param == "stream_options" and "stream" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="smollm2", prompt="x", max_tokens=2, stream_options={"include_usage": True})
    assert e.value.param == "stream_options"


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1])
def test_seed_beyond_int64(oai, seed):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2, seed=seed)
    assert e.value.param == "seed"
    ok = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2, seed=2**63 - 1)
    assert ok.choices[0].finish_reason == "length"


def test_max_tokens_past_the_context_names_both_numbers(oai):
    n = context_window(oai)
    for kwargs in ({"max_tokens": 10**6}, {"max_completion_tokens": n}, {"max_tokens": n, "extra_body":
                                                                          {"min_tokens": 5}}):
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model="smollm2", messages=QUESTION, **kwargs)
        assert e.value.code == "context_length_exceeded" and str(n) in e.value.message
        assert e.value.param == next(k for k in kwargs if k != "extra_body")
        assert "min_tokens" not in e.value.message
    prompt_tokens = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=1).usage.prompt_tokens
    assert f"{prompt_tokens} in the prompt" in e.value.message
    # exactly what is left still works (a short greedy answer)
    ok = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=n - prompt_tokens)
    assert ok.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="smollm2", prompt="Hello", max_tokens=n)
    assert e.value.param == "max_tokens" and e.value.code == "context_length_exceeded"


# ---- vLLM's guided decoding extras -------------------------------------------------------------------
class City(BaseModel):
    name: str
    country: str


def test_guided_json_and_structured_outputs_json(oai):
    for extra in ({"guided_json": City.model_json_schema()},
                  {"structured_outputs": {"json": City.model_json_schema()}}):
        r = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=60,
                                        extra_body=extra)
        City.model_validate_json(r.choices[0].message.content)


def test_guided_choice_regex_and_grammar(oai):
    for extra in ({"guided_choice": ["yes", "no", "maybe so"]}, {"structured_outputs": {"choice": ["yes", "no"]}}):
        r = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Is Paris in France?"}],
                                        temperature=0, max_tokens=8, extra_body=extra)
        assert r.choices[0].message.content in ("yes", "no", "maybe so")
    r = oai.completions.create(model="smollm2", prompt="The year Paris hosted the Olympics:", max_tokens=8,
                               temperature=0, extra_body={"guided_regex": r"[0-9]{4}"})
    assert re.fullmatch(r"[0-9]{4}", r.choices[0].text)
    r = oai.completions.create(model="smollm2", prompt="Say a color:", max_tokens=8, temperature=0,
                               extra_body={"guided_grammar": 'start: " red" | " blue"'})
    assert r.choices[0].text in (" red", " blue")


@pytest.mark.parametrize("extra, param", [
    ({"guided_json": {"type": "object"}, "guided_regex": "a+"}, "guided_json"),
    ({"guided_json": {"type": "object"}, "response_format": {"type": "json_object"}}, "guided_json"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
    ({"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}, "structured_outputs.json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"guided_regex": "("}, None),
])
def test_guided_extras_we_cannot_honour_are_400s(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=4, extra_body=extra)
    assert e.value.param == param


def test_guided_choice_with_a_forced_tool_is_a_400(oai):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=4, tools=[tool],
                                    tool_choice="required", extra_body={"guided_choice": ["a"]})
    assert "one output constraint" in e.value.message
    assert json.dumps(e.value.body)  # an OpenAI error body


# ---- SDK fields that would change the answer and that a text-only server cannot honour ---------------
@pytest.mark.parametrize("extra, param", [
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["audio"]}, "modalities"),
    ({"web_search_options": {}}, "web_search_options"),
])
def test_unsupported_chat_fields_are_400s(oai, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=2, extra_body=extra)
    assert e.value.param == param


def test_anthropic_server_tools_are_400s(ant):
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as e:
        ant.messages.create(model="smollm2", max_tokens=4, messages=QUESTION,
                            tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "server tools" in e.value.message
