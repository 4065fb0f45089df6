"""Files and Batch APIs with the official openai SDK against a real server: runs to completion, bad
lines failing alone, batch-tier billing, cancel, and a batch that survives a server restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from mainspring.billing import ledger
from mainspring.billing.keys import create_key
from mainspring.billing.prices import price
from mainspring.billing.usage import UsageRecord
from mainspring.store.db import session

from tests.engine_faults import failing_engine, stopped_engine

from .conftest import serve

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"
DONE = ("completed", "failed", "expired", "cancelled")
SYSTEM = "You are a terse assistant for a shipping company. Answer in one short sentence. " * 4


def make_app(engine, data_dir: Path, db_url: str):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    return create_app(Settings(database_url=db_url, data_dir=data_dir), engine=engine)


@pytest.fixture
def srv(async_engine, tmp_path, database_url):
    """A server on its own database (SQLite or Postgres) and data directory, and an SDK client with its own key."""
    app = make_app(async_engine, tmp_path, database_url)
    with serve(app, async_engine) as server:
        yield server, app.state.economics, client(server, new_key(app.state.economics))


def new_key(econ) -> str:
    with session(econ.db) as s:
        return create_key(s, "acme").secret


def client(server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key=secret, max_retries=0, timeout=120)


def chat_line(custom_id: str, question: str, max_tokens: int = 6, **extra) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": MODEL, "temperature": 0, "max_tokens": max_tokens, **extra,
                     "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}}


def jsonl(lines: list) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def submit(c: openai.OpenAI, lines: list, endpoint: str = CHAT):
    f = c.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return c.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h",
                            metadata={"job": "test"})


def wait_for(c: openai.OpenAI, batch_id: str, until=DONE, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while True:
        b = c.batches.retrieve(batch_id)
        if b.status in until:
            return b
        assert time.monotonic() < deadline, f"batch {batch_id} still {b.status}: {b.request_counts}"
        time.sleep(0.05)


def read_lines(c: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(x) for x in c.files.content(file_id).text.splitlines()]


def ledger_rows(econ, batch_id: str) -> list:
    with session(econ.db, readonly=True) as s:
        return ledger.entries(s, batch_id=batch_id)


def staggered(n: int) -> list[dict]:
    """n lines that finish one after another: line i produces exactly 3 + 4 i tokens. Same system
    prompt and zero-padded questions, so the runner's prefix sort keeps them in this order."""
    return [chat_line(f"story-{i:02d}", f"Story {i:02d}: tell me a long story about a ship.",
                      max_tokens=3 + 4 * i, min_tokens=3 + 4 * i) for i in range(n)]


def test_batch_runs_to_completed_with_one_output_line_per_custom_id(srv):
    _, _, c = srv
    questions = ["Where is my parcel?", "Do you ship to Norway?", "Where is my parcel today?",
                 "Can I change the address?"]
    batch = submit(c, [chat_line(f"q{i}", q) for i, q in enumerate(questions)])
    assert batch.status == "validating" and batch.endpoint == CHAT and batch.metadata == {"job": "test"}
    done = wait_for(c, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 4, 0)
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.error_file_id is None
    assert c.files.retrieve(done.output_file_id).purpose == "batch_output"
    out = read_lines(c, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == ["q0", "q1", "q2", "q3"]
    for line in out:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        resp = line["response"]
        assert resp["status_code"] == 200 and resp["body"]["object"] == "chat.completion"
        assert resp["request_id"] == resp["body"]["id"] and resp["body"]["choices"][0]["message"]["content"]
    # the same system prompt is computed once: later lines read it from the prefix cache
    assert any(x["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for x in out)


def test_completions_endpoint_batch(srv):
    _, _, c = srv
    lines = [{"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"The number {i} is", "max_tokens": 3, "temperature": 0}}
             for i in range(2)]
    done = wait_for(c, submit(c, lines, endpoint="/v1/completions").id)
    out = read_lines(c, done.output_file_id)
    assert done.status == "completed" and sorted(x["custom_id"] for x in out) == ["p0", "p1"]
    assert all(x["response"]["body"]["object"] == "text_completion" for x in out)


def test_bad_lines_fail_alone_and_good_lines_are_billed_at_half_price(srv):
    _, econ, c = srv
    good = [chat_line("a", "Where is my parcel?"), chat_line("b", "Do you ship to Chile?"),
            chat_line("c", "How much is shipping?")]
    wrong_url = {**chat_line("w", "hi"), "url": "/v1/embeddings"}
    unknown_model = chat_line("ghost", "hi")
    unknown_model["body"]["model"] = "no-such-model"
    lines = [good[0], '{"custom_id": "broken", "method": "POST", ', good[1], wrong_url,
             chat_line("a", "a second line with the same custom_id"), good[2], unknown_model]
    done = wait_for(c, submit(c, lines).id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 3, 4)
    out = {x["custom_id"]: x for x in read_lines(c, done.output_file_id)}
    assert sorted(out) == ["a", "b", "c"] and all(x["response"]["status_code"] == 200 for x in out.values())
    errors = read_lines(c, done.error_file_id)
    codes = {(e["custom_id"], (e["error"] or {}).get("code")) for e in errors}
    assert {(None, "invalid_json_line"), ("w", "invalid_url"), ("a", "duplicate_custom_id")} <= codes
    ghost = next(e for e in errors if e["custom_id"] == "ghost")  # the route's own answer, passed through
    assert ghost["error"] is None and ghost["response"]["status_code"] == 404
    assert ghost["response"]["body"]["error"]["code"] == "model_not_found"
    assert all(e["response"] is None for e in errors if e["custom_id"] != "ghost")

    rows = ledger_rows(econ, done.id)
    assert sorted(r.custom_id for r in rows) == ["a", "b", "c"]  # one per completed line, none for failures
    sheet = econ.sheet
    for r in rows:
        assert (r.tier, r.model, r.status, r.endpoint) == ("batch", MODEL, "ok", CHAT)
        assert r.request_id == ledger.batch_request_id(done.id, r.custom_id)
        usage = out[r.custom_id]["response"]["body"]["usage"]
        assert usage["prompt_tokens"] == r.tokens_input_uncached + r.tokens_cache_read
        assert usage["completion_tokens"] == r.tokens_output
        rec = UsageRecord(model=MODEL, tier="standard", input_total=usage["prompt_tokens"],
                          cache_read=r.tokens_cache_read, output_total=r.tokens_output)
        batch_cost, standard = price(rec.with_(tier="batch"), sheet), price(rec, sheet)
        assert batch_cost.total_u == r.cost_total_u
        for part in ("input_u", "cache_read_u", "output_u"):  # half, up to rounding to whole micro-USD
            assert abs(2 * getattr(batch_cost, part) - getattr(standard, part)) <= 1
        assert standard.total_u > 0


def test_cancel_stops_the_batch_with_partial_output(srv):
    _, econ, c = srv
    batch = submit(c, staggered(12))
    wait_for(c, batch.id, until=("in_progress",))
    while c.batches.retrieve(batch.id).request_counts.completed < 1:
        time.sleep(0.05)
    assert c.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait_for(c, batch.id)
    assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
    out = read_lines(c, done.output_file_id)
    assert 1 <= len(out) == done.request_counts.completed < 12
    # lines aborted in flight are not billed: the ledger holds exactly the lines in the output
    assert sorted(r.custom_id for r in ledger_rows(econ, done.id)) == sorted(x["custom_id"] for x in out)
    with pytest.raises(openai.BadRequestError):
        c.batches.cancel(batch.id)


def test_batch_survives_a_server_restart(async_engine, tmp_path, database_url):
    app_a = make_app(async_engine, tmp_path, database_url)
    econ = app_a.state.economics
    secret = new_key(econ)
    with serve(app_a, async_engine) as server:
        c = client(server, secret)
        batch = submit(c, staggered(12))
        deadline = time.monotonic() + 300
        while c.batches.retrieve(batch.id).request_counts.completed < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    # server A is gone mid-batch: what it finished is in the journal, the rest is not done
    with session(econ.db, readonly=True) as s:
        from mainspring.store.tables import BatchRow

        row = s.get(BatchRow, batch.id)
        assert row.status == "in_progress"
    journal = tmp_path / "batches" / f"{batch.id}.progress.jsonl"
    before = {r["custom_id"]: r["id"] for r in map(json.loads, journal.read_text().splitlines())}
    assert 1 <= len(before) < 12, before

    app_b = make_app(async_engine, tmp_path, database_url)
    with serve(app_b, async_engine) as server:
        c = client(server, secret)
        done = wait_for(c, batch.id)
        out = read_lines(c, done.output_file_id)
    assert done.status == "completed" and done.request_counts.completed == 12
    assert sorted(x["custom_id"] for x in out) == [f"story-{i:02d}" for i in range(12)]  # each exactly once
    assert all(x["response"]["status_code"] == 200 for x in out)
    ids = {x["custom_id"]: x["id"] for x in out}
    assert all(ids[k] == v for k, v in before.items())  # lines finished on A were not run again
    rows = ledger_rows(app_b.state.economics, batch.id)
    assert sorted(r.custom_id for r in rows) == sorted(ids) and {r.status for r in rows} == {"ok"}
    assert not journal.exists()


def test_lines_failed_by_a_failed_engine_step_run_again_and_complete(embedded, tmp_path, database_url):
    flaky = failing_engine(embedded, failures=1)  # the first step fails every line in it, as a GPU fault would
    app = make_app(flaky, tmp_path, database_url)
    try:
        with serve(app, flaky) as server:
            c = client(server, new_key(app.state.economics))
            done = wait_for(c, submit(c, [chat_line(f"q{i}", f"Question {i}: where is my parcel?")
                                          for i in range(3)]).id)
            out = read_lines(c, done.output_file_id)
    finally:
        flaky.close()
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.error_file_id is None and all(x["response"]["status_code"] == 200 for x in out)
    assert sorted(r.custom_id for r in ledger_rows(app.state.economics, done.id)) == ["q0", "q1", "q2"]  # once each


def test_a_batch_on_a_stopped_engine_waits_and_a_restarted_server_finishes_it(async_engine, embedded, tmp_path,
                                                                             database_url, caplog):
    dead = stopped_engine(embedded)
    app_a = make_app(dead, tmp_path, database_url)
    secret = new_key(app_a.state.economics)
    with caplog.at_level("WARNING", logger="mainspring.api.batch_runner"), serve(app_a, dead) as server:
        c = client(server, secret)
        batch = submit(c, [chat_line(f"q{i}", f"Question {i}: where is my parcel?") for i in range(3)])
        deadline = time.monotonic() + 120
        while "paused where it stands" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        b = c.batches.retrieve(batch.id)
        assert b.status == "in_progress" and (b.request_counts.completed, b.request_counts.failed) == (0, 0)
    dead.close()
    journal = tmp_path / "batches" / f"{batch.id}.progress.jsonl"
    assert not journal.exists() or not journal.read_text().strip()  # no line recorded as failed

    app_b = make_app(async_engine, tmp_path, database_url)  # the server restarted with a working engine
    with serve(app_b, async_engine) as server:
        c = client(server, secret)
        done = wait_for(c, batch.id)
        out = read_lines(c, done.output_file_id)
    assert done.status == "completed" and done.request_counts.completed == 3 and done.error_file_id is None
    assert sorted(x["custom_id"] for x in out) == ["q0", "q1", "q2"]


def test_files_api_round_trip_and_delete(srv):
    _, _, c = srv
    data = jsonl([chat_line("x", "hello")])
    f = c.files.create(file=("mine.jsonl", data), purpose="batch")
    assert (f.object, f.filename, f.bytes, f.purpose, f.status) == ("file", "mine.jsonl", len(data), "batch",
                                                                      "processed")
    assert f.id.startswith("file-") and c.files.retrieve(f.id).bytes == len(data)
    assert c.files.content(f.id).read() == data
    other = c.files.create(file=("notes.txt", b"free text"), purpose="user_data")
    listed = c.files.list()
    assert [x.id for x in listed.data] == [other.id, f.id]
    assert [x.id for x in c.files.list(purpose="batch").data] == [f.id]
    assert c.files.delete(other.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve(other.id)
    c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.BadRequestError):  # the batch still points at it
        c.files.delete(f.id)


def test_bad_input_gets_openai_errors(srv):
    server, econ, c = srv
    with pytest.raises(openai.NotFoundError) as e:
        c.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    assert e.value.response.json()["error"]["code"] == "file_not_found"
    f = c.files.create(file=("r.jsonl", jsonl([chat_line("only", "Say hi.", max_tokens=1)])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as e:
        c.batches.create(input_file_id=f.id, endpoint="/v1/moderations", completion_window="24h")
    body = e.value.response.json()["error"]
    assert body["param"] == "endpoint" and body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="1h")
    notes = c.files.create(file=("notes.jsonl", jsonl([{"a": 1}])), purpose="user_data")
    with pytest.raises(openai.BadRequestError) as e:
        c.batches.create(input_file_id=notes.id, endpoint=CHAT, completion_window="24h")
    assert e.value.response.json()["error"]["param"] == "input_file_id"
    with pytest.raises(openai.BadRequestError):  # not JSONL at all
        c.files.create(file=("x.jsonl", b"just words\n"), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        c.batches.retrieve("batch_nope")
    # another key sees neither the file nor the batch
    stranger = client(server, new_key(econ))
    with pytest.raises(openai.NotFoundError):
        stranger.files.retrieve(f.id)
    done = wait_for(c, c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id)
    assert done.status == "completed"
    with pytest.raises(openai.NotFoundError):
        stranger.batches.retrieve(done.id)
    with pytest.raises(openai.BadRequestError) as e:
        c.batches.cancel(done.id)
    assert e.value.response.json()["error"]["code"] == "batch_not_cancellable"
    r = httpx.post(server.openai_url + "/files", data={"purpose": "batch"})  # no file part
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_list_batches_pages_newest_first(srv):
    _, _, c = srv
    f = c.files.create(file=("r.jsonl", jsonl([chat_line("only", "Say hi.", max_tokens=1)])), purpose="batch")
    made = [c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id for _ in range(3)]
    first = c.batches.list(limit=2)
    assert [b.id for b in first.data] == made[:0:-1] and first.has_more
    second = c.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in second.data] == made[:1] and not second.has_more
    for b in made:
        assert wait_for(c, b).status == "completed"


def test_a_batch_past_its_window_expires_and_a_line_over_budget_fails_with_402(srv):
    from datetime import datetime, timedelta, timezone

    from mainspring.billing import budgets
    from mainspring.store.tables import BatchRow

    server, econ, c = srv
    f = c.files.create(file=("r.jsonl", jsonl([chat_line("only", "Say hi.", max_tokens=1)])), purpose="batch")
    old = datetime.now(timezone.utc) - timedelta(hours=25)
    with session(econ.db) as s:  # as if it had waited in the queue for more than its 24 h window
        s.add(BatchRow(id="batch_old", input_file_id=f.id, endpoint=CHAT, created_at=old,
                       expires_at=old + timedelta(hours=24), api_key_id=_key_id(econ, f.id)))
    server.app.state.batch_runner.notify()
    done = wait_for(c, "batch_old")
    assert done.status == "expired" and done.expired_at and done.output_file_id is None
    assert done.request_counts.total == 1 and done.request_counts.completed == 0

    with session(econ.db) as s:
        budgets.set_budget(s, "key", _key_id(econ, f.id), "total", 1)  # 1 micro-USD: no request fits
    done = wait_for(c, c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id)
    assert done.status == "completed" and done.request_counts.failed == 1
    (line,) = read_lines(c, done.error_file_id)
    assert line["response"]["status_code"] == 402
    assert line["response"]["body"]["error"]["code"] == "budget_exceeded" and not ledger_rows(econ, done.id)


def _key_id(econ, file_id: str) -> str:
    from mainspring.store.tables import FileRow

    with session(econ.db, readonly=True) as s:
        return s.get(FileRow, file_id).api_key_id


def test_upload_over_the_size_limit_is_413(srv, monkeypatch):
    from mainspring.api.routes import files

    _, _, c = srv
    monkeypatch.setattr(files, "MAX_BYTES", 1000)
    with pytest.raises(openai.APIStatusError) as e:
        c.files.create(file=("big.jsonl", jsonl([chat_line(f"l{i}", "x" * 50) for i in range(10)])), purpose="batch")
    assert e.value.status_code == 413
    assert c.files.list().data == []  # nothing half-stored
    assert not [p for p in (srv[0].app.state.settings.data_dir / "files").iterdir()]


def test_two_servers_on_one_database_work_each_batch_once(async_engine, tmp_path, caplog, database_url):
    """Two server processes' runners on one database and data directory: one holds the batch's lease and works
    it; the other passes it over. Every line once in the output, billed once."""
    import logging

    from mainspring.agents.plans import leader

    caplog.set_level(logging.INFO, logger="mainspring.api.batch_runner")
    app_a, app_b = make_app(async_engine, tmp_path, database_url), make_app(async_engine, tmp_path, database_url)
    with serve(app_a, async_engine) as a, serve(app_b, async_engine):
        c = client(a, new_key(app_a.state.economics))
        batch = submit(c, [chat_line(f"q{i}", f"Question {i}: where is parcel {i}?", max_tokens=3) for i in range(10)])
        app_b.state.batch_runner.notify()  # both look at once
        done = wait_for(c, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 10
        out = read_lines(c, done.output_file_id)
        assert sorted(r["custom_id"] for r in out) == sorted(f"q{i}" for i in range(10))
        working = [r for r in caplog.records if batch.id in r.getMessage() and "working it" in r.getMessage()]
        assert len(working) == 1, [r.getMessage() for r in working]
        owners = {app_a.state.batch_runner.owner, app_b.state.batch_runner.owner}
        lease = leader.holder(app_a.state.economics.db, f"batch:{batch.id}")
        assert lease is not None and lease.owner in owners
        from mainspring.store.tables import LedgerEntry

        with session(app_a.state.economics.db) as s:
            billed = [e.request_id for e in s.query(LedgerEntry).all() if e.request_id.startswith(batch.id)]
        assert sorted(billed) == sorted(ledger.batch_request_id(batch.id, f"q{i}") for i in range(10))
