"""Per-request KV policies through the official `openai` SDK: a sliding window takes a prompt past the
context a dense request is held to, and bad policies are 400s with an OpenAI error body."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.servers import serve

pytestmark = pytest.mark.slow  # the embedded model

CONTEXT = 256  # this server's engine holds dense requests to 256 tokens


@pytest.fixture(scope="module")
def client(embedded, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=64, max_model_len=CONTEXT)))
    db = tmp_path_factory.mktemp("long-db") / "mainspring.db"
    app = create_app(Settings(database_url=f"sqlite:///{db}", fast_variant=False), engine=engine)
    with serve(app, engine) as srv:
        yield openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0, timeout=120)
    engine.close()


def long_message(embedded) -> list[dict]:
    text = Path("/usr/share/common-licenses/GPL-3").read_text()
    ids = embedded.tokenizer.encode(text)[: CONTEXT + 100]
    return [{"role": "user", "content": embedded.tokenizer.decode(ids) + "\n\nSummarize the text above."}]


def test_a_window_runs_a_prompt_past_the_dense_context(client, embedded):
    messages = long_message(embedded)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8)
    assert e.value.code == "context_length_exceeded"
    out = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8, temperature=0,
                                         extra_body={"attention_window": 128})
    assert out.usage.prompt_tokens > CONTEXT
    assert out.usage.completion_tokens == 8 and out.choices[0].message.content


@pytest.mark.parametrize("extra,param,words", [
    ({"attention_window": 8}, None, "attention_window must be at least 32"),
    ({"kv_hot_tokens": 64}, None, "cold KV tier"),
    ({"attention_window": -5}, "attention_window", "greater than or equal to 0"),
    ({"attention_window": 10**31}, "attention_window", "less than or equal to 2147483647"),
])
def test_bad_policies_are_openai_style_400s(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4, extra_body=extra)
    body = e.value.body
    assert words in body["message"] and body["type"] == "invalid_request_error"
    if param:
        assert body["param"] == param
