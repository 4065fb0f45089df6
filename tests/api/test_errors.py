"""Every 4xx/5xx arrives in the body the client's SDK understands, with the matching exception class."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from mainspring.api import hooks

pytestmark = pytest.mark.slow

MSGS = [{"role": "user", "content": "Hi"}]


def openai_error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def test_malformed_json_body(server):
    r = httpx.post(f"{server.openai_url}/chat/completions", content=b'{"model": "smollm2", "messages": [',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert openai_error(r)["type"] == "invalid_request_error"


def test_validation_errors_are_400_naming_the_field(server):
    r = httpx.post(f"{server.openai_url}/chat/completions", json={"model": "smollm2", "messages": [{"content": "x"}]})
    assert r.status_code == 400 and openai_error(r)["param"] == "messages[0].role"
    r = httpx.post(f"{server.openai_url}/chat/completions", json={"model": "smollm2"})
    assert r.status_code == 400 and openai_error(r)["param"] == "messages"


def test_unknown_model(oai):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-4o", messages=MSGS)
    assert e.value.status_code == 404 and e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="SMOLLM2-135M-INSTRUCT", messages=MSGS)  # ids are case-sensitive


@pytest.mark.parametrize("kwargs, param", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"n": 0}, "n"),
    ({"temperature": 3}, "temperature"),
    ({"tool_choice": "sometimes", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "g"}},
      "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"stop": [""]}, "stop"),
])
def test_bad_parameters_are_bad_requests(oai, kwargs, param):
    args = {"model": "smollm2", "messages": MSGS, **kwargs}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(**args)
    assert e.value.status_code == 400 and e.value.param == param and e.value.type == "invalid_request_error"


def context_window(oai) -> int:
    return oai.models.retrieve("smollm2").model_extra["context_window"]


def test_prompt_over_the_context(oai):
    n = context_window(oai)  # the model's 8192, or less when the KV pool is smaller
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="smollm2", prompt=[1] * n)
    assert e.value.code == "context_length_exceeded" and str(n) in e.value.message and e.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hello " * n}], stream=True)
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"


def test_max_tokens_beyond_the_context_is_a_400(oai, monkeypatch):
    seen = []

    async def before_call(request, info):
        seen.append(info)

    monkeypatch.setattr(hooks, "before_call", before_call)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=10**6)
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_tokens"
    assert str(context_window(oai)) in e.value.message and not seen  # refused before admission
    # without max_tokens the output may use what the prompt leaves of the context
    r = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "What is the capital of "
                                    "France?"}], temperature=0)  # a short greedy answer
    (info,) = seen
    assert info.max_output_tokens == context_window(oai) - r.usage.prompt_tokens


def test_completions_suffix_is_rejected(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="smollm2", prompt="x", suffix="y")
    assert e.value.param == "suffix"


def test_unknown_url_and_method(server):
    r = httpx.get(f"{server.openai_url}/nothing-here")
    assert r.status_code == 404 and openai_error(r)["code"] == "unknown_url"
    r = httpx.get(f"{server.openai_url}/chat/completions")
    assert r.status_code == 405 and openai_error(r)


def test_unexpected_error_is_500_without_traceback(server, monkeypatch):
    async def broken(request, info):
        raise RuntimeError("secret internal detail /etc/passwd")

    monkeypatch.setattr(hooks, "before_call", broken)
    r = httpx.post(f"{server.openai_url}/chat/completions", json={"model": "smollm2", "messages": MSGS})
    assert r.status_code == 500
    err = openai_error(r)
    assert err["type"] == "server_error" and "secret" not in r.text and "Traceback" not in r.text


def test_anthropic_route_answers_in_anthropic_shape(ant, server):
    with pytest.raises(anthropic.NotFoundError) as e:
        ant.messages.create(model="claude-nope", max_tokens=5, messages=MSGS)
    assert e.value.body == {"type": "error", "error": {"type": "not_found_error", "message": e.value.body["error"]
                                                        ["message"]}}
    r = httpx.post(f"{server.url}/v1/messages", json={"model": "smollm2", "messages": MSGS})  # no max_tokens
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model="smollm2", max_tokens=5, messages=MSGS, tool_choice={"type": "maybe"},
                            tools=[{"name": "f", "input_schema": {"type": "object"}}])
