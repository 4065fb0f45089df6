"""kill -9 the server in the middle of a streamed chat completion, start it again on the same database: the cut-off
stream's budget hold is released at start (the key's budget is usable at once, not after the hold's expiry), no
ledger row is invented for its unknown tokens, and every hold and ledger row is consistent afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from mainspring.billing import budgets, ledger
from mainspring.billing.keys import create_key
from mainspring.store.db import dispose_engines, init_db, session
from mainspring.store.tables import LedgerEntry
from mainspring.store.tables import Reservation as ReservationRow
from tests.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
LONG = 2000  # output tokens: a stream that is still running when it is killed; its worst case is ~800 micro-USD
BUDGET_U = 1200  # one such call fits, two do not


def start_server(tmp_path: Path, db_url: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "MAINSPRING_DATABASE_URL": db_url, "MAINSPRING_THREADS": "1",
           "MAINSPRING_FAST_VARIANT": "0", "MAINSPRING_KV_CACHE_MB": "128"}
    log_path = tmp_path / f"server-{port}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mainspring", "serve", "--port", str(port)], cwd=ROOT,
                                env=env, stdout=log, stderr=log)
    wait_healthy(proc, f"http://127.0.0.1:{port}", log_path)
    return proc


def body(stream: bool) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Count from one to a thousand in words."}],
            "max_tokens": LONG, "min_tokens": LONG, "temperature": 0, "stream": stream}


def first_chunk_id(api: httpx.Client, secret: str) -> tuple[str, tuple]:
    """Start a stream and read until its first chunk: the call is admitted and its hold taken. The caller keeps
    the returned objects referenced: closing (or garbage-collecting) the line iterator drops the connection."""
    cm = api.stream("POST", "/chat/completions", json=body(True), headers={"Authorization": f"Bearer {secret}"})
    resp = cm.__enter__()
    assert resp.status_code == 200, resp.read()
    lines = resp.iter_lines()
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            return json.loads(line[6:])["id"], (cm, resp, lines)
    raise AssertionError("the stream ended before its first chunk")


def open_holds(db_url: str) -> list[ReservationRow]:
    with session(db_url, readonly=True) as s:
        return list(s.scalars(select(ReservationRow).where(ReservationRow.settled.is_(False))))


def test_a_stream_cut_by_kill_9_frees_its_hold_at_restart(tmp_path, free_tcp_port_factory):
    db_url = f"sqlite:///{tmp_path / 'restart.db'}"
    init_db(db_url)
    with session(db_url) as s:
        created = create_key(s, "alpha")
        budgets.set_budget(s, "key", created.key.id, "total", BUDGET_U)
    key_id, secret = created.key.id, created.secret
    dispose_engines()  # the server is the only one using the file while it runs
    port = free_tcp_port_factory()
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=60)
    auth = {"Authorization": f"Bearer {secret}"}

    server = start_server(tmp_path, db_url, port)
    try:
        cut_id, streaming = first_chunk_id(api, secret)
        refused = api.post("/chat/completions", json=body(False), headers=auth)  # the stream's hold counts
        assert refused.status_code == 402 and refused.json()["error"]["code"] == "budget_exceeded"
    finally:
        os.kill(server.pid, signal.SIGKILL)  # mid-stream: its hold is never settled by this process
        server.wait()
    streaming[0].__exit__(None, None, None)
    [held] = open_holds(db_url)
    assert held.request_id == cut_id

    server = start_server(tmp_path, db_url, port)
    try:
        assert open_holds(db_url) == []  # released at start, not ~minutes later when it would have expired
        again, left = first_chunk_id(api, secret)  # the key's budget is usable again at once
        left[0].__exit__(None, None, None)  # the client leaves: billed for what it produced, its hold settled
        deadline = time.monotonic() + 60
        while open_holds(db_url):
            assert time.monotonic() < deadline, "the left stream's hold was never settled"
            time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(timeout=60)

    with session(db_url, readonly=True) as s:
        cut = s.scalars(select(ReservationRow).where(ReservationRow.request_id == cut_id)).one()
        assert cut.settled and cut.settled_u == 0  # released: its tokens are unknown, nothing is billed
        rows = list(s.scalars(select(LedgerEntry)))
        assert [(r.request_id, r.api_key_id, r.status) for r in rows] == [(again, key_id, "stream_interrupted")]
        [st] = budgets.status(s, "key", key_id)
        assert st.outstanding_u == 0 and st.spent_u == ledger.spend(s, "key", key_id) == rows[0].cost_total_u > 0
