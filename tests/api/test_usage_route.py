"""GET /v1/usage: the ledger report over HTTP, by model and by day, JSON and CSV, scoped per project."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import httpx
import openai
import pytest

from mainspring.billing.keys import create_key
from mainspring.store.db import session

from .conftest import serve

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def used(async_engine, tmp_path_factory):
    """A server on its own database, and the usage its calls reported: anonymous chat ×2 + completion ×1,
    then one chat with a key of project alpha."""
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    db = tmp_path_factory.mktemp("usage") / "db.sqlite"
    app = create_app(Settings(database_url=f"sqlite:///{db}"), engine=async_engine)
    with session(app.state.economics.db) as s:
        alpha, beta = create_key(s, "alpha").secret, create_key(s, "beta").secret
    with serve(app, async_engine) as srv:
        anon = openai.OpenAI(base_url=srv.openai_url, api_key="x", max_retries=0, timeout=120)
        msgs = [{"role": "user", "content": "Name a colour."}]
        usages = [anon.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, temperature=0).usage,
                  anon.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0).usage,
                  anon.completions.create(model=MODEL, prompt="One, two,", max_tokens=2, temperature=0).usage]
        keyed = openai.OpenAI(base_url=srv.openai_url, api_key=alpha, max_retries=0, timeout=120)
        alpha_usage = keyed.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0).usage
        yield srv, usages + [alpha_usage], {"alpha": alpha, "beta": beta}


def get(srv, key: str | None = None, **params) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(srv.openai_url + "/usage", params=params, headers=headers, timeout=30)


def totals(usages) -> dict[str, int]:
    return {"requests": len(usages), "input_total": sum(u.prompt_tokens for u in usages),
            "cache_read": sum(u.prompt_tokens_details.cached_tokens for u in usages),
            "output": sum(u.completion_tokens for u in usages)}


def test_by_model_json_matches_what_the_calls_reported(used):
    srv, usages, _ = used
    r = get(srv, by="model")
    assert r.status_code == 200
    body = r.json()
    assert body["by"] == "model" and body["project_id"] is None  # anonymous: every project
    (row,) = body["data"]
    assert row["group"] == MODEL
    assert {k: row[k] for k in ("requests", "input_total", "cache_read", "output")} == totals(usages)
    assert row["input_uncached"] == row["input_total"] - row["cache_read"]
    assert row["cost_u"] > 0 and Decimal(row["cost_usd"]) * 1_000_000 == row["cost_u"]  # exact, no float


def test_by_day_csv(used):
    srv, usages, _ = used
    r = get(srv, by="day", format="csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    (row,) = list(csv.DictReader(io.StringIO(r.text)))
    assert row["day"] == datetime.now(timezone.utc).strftime("%Y-%m-%d")
    want = totals(usages)
    assert int(row["requests"]) == want["requests"] and int(row["input_total"]) == want["input_total"]
    assert int(row["cache_read"]) == want["cache_read"] and int(row["output"]) == want["output"]


def test_since_until_window(used):
    srv, usages, _ = used
    today = datetime.now(timezone.utc).date()
    assert get(srv, by="day", until=today.isoformat()).json()["data"] == []  # until is exclusive
    (row,) = get(srv, by="day", since=today.isoformat(), until=(today + timedelta(days=1)).isoformat()).json()["data"]
    assert row["requests"] == len(usages)


def test_a_key_sees_only_its_own_project(used):
    srv, usages, keys = used
    (row,) = get(srv, keys["alpha"], by="project").json()["data"]
    assert row["group"] == "alpha" and row["requests"] == 1 and row["output"] == usages[-1].completion_tokens
    assert get(srv, keys["beta"], by="model").json()["data"] == []
    anonymous = {r["group"]: r["requests"] for r in get(srv, by="project").json()["data"]}
    assert anonymous == {"alpha": 1, "(none)": len(usages) - 1}


def test_bad_parameters_are_400(used):
    srv, _, _ = used
    for params, param in (({"by": "colour"}, "by"), ({"since": "yesterday"}, "since"),
                          ({"format": "xml"}, "format"), ({"since": "2025-06-02", "until": "2025-06-01"}, "until")):
        r = get(srv, **params)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (params, r.text)
