"""`mainspring run`, `mainspring runs …` and `mainspring audit …` against a real server (scripted policy model,
test tools; see tests/api/test_agent_routes.py): the live view of the steps, approvals from the command line,
budget / cancel, the audit trail verified offline and after tampering, and a clear exit 2 when no server is up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from httpx_sse import EventSource
from sqlalchemy import text
from typer.testing import CliRunner

from mainspring.agents.cli import audit_app, run_cmd, runs_app
from mainspring.agents.client import run_events
from mainspring.agents.render import describe
from mainspring.store.db import get_engine
from tests.api.test_agent_routes import PRICED_MODEL, TERMINAL, agent_server, wait_status
from tests.ports import free_port

cli = typer.Typer()
cli.command("run")(run_cmd)
cli.add_typer(runs_app, name="runs")
cli.add_typer(audit_app, name="audit")
ROOT = Path(__file__).resolve().parents[2]


def mainspring(*args: str) -> "CliResult":
    r = CliRunner().invoke(cli, list(args))
    assert not (r.exception and not isinstance(r.exception, SystemExit)), r.exception  # no traceback, ever
    return CliResult(r.exit_code, r.stdout, r.stderr)


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A server; the CLI finds it (and its database) through the MAINSPRING_* variables, as a user's would."""
    with agent_server(tmp_path) as s:
        port = s.url.rsplit(":", 1)[1]
        for name, value in (("HOST", "127.0.0.1"), ("PORT", port), ("DATA_DIR", str(tmp_path)),
                            ("DATABASE_URL", f"sqlite:///{tmp_path}/db.sqlite")):
            monkeypatch.setenv(f"MAINSPRING_{name}", value)
        yield s


def test_no_server_exits_2_with_a_message(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("MAINSPRING_PORT", str(port))
    for args in (["runs", "list"], ["run", "do something"], ["runs", "approve", "int_x"]):
        r = mainspring(*args)
        assert r.code == 2, r
        assert f"no server at http://127.0.0.1:{port} — start it with `make up`" in r.err
        assert "Traceback" not in r.err + r.out


def test_run_shows_the_steps_live_and_the_result(server):
    r = mainspring("run", "find the answer", "--agent", "helper", "--tools", "echo", "--budget-usd", "1.00",
                   "--model", PRICED_MODEL)
    assert r.code == 0, r
    lines = r.out.splitlines()
    assert lines[0].startswith("▶ run_") and lines[0].endswith("goal: find the answer")
    assert "step 1  model: calling echo" in lines
    assert 'step 1  → echo({"text": "find the answer"})' in lines
    assert '        echo completed → echo ran with {"text": "find the answer"}' in lines
    assert "✓ succeeded (final_answer)" in lines
    assert 'done: echo ran with {"text": "find the answer"}' in lines  # the result
    assert re.search(r"^succeeded · 2 steps · 220 tokens \(200 in, 0 cached, 20 out\) · \$0\.000028 · run_\w+$",
                     lines[-1]), lines[-1]
    run_id = lines[-1].rsplit(" ", 1)[1]
    assert r.err.strip() == f"{run_id} · agent helper v1 · model {PRICED_MODEL} · echo"

    again = mainspring("run", "second", "--agent", "helper", "--no-follow")  # reuses the agent as it is
    assert again.code == 0 and again.out.strip().startswith("run_") and "agent helper v1" in again.err
    listed = mainspring("runs", "list")
    assert listed.code == 0, listed
    assert listed.out.splitlines()[0].split() == ["RUN", "STATUS", "AGENT", "STEPS", "TOKENS", "COST_USD", "CREATED",
                                                  "GOAL"]
    rows = {line.split()[0]: line.split() for line in listed.out.splitlines()[1:]}
    assert rows[run_id][1:6] == ["succeeded", "agent_helper_v1", "2", "220", "0.000028"]
    assert again.out.strip() in rows
    shown = mainspring("runs", "show", run_id)
    assert shown.code == 0 and 'done: echo ran with {"text": "find the answer"}' in shown.out
    assert "budget  ∞ tokens, $1" in shown.out
    unknown_tool = mainspring("run", "x", "--agent", "other", "--tools", "echo,rm_rf")
    assert unknown_tool.code == 2 and "unknown tools ['rm_rf']" in unknown_tool.err and "[HTTP 400]" in unknown_tool.err
    missing = mainspring("runs", "show", "run_nope")
    assert missing.code == 2 and "no run 'run_nope' [HTTP 404]" in missing.err


def test_a_followed_run_waits_for_approval_given_from_another_terminal(server):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    follower = subprocess.Popen(
        [sys.executable, "-c", "import typer; from mainspring.agents.cli import run_cmd; typer.run(run_cmd)",
         "open the door", "--agent", "gate", "--tools", "guarded"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen, deadline = [], time.monotonic() + 30
        while not any("mainspring runs approve int_" in line for line in seen):
            assert time.monotonic() < deadline and follower.poll() is None, seen
            seen.append(follower.stdout.readline().rstrip("\n"))
        assert any(line.startswith("⏸ waiting for approval: guarded(") for line in seen), seen
        interrupt_id = seen[-1].split()[-1]
        edited = mainspring("runs", "approve", interrupt_id, "--args", '{"text": "knock first"}')
        assert edited.code == 0, edited
        assert f"{interrupt_id} edited: guarded" in edited.out
        out, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert "  edited by anonymous" in out
    assert 'done: guarded ran with {"text": "knock first"}' in out
    assert server.tools["guarded"].calls == [{"text": "knock first"}]


def test_approve_and_reject_by_run_id(server):
    assert mainspring("runs", "approve", "run_nope").code == 2
    first = mainspring("run", "ship it", "--agent", "gate", "--tools", "guarded", "--no-follow").out.strip()
    wait_status(server, first, ("waiting_approval",))
    bad = mainspring("runs", "approve", first, "--args", "[1, 2]")
    assert bad.code == 2 and "--args must be a JSON object" in bad.err
    assert mainspring("runs", "approve", first, "--args", "{nope").code == 2
    approved = mainspring("runs", "approve", first, "--comment", "looks fine")
    assert approved.code == 0 and " approved: guarded(" in approved.out
    assert wait_status(server, first, TERMINAL)["result"] == 'done: guarded ran with {"text": "ship it"}'
    nothing = mainspring("runs", "approve", first)
    assert nothing.code == 2 and f"run {first} has no pending approval" in nothing.err

    second = mainspring("run", "burn it", "--agent", "gate", "--no-follow").out.strip()
    wait_status(server, second, ("waiting_approval",))
    rejected = mainspring("runs", "reject", second, "--comment", "no")
    assert rejected.code == 0 and " rejected: guarded(" in rejected.out
    assert wait_status(server, second, TERMINAL)["result"] == "done: A human rejected this call: no. It was not run."
    assert server.tools["guarded"].calls == [{"text": "ship it"}]


def test_budget_resumes_a_paused_run_and_cancel_ends_one(server):
    paused = mainspring("run", "count", "--agent", "tiny", "--tools", "echo", "--budget-tokens", "5", "--no-follow")
    run_id = paused.out.strip()
    assert wait_status(server, run_id, ("paused",) + TERMINAL)["pause_reason"] == "budget"
    events = mainspring("runs", "events", run_id, "--no-follow")
    assert f"⏸ paused: budget reached — raise it: mainspring runs budget {run_id} --tokens N (or --usd X)" \
        in events.out.splitlines()
    assert mainspring("runs", "budget", run_id).code == 2  # neither --tokens nor --usd
    raised = mainspring("runs", "budget", run_id, "--tokens", "100000")
    assert raised.code == 0 and "budget 100000 tokens" in raised.out
    assert wait_status(server, run_id, TERMINAL)["status"] == "succeeded"
    assert mainspring("runs", "list", "--status", "paused").out.strip() == "no runs with status paused"

    slow = mainspring("run", "nap", "--agent", "sleepy", "--tools", "slow", "--no-follow").out.strip()
    wait_status(server, slow, ("running",))
    cancelled = mainspring("runs", "cancel", slow)
    assert cancelled.code == 0 and cancelled.out.startswith(slow)
    assert wait_status(server, slow, TERMINAL, timeout=10)["status"] == "cancelled"
    refused = mainspring("runs", "resume", slow)
    assert refused.code == 2 and "already cancelled" in refused.err and "[HTTP 409]" in refused.err


def test_audit_verify_works_offline_and_names_the_tampered_entry(tmp_path, monkeypatch):
    db_url = f"sqlite:///{tmp_path}/db.sqlite"
    with agent_server(tmp_path) as s:
        port = s.url.rsplit(":", 1)[1]
        monkeypatch.setenv("MAINSPRING_PORT", port)
        r = mainspring("run", "audit me", "--agent", "helper", "--tools", "echo")
        assert r.code == 0, r
        run_id = r.out.splitlines()[-1].rsplit(" ", 1)[1]
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", db_url)  # the server is down now: the audit reads the database

    clean = mainspring("audit", "verify", run_id)
    assert clean.code == 0 and clean.out.startswith(f"ok: {run_id} audit trail intact, 5 entries, head ")
    exported = tmp_path / "audit.jsonl"
    assert mainspring("audit", "export", run_id, "-o", str(exported)).code == 0
    entries = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [e["kind"] for e in entries] == ["run.created", "model.step", "tool.call", "model.step", "run.finished"]
    assert mainspring("audit", "export", run_id).out == exported.read_text()

    with get_engine(db_url).begin() as conn:  # someone rewrites what the tool returned
        conn.execute(text("UPDATE audit_log SET payload_json = replace(payload_json, 'echo ran', 'echo did not run') "
                          "WHERE run_id = :r AND seq = 3"), {"r": run_id})
    tampered = mainspring("audit", "verify", run_id)
    assert tampered.code == 1, tampered
    assert f"TAMPERED: {run_id} audit entry 3 (tool.call): content does not match its hash (edited); 5 entries" \
        in tampered.err
    unknown = mainspring("audit", "verify", "run_nope")
    assert unknown.code == 2 and "no run 'run_nope'" in unknown.err


def test_the_view_parses_sse_and_describes_every_event_kind():
    frames = ["retry: 1000", "", ": ping", "", "id: 7", "event: run.created",
              'data: {"id": 7, "run_id": "run_1", "type": "run.created", "data": {"goal": "g"}}', ""]
    stream = httpx.Response(200, headers={"content-type": "text/event-stream"},
                            text="".join(f + "\n" for f in frames))
    (ev,) = list(run_events(EventSource(stream)))
    assert describe(ev) == "[bold]▶ run_1[/bold]  goal: g"
    assert describe({"type": "tool.finished", "data": {"name": "x", "status": "failed", "content": "[boom]"}}) \
        == "        [red]x failed[/red] → \\[boom]"  # tool output is escaped, never read as markup
    assert describe({"type": "step.started", "data": {"seq": 1, "attempt": 1}}) is None
    assert "attempt 2" in describe({"type": "step.started", "data": {"seq": 1, "attempt": 2}})
    assert describe({"type": "run.status", "run_id": "run_1", "data": {"status": "paused", "reason": "user"}}) \
        == "[yellow bold]⏸ paused[/yellow bold] — resume it: mainspring runs resume run_1"
    assert describe({"type": "something.new", "data": {"a": 1}}) == '[dim]· something.new {"a": 1}[/dim]'


def test_run_uploads_its_documents_and_database_and_server_paths_need_a_root(server, tmp_path):
    docs = tmp_path / "mydocs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("alpha")
    (docs / "sub" / "b.md").write_text("beta")
    (docs / ".hidden").write_text("not sent")
    db = tmp_path / "facts.duckdb"
    db.write_bytes(b"not really a database")
    r = mainspring("run", "read", "--agent", "reader", "--tools", "echo", "--docs", str(docs), "--db", str(db),
                   "--no-follow")
    assert r.code == 0, r
    run = server.app.state.agents.run(r.out.strip())
    attached = json.loads(run.attachments_json)
    assert sorted(p.name for p in Path(attached["docs"]).iterdir()) == ["a.txt", "b.md"]
    assert Path(attached["db"]).name == "facts.duckdb" and Path(attached["db"]).read_bytes() == db.read_bytes()
    assert Path(attached["docs"]).resolve().is_relative_to(tmp_path.resolve())  # a copy on the server side
    refused = mainspring("run", "read", "--agent", "reader", "--docs", str(docs), "--server-paths", "--no-follow")
    assert refused.code == 2 and "[HTTP 400]" in refused.err  # here: under the data dir, never attachable
    assert "data directory cannot be attached" in refused.err
