"""Upstream providers: a fake OpenAI-compatible server behind Mainspring, the openai SDK in front,
the ledger pricing the upstream's usage from the upstream model's own price-sheet entry."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from mainspring.api.upstream import UpstreamConfigError, Upstreams
from mainspring.billing import budgets, ledger
from mainspring.billing.keys import create_key
from mainspring.billing.prices import DEFAULT_SHEET
from mainspring.store.db import session

from .conftest import serve

pytestmark = pytest.mark.slow

ANSWER = ["Hello", " from", " the", " upstream", "."]
USAGE = {"prompt_tokens": 1000, "completion_tokens": 5, "total_tokens": 1005,
         "prompt_tokens_details": {"cached_tokens": 800}}
PRICES = {"input": "2.00", "cached_input": "0.50", "output": "8.00"}  # USD per 1M = micro-USD per token
PRICED = ["remote-chat", "fake-broken", "fake-slow", "fake-picky", "fake-badkey", "gone-model"]


class FakeUpstream:
    """An OpenAI-compatible server whose behaviour depends on the upstream model name it is asked for."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.slow_stream_closed = threading.Event()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.post("/v1/completions")(self.completions)

    def received(self, model: str) -> list[dict]:
        return [c["body"] for c in self.calls if c["body"].get("model") == model]

    async def chat(self, request: Request):
        body = await request.json()
        self.calls.append({"body": body, "auth": request.headers.get("authorization")})
        model = body["model"]
        if model == "fake-broken":
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        if model == "fake-badkey":
            return JSONResponse({"error": {"message": "Incorrect API key provided: up-s***ret"}}, status_code=401)
        if model == "fake-picky":
            return JSONResponse({"error": {"message": "picky says no", "type": "invalid_request_error",
                                           "param": "temperature", "code": None}}, status_code=400)
        if not body.get("stream"):
            return {"id": "chatcmpl-upstream", "object": "chat.completion", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                                 "message": {"role": "assistant", "content": "".join(ANSWER)}}],
                    "usage": USAGE}
        return StreamingResponse(self._events(body), media_type="text/event-stream")

    async def _events(self, body: dict):
        def chunk(delta: dict, finish: str | None = None, **extra) -> str:
            return "data: " + json.dumps({"id": "chatcmpl-upstream", "object": "chat.completion.chunk",
                                          "created": 1, "model": body["model"], **extra,
                                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

        slow = body["model"] == "fake-slow"
        try:
            yield chunk({"role": "assistant", "content": ""})
            for word in (ANSWER * 200 if slow else ANSWER):
                if slow:
                    await asyncio.sleep(0.02)
                yield chunk({"content": word})
            yield chunk({}, "stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                yield "data: " + json.dumps({"id": "chatcmpl-upstream", "object": "chat.completion.chunk",
                                             "created": 1, "model": body["model"], "choices": [],
                                             "usage": USAGE}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if slow:
                self.slow_stream_closed.set()

    async def completions(self, request: Request):
        body = await request.json()
        self.calls.append({"body": body, "auth": request.headers.get("authorization")})
        return {"id": "cmpl-upstream", "object": "text_completion", "created": 1, "model": body["model"],
                "choices": [{"index": 0, "text": " there", "finish_reason": "length", "logprobs": None}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack(async_engine, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    tmp = tmp_path_factory.mktemp("upstream")
    fake = FakeUpstream()
    with serve(fake.app, None) as up:
        sheet = yaml.safe_load(DEFAULT_SHEET.read_text())
        sheet["version"] = "test-upstream.1"
        for name in PRICED:
            sheet["models"][name] = {"context_window": 128000, "max_output_tokens": 16384,
                                     "tiers": {"standard": PRICES}, "source": "test"}
        (tmp / "prices.yaml").write_text(yaml.safe_dump(sheet))
        (tmp / "upstreams.yaml").write_text(yaml.safe_dump({"upstreams": [
            {"name": "fake", "base_url": up.openai_url, "api_key": "up-secret", "timeout_s": 30,
             "models": [{"name": "remote-chat", "upstream_name": "fake-gpt"}, "fake-broken", "fake-slow",
                        "fake-picky", "fake-badkey", "fake-unpriced"]},
            {"name": "gone", "base_url": f"http://127.0.0.1:{_closed_port()}/v1", "models": ["gone-model"]},
        ]}))
        settings = Settings(database_url=f"sqlite:///{tmp}/db.sqlite", prices_file=str(tmp / "prices.yaml"),
                            upstreams_file=str(tmp / "upstreams.yaml"))
        app = create_app(settings, engine=async_engine)
        with serve(app, async_engine) as srv:
            yield srv, fake, app.state.economics


def oai(srv, key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.openai_url, api_key=key, max_retries=0, timeout=60)


def row(econ, request_id: str, wait_s: float = 0.0):
    deadline = time.monotonic() + wait_s
    while True:
        with session(econ.db, readonly=True) as s:
            rows = ledger.entries(s, request_id=request_id)
        if rows or time.monotonic() >= deadline:
            assert len(rows) == 1, f"expected one ledger row for {request_id}, got {len(rows)}"
            return rows[0]
        time.sleep(0.05)


HI = [{"role": "user", "content": "Say hello."}]


def test_plain_chat_is_forwarded_and_priced_from_the_sheet(stack):
    srv, fake, econ = stack
    r = oai(srv).chat.completions.create(model="remote-chat", messages=HI, max_tokens=20, temperature=0.3,
                                         extra_body={"custom_field": 7})
    assert r.choices[0].message.content == "".join(ANSWER)
    assert r.usage.prompt_tokens == 1000 and r.usage.prompt_tokens_details.cached_tokens == 800
    sent = fake.calls[-1]
    assert sent["auth"] == "Bearer up-secret"  # the upstream's key, never the caller's
    assert sent["body"]["model"] == "fake-gpt" and sent["body"]["max_tokens"] == 20
    assert sent["body"]["temperature"] == 0.3 and sent["body"]["custom_field"] == 7
    e = row(econ, r._request_id)
    assert (e.model, e.status, e.endpoint) == ("remote-chat", "ok", "/v1/chat/completions")
    assert (e.tokens_input_uncached, e.tokens_cache_read, e.tokens_output) == (200, 800, 5)
    # 200 uncached × $2 + 800 cached × $0.50 + 5 output × $8 per 1M tokens, in micro-USD
    assert (e.cost_input_u, e.cost_cache_read_u, e.cost_output_u) == (400, 400, 40)
    assert e.cost_total_u == 840 and e.price_sheet_version == "test-upstream.1"


def test_stream_with_usage_relays_every_chunk(stack):
    srv, fake, econ = stack
    stream = oai(srv).chat.completions.create(model="remote-chat", messages=HI, stream=True,
                                              stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(ANSWER)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 800 and not chunks[-1].choices
    e = row(econ, stream.response.headers["x-request-id"], wait_s=5)
    assert e.stream and e.status == "ok" and e.cost_total_u == 840


def test_stream_without_usage_is_still_metered(stack):
    srv, fake, econ = stack
    stream = oai(srv).chat.completions.create(model="remote-chat", messages=HI, stream=True)
    chunks = list(stream)
    assert chunks and all(c.usage is None for c in chunks)  # the client did not ask for it
    assert fake.calls[-1]["body"]["stream_options"] == {"include_usage": True}  # but we did
    e = row(econ, stream.response.headers["x-request-id"], wait_s=5)
    assert (e.tokens_cache_read, e.tokens_output, e.cost_total_u) == (800, 5, 840)


def test_completions_endpoint_is_forwarded(stack):
    srv, fake, econ = stack
    r = oai(srv).completions.create(model="remote-chat", prompt="Hi", max_tokens=1)
    assert r.choices[0].text == " there"
    assert fake.calls[-1]["body"] == {"model": "fake-gpt", "prompt": "Hi", "max_tokens": 1}
    e = row(econ, r._request_id)
    assert (e.endpoint, e.tokens_input_uncached, e.tokens_output, e.cost_total_u) == ("/v1/completions", 3, 1, 14)


def test_models_lists_upstream_models(stack):
    srv, _, _ = stack
    c = oai(srv)
    cards = {m.id: m for m in c.models.list().data}
    assert cards["remote-chat"].owned_by == "fake" and cards["gone-model"].owned_by == "gone"
    assert "SmolLM2-135M-Instruct" in cards
    assert c.models.retrieve("remote-chat").owned_by == "fake"


def test_budget_applies_to_upstream_models(stack):
    srv, fake, econ = stack
    with session(econ.db) as s:
        created = create_key(s, "upstream_budget")
        budgets.set_budget(s, "key", created.key.id, "total", 1000)  # $0.001; 1000 output tokens reserve $0.008
    before = len(fake.calls)
    with pytest.raises(openai.APIStatusError) as err:
        oai(srv, created.secret).chat.completions.create(model="remote-chat", messages=HI, max_tokens=1000)
    assert err.value.status_code == 402 and err.value.response.json()["error"]["code"] == "budget_exceeded"
    assert len(fake.calls) == before
    ok = oai(srv, created.secret).chat.completions.create(model="remote-chat", messages=HI, max_tokens=50)
    assert row(econ, ok._request_id).api_key_id == created.key.id  # a small call fits and is billed to the key


def test_upstream_500_becomes_502(stack):
    srv, _, econ = stack
    r = httpx.post(srv.openai_url + "/chat/completions", json={"model": "fake-broken", "messages": HI}, timeout=30)
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "upstream_error" and "HTTP 500" in err["message"]
    with pytest.raises(openai.APIStatusError) as stream_err:  # a stream fails the same way, before any event
        oai(srv).chat.completions.create(model="fake-broken", messages=HI, stream=True)
    assert stream_err.value.status_code == 502


def test_upstream_refusing_our_key_is_502_without_its_words(stack):
    srv, _, _ = stack
    r = httpx.post(srv.openai_url + "/chat/completions", json={"model": "fake-badkey", "messages": HI}, timeout=30)
    assert r.status_code == 502 and "HTTP 401" in r.json()["error"]["message"]
    assert "up-s" not in r.text  # the upstream's message names the gateway's key: it stays in our log


def test_unreachable_upstream_is_502(stack):
    srv, _, _ = stack
    r = httpx.post(srv.openai_url + "/chat/completions", json={"model": "gone-model", "messages": HI}, timeout=30)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"


def test_upstream_4xx_passes_through(stack):
    srv, _, econ = stack
    r = httpx.post(srv.openai_url + "/chat/completions", json={"model": "fake-picky", "messages": HI}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "picky says no"
    e = row(econ, r.headers["x-request-id"])  # recorded at no cost: it settles the reservation
    assert (e.status, e.cost_total_u) == ("error", 0)


def test_unpriced_upstream_model_is_refused_before_forwarding(stack):
    srv, fake, _ = stack
    before = len(fake.calls)
    r = httpx.post(srv.openai_url + "/chat/completions", json={"model": "fake-unpriced", "messages": HI}, timeout=30)
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_not_priced"
    assert "fake-unpriced" in r.json()["error"]["message"]
    assert len(fake.calls) == before and not fake.received("fake-unpriced")


def test_broken_off_stream_closes_upstream_and_bills_what_was_relayed(stack):
    srv, fake, econ = stack
    stream = oai(srv).chat.completions.create(model="fake-slow", messages=HI, stream=True)
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen >= 5:
                break
    stream.close()
    assert fake.slow_stream_closed.wait(10), "the upstream request was not closed"
    e = row(econ, stream.response.headers["x-request-id"], wait_s=10)
    assert e.status == "stream_interrupted"
    assert 5 <= e.tokens_output < 1000 and e.tokens_input_uncached > 0 and e.cost_total_u > 0


def test_upstreams_file_errors_name_the_problem(tmp_path):
    assert Upstreams.load("").routes == {}
    bad = tmp_path / "u.yaml"
    bad.write_text("upstreams: [{name: a, base_url: ftp://x, models: [m]}]")
    with pytest.raises(UpstreamConfigError, match="base_url"):
        Upstreams.load(bad)
    bad.write_text("upstreams: [{name: a, base_url: 'http://x', models: [m]}, {name: b, base_url: 'http://y', "
                   "models: [m]}]")
    with pytest.raises(UpstreamConfigError, match="listed by both"):
        Upstreams.load(bad)
    with pytest.raises(UpstreamConfigError, match="cannot read"):
        Upstreams.load(tmp_path / "missing.yaml")

