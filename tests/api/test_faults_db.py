"""Another process holding the database's write lock: writes answer 503 with Retry-After (after the busy timeout,
in the route's error body), reads keep working (WAL), and everything works again once the lock is gone.

SQLite only, by nature: one file-wide write lock held by another process (Postgres locks rows)."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

import httpx
import pytest

from mainspring.billing.budgets import set_budget
from mainspring.billing.keys import create_key
from mainspring.store.db import session

from .conftest import serve

pytestmark = pytest.mark.slow

HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def srv(async_engine, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    data = tmp_path_factory.mktemp("faults-db")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MAINSPRING_DB_BUSY_TIMEOUT_S", "1")  # read when the database's engine is made
        app = create_app(Settings(data_dir=data, database_url=f"sqlite:///{data}/mainspring.db"), engine=async_engine)
    with session(app.state.economics.db) as s:  # a key with a budget: each call holds its worst case first
        made = create_key(s, "acme")
        set_budget(s, "key", made.key.id, "total", 10**9)
    headers = {"authorization": f"Bearer {made.secret}"}
    with serve(app, async_engine) as s, httpx.Client(base_url=s.url, timeout=60, headers=headers) as http:
        s.http, s.db = http, data / "mainspring.db"
        yield s


@contextmanager
def write_lock_held(db) -> Iterator[None]:
    """Another process holds the write lock (BEGIN IMMEDIATE) for the duration of the block."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def assert_busy(r: httpx.Response, anthropic: bool = False) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    body = r.json()
    if anthropic:
        assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    else:
        assert body["error"]["code"] == "database_busy" and "busy" in body["error"]["message"]


CHAT = {"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
UPLOAD = {"files": {"file": ("notes.txt", b"hello\n")}, "data": {"purpose": "user_data"}}


def test_writes_are_503_with_retry_after_while_reads_keep_working(srv):
    http = srv.http
    agent = http.post("/v1/agents", json={"name": "busy-test", "model": "smollm2", "tools": []})
    assert agent.status_code == 201, agent.text
    uploaded = http.post("/v1/files", **UPLOAD).json()["id"]
    with write_lock_held(srv.db):
        assert_busy(http.post("/v1/chat/completions", json=CHAT))
        assert_busy(http.post("/v1/messages", json=CHAT), anthropic=True)
        assert_busy(http.post("/v1/files", **UPLOAD))
        assert_busy(http.post("/v1/runs", json={"agent": agent.json()["id"], "goal": "say hi"}))
        for path in ("/health", "/v1/files", f"/v1/files/{uploaded}", "/v1/agents", "/v1/runs", "/v1/models"):
            assert http.get(path).status_code == 200, path
    r = http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    assert http.post("/v1/files", **UPLOAD).status_code == 200


def test_a_call_served_while_the_ledger_is_locked_is_billed_once_the_lock_is_gone(srv):
    """An anonymous call holds nothing before it runs, so it is served; its ledger row waits for the lock."""
    import time

    from sqlalchemy import select

    from mainspring.store.tables import LedgerEntry

    meter = srv.app.state.economics.meter
    with write_lock_held(srv.db):
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["id"] in meter.pending()  # not lost: queued
    deadline = time.monotonic() + 30
    while meter.pending() and time.monotonic() < deadline:
        time.sleep(0.1)
    with session(srv.app.state.economics.db, readonly=True) as s:
        rows = s.scalars(select(LedgerEntry).where(LedgerEntry.request_id == r.json()["id"])).all()
    assert len(rows) == 1 and rows[0].tokens_output == r.json()["usage"]["completion_tokens"]
