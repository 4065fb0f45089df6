"""Every call priced, keyed, limited and budgeted: a live server, the openai SDK, the ledger."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import openai
import pytest

from mainspring.billing import budgets, ledger
from mainspring.billing.keys import create_key, revoke_key
from mainspring.store.db import session

from .conftest import serve

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def paid(async_engine, tmp_path):
    """A server that requires keys, on its own database."""
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", require_auth=True), engine=async_engine)
    with serve(app, async_engine) as srv:
        yield srv, app.state.economics


def new_key(econ, **limits):
    with session(econ.db) as s:
        created = create_key(s, "acme", **limits)
        return created.secret, created.key.id


def client(srv, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.openai_url, api_key=secret, max_retries=0, timeout=120)


def cost_of(econ, request_id: str) -> int:
    with session(econ.db, readonly=True) as s:
        (entry,) = ledger.entries(s, request_id=request_id)
        return entry.cost_total_u


def ask(c: openai.OpenAI, content: str, max_tokens: int = 8, system: str | None = None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=max_tokens, temperature=0)


def test_repeated_long_prompt_is_cached_and_costs_less(paid):
    srv, econ = paid
    secret, _ = new_key(econ)
    c = client(srv, secret)
    system = "You are the support agent of a hardware store. " * 40  # ~400 tokens, the same both times
    first = ask(c, "Do you sell hammers?", system=system)
    second = ask(c, "Do you sell hammers?", system=system)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert first.usage.prompt_tokens == second.usage.prompt_tokens
    assert cost_of(econ, second.id) < cost_of(econ, first.id)


def test_missing_bad_and_revoked_keys_get_401(paid):
    srv, econ = paid
    secret, key_id = new_key(econ)
    for bad in ("ms-acme-wrong", "x"):
        with pytest.raises(openai.AuthenticationError):
            ask(client(srv, bad), "hi")
    r = httpx.post(srv.openai_url + "/chat/completions",
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert ask(client(srv, secret), "hi").choices[0].message.content is not None
    with session(econ.db) as s:
        revoke_key(s, key_id)
    with pytest.raises(openai.AuthenticationError):
        ask(client(srv, secret), "hi")


def test_requests_per_minute_limit_answers_429_with_retry_after(paid):
    srv, econ = paid
    secret, _ = new_key(econ, rpm_limit=2)
    c = client(srv, secret)
    ask(c, "one", max_tokens=2)
    ask(c, "two", max_tokens=2)
    with pytest.raises(openai.RateLimitError) as err:
        ask(c, "three", max_tokens=2)
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert err.value.response.json()["error"]["code"] == "rate_limit_exceeded"


def test_concurrent_calls_never_overspend_a_small_budget(paid):
    srv, econ = paid
    secret, key_id = new_key(econ)
    limit_u = 60  # micro-USD: room for a handful of ~11-17 u worst cases, not for twelve
    with session(econ.db) as s:
        budgets.set_budget(s, "key", key_id, "total", limit_u)
    c = client(srv, secret)

    def call(i: int) -> str:
        try:
            return ask(c, f"Say the number {i}.", max_tokens=12).id
        except openai.APIStatusError as exc:
            assert exc.status_code == 402 and "budget" in exc.message
            return "402"

    with cf.ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(call, range(12)))
    assert "402" in results and any(r != "402" for r in results)
    with session(econ.db, readonly=True) as s:
        spent = ledger.spend(s, "key", key_id)
    assert 0 < spent <= limit_u


def test_broken_off_stream_is_billed_for_what_it_produced(paid):
    srv, econ = paid
    secret, key_id = new_key(econ)
    stream = client(srv, secret).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story about a lighthouse."}],
        max_tokens=200, temperature=0, stream=True)
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if got >= 5:
                break
    stream.close()
    request_id = chunk.id
    for _ in range(100):  # the server notices the disconnect and records asynchronously
        with session(econ.db, readonly=True) as s:
            rows = ledger.entries(s, request_id=request_id)
        if rows:
            break
        time.sleep(0.1)
    (row,) = rows
    assert row.status == "stream_interrupted" and 5 <= row.tokens_output < 200 and row.cost_total_u > 0
