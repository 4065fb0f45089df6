"""The web console in a real browser (tests/web/conftest.py): what the issue's acceptance names.

A run started through the API shows in the runs list; the live view shows a tool call appear with its arguments
and then its result; Approve resumes a waiting run; the cost page plots one point per day; with auth on the
console asks for a key and shows only that key's project; the layout holds on a narrow window. Every page is
screenshotted into the test's tmp dir, and none logs a console error.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from datetime import datetime, time as dtime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from mainspring.agents.tools.base import ToolResult
from tests.api.test_agent_routes import (TERMINAL, AgentServer, agent_server, make_agent, ok, start_run, test_tools,
                                         wait_status)

HOLD_S = 30.0  # the most a held tool call waits for the test to let it go


@dataclass
class HoldTool:
    """TEST-ONLY tool that does not return until the test sets `release`: the page is watched while it runs."""

    name: str = "hold"
    description: str = "wait, then echo the text"
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {"text": {"type": "string"}}})
    idempotent: bool = True
    requires_approval: bool = False
    timeout_s: float = 60
    retries: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    async def call(self, args: dict, ctx: Any) -> ToolResult:
        await asyncio.to_thread(self.release.wait, HOLD_S)
        return ToolResult(f"held and let go: {json.dumps(args, sort_keys=True)}")


@pytest.fixture
def srv(tmp_path) -> Iterator[AgentServer]:
    hold = HoldTool()
    with agent_server(tmp_path / "data", tools={**test_tools(), "hold": hold}) as s:
        try:
            yield s
        finally:
            hold.release.set()  # a test that failed mid-call does not keep the server's shutdown waiting


def no_errors(c: Any) -> None:
    assert c.errors == [], c.errors


def test_runs_list_shows_a_run_started_through_the_api(srv, console):
    make_agent(srv, "helper", ["echo"])
    run = start_run(srv, "helper", "list me")
    wait_status(srv, run["id"], TERMINAL)
    c = console(srv.url)
    page = c.open()
    row = page.locator("#runs-list tbody tr", has_text=run["id"])
    row.wait_for()
    assert "succeeded" in row.inner_text() and "helper" in row.inner_text() and "list me" in row.inner_text()
    page.select_option("#f-status", "failed")  # the state filter asks the server: this run is not failed
    page.locator("#runs-list", has_text="No runs match.").wait_for()
    assert page.url.endswith("#/runs?status=failed")  # a filtered list can be bookmarked
    page.reload()
    page.locator("#runs-list", has_text="No runs match.").wait_for()
    assert page.locator("#f-status").input_value() == "failed"
    page.select_option("#f-status", "")
    page.select_option("#f-agent", "helper")
    row.wait_for()
    row.locator("a").click()
    page.locator("#run-status", has_text="succeeded").wait_for()
    c.shot("runs-list")
    no_errors(c)


def test_live_view_shows_a_tool_call_appear_then_its_result(srv, console):
    make_agent(srv, "holder", ["hold"])
    run = start_run(srv, "holder", "wait for me")
    wait_status(srv, run["id"], ("running",))
    c = console(srv.url)
    page = c.open(f"#/runs/{run['id']}")
    call = page.locator("#timeline .ev.tool", has_text="hold")
    call.wait_for()  # the call is in flight: its tool.started event came over the SSE stream
    assert json.loads(call.locator("pre.args").inner_text()) == {"text": "wait for me"}
    assert page.locator("#timeline .ev.tool-result").count() == 0
    c.shot("run-live")
    srv.tools["hold"].release.set()
    result = page.locator("#timeline .ev.tool-result", has_text="hold")
    result.wait_for()
    assert 'held and let go: {"text": "wait for me"}' in result.inner_text()
    page.locator("#timeline .ev.end", has_text="succeeded").wait_for()
    page.locator("#run-status", has_text="succeeded").wait_for()
    no_errors(c)


def test_approve_resumes_a_waiting_run_and_the_audit_chain_verifies(srv, console):
    make_agent(srv, "gate", ["guarded"])
    run = start_run(srv, "gate", "open the door")
    wait_status(srv, run["id"], ("waiting_approval",))
    c = console(srv.url)
    page = c.open(f"#/runs/{run['id']}")
    card = page.get_by_role("article", name="Approval for guarded")
    card.wait_for()
    assert json.loads(card.locator("pre").inner_text()) == {"text": "open the door"}
    c.shot("run-approval")
    card.get_by_role("button", name="Approve").click()
    assert wait_status(srv, run["id"], TERMINAL)["status"] == "succeeded"
    assert srv.tools["guarded"].calls == [{"text": "open the door"}]
    page.locator("#timeline .ev.end", has_text="succeeded").wait_for()
    card.wait_for(state="detached")  # the decided call's card is gone, and the page says nothing waits
    assert page.locator("#approvals p.empty").is_visible()

    page.get_by_role("button", name="Verify chain").click()  # the server checks the chain; the page shows it
    page.locator("#audit-verdict.ok", has_text="Chain intact").wait_for()
    with page.expect_download() as dl:
        page.get_by_role("button", name="Download JSONL").click()
    lines = Path(dl.value.path()).read_text().splitlines()
    assert lines and all(json.loads(line)["hash"] for line in lines)
    c.shot("run-audit")
    no_errors(c)


def test_edit_runs_the_call_with_other_arguments_and_reject_tells_the_model(srv, console):
    make_agent(srv, "gate", ["guarded"])
    edited, rejected = (start_run(srv, "gate", goal) for goal in ("open the front door", "open the safe"))
    c = console(srv.url)
    wait_status(srv, edited["id"], ("waiting_approval",))
    page = c.open(f"#/runs/{edited['id']}")
    card = page.get_by_role("article", name="Approval for guarded")
    card.locator("summary", has_text="Edit the arguments").click()
    box = card.get_by_label("Arguments (JSON object)")
    box.fill("{not json")
    card.get_by_role("button", name="Run with these arguments").click()
    page.locator("#status", has_text="not JSON").wait_for()  # refused in the page: nothing was sent
    assert wait_status(srv, edited["id"], ("waiting_approval",))
    box.fill('{"text": "open the back door"}')
    card.get_by_role("button", name="Run with these arguments").click()
    assert wait_status(srv, edited["id"], TERMINAL)["status"] == "succeeded"
    assert srv.tools["guarded"].calls == [{"text": "open the back door"}]

    wait_status(srv, rejected["id"], ("waiting_approval",))
    page = c.open(f"#/runs/{rejected['id']}")
    card = page.get_by_role("article", name="Approval for guarded")
    card.get_by_label("Comment for the model (on reject)").fill("not the safe")
    card.get_by_role("button", name="Reject").focus()  # by keyboard: a real button, Enter presses it
    page.keyboard.press("Enter")
    done = wait_status(srv, rejected["id"], TERMINAL)
    assert srv.tools["guarded"].calls == [{"text": "open the back door"}]  # the rejected call never ran
    assert "not the safe" in done["result"]  # the model was told why
    page.locator("#timeline .ev", has_text="Approval reject").wait_for()
    no_errors(c)


def test_a_run_paused_by_its_budget_goes_on_when_the_page_raises_it(srv, console):
    make_agent(srv, "thrifty", ["echo"])
    run = start_run(srv, "thrifty", "count coins", cost_budget_usd="0.00002")
    assert wait_status(srv, run["id"], ("paused",))["pause_reason"] == "budget"
    c = console(srv.url)
    page = c.open(f"#/runs/{run['id']}")
    form = page.get_by_role("form", name="Raise the budget")
    form.locator("p", has_text="reached its budget").wait_for()
    form.get_by_label("Cost budget (USD)").fill("lots")
    form.get_by_role("button", name="Set budget").click()
    page.locator("#status", has_text="Budget not changed").wait_for()  # the server's 400, shown
    assert wait_status(srv, run["id"], ("paused",))["budget"]["cost_budget_usd"] == "0.00002"
    form.get_by_label("Cost budget (USD)").fill("1.00")
    form.get_by_role("button", name="Set budget").click()
    assert wait_status(srv, run["id"], TERMINAL)["status"] == "succeeded"
    page.locator("#timeline .ev.end", has_text="succeeded").wait_for()
    assert all("status of 400" in e for e in c.errors), c.errors


def test_cancel_from_the_live_view(srv, console):
    make_agent(srv, "holder", ["hold"])
    run = start_run(srv, "holder", "cancel me")
    wait_status(srv, run["id"], ("running",))
    c = console(srv.url)
    page = c.open(f"#/runs/{run['id']}")
    page.locator("#timeline .ev.tool", has_text="hold").wait_for()
    page.get_by_role("button", name="Cancel").click()
    assert wait_status(srv, run["id"], TERMINAL)["status"] == "cancelled"
    page.locator("#run-status", has_text="cancelled").wait_for()
    no_errors(c)


def add_usage(srv: AgentServer, day: datetime, cost_u: int, n: int) -> None:
    """A ledger row on `day` (the ledger is append-only; a row of another day is written as such)."""
    from mainspring.store.db import session
    from mainspring.store.tables import LedgerEntry

    econ = srv.app.state.economics
    with session(econ.db) as s:
        s.add(LedgerEntry(ts=day, request_id=f"web-test-{n}", model="SmolLM2-135M-Instruct", tier="standard",
                          endpoint="/v1/chat/completions", tokens_input_uncached=800, tokens_cache_read=200,
                          tokens_output=50, cost_input_u=cost_u, cost_total_u=cost_u,
                          price_sheet_version=econ.sheet.version))


def test_cost_page_plots_one_point_per_day(srv, console):
    today = datetime.combine(datetime.now(timezone.utc).date(), dtime(12), tzinfo=timezone.utc)
    for n, back in enumerate((4, 2, 0)):  # usage on three days, nothing in between
        add_usage(srv, today - timedelta(days=back), 1000 * (n + 1), n)
    by_day = ok(srv.http.get("/v1/usage", params={"by": "day"}))["data"]
    assert len(by_day) == 3
    c = console(srv.url)
    page = c.open("#/costs")
    points = page.locator("svg.chart.line circle.pt")
    points.first.wait_for()
    assert points.count() == 5  # every day from the first to the last, a day without usage plotted as zero
    ys = [int(points.nth(i).get_attribute("data-y")) for i in range(5)]
    assert ys == [1000, 0, 2000, 0, 3000]
    assert page.locator("#cache-hit-rate").inner_text() == "20.0%"  # 600 of 3000 input tokens were cached
    assert page.locator("#total-spent").inner_text() == "$0.006000"
    c.shot("costs")
    no_errors(c)


def test_narrow_window_has_no_page_wide_scroll(srv, console):
    make_agent(srv, "helper", ["echo"])
    run = start_run(srv, "helper", "a goal long enough to need room " * 4)
    wait_status(srv, run["id"], TERMINAL)
    c = console(srv.url, viewport={"width": 390, "height": 800})
    for route, ready in (("", "#runs-list tbody tr"), (f"#/runs/{run['id']}", "#timeline .ev.end"),
                         ("#/costs", "svg.chart.line"), ("#/plans", "main .empty"), ("#/training", "main .empty"),
                         ("#/scenes", "#glb-file")):
        page = c.open(route)
        page.locator(ready).first.wait_for()
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), route
    c.shot("narrow-costs")
    no_errors(c)


@pytest.fixture
def authed(tmp_path) -> Iterator[dict]:
    from mainspring.billing.budgets import set_budget
    from mainspring.billing.keys import create_key
    from mainspring.store.db import session

    with agent_server(tmp_path / "data", require_auth=True) as s:
        with session(s.app.state.agents.db) as db:
            a, b = create_key(db, "alpha"), create_key(db, "beta")
            set_budget(db, "key", a.key.id, "month", 1_000_000)
            set_budget(db, "key", b.key.id, "month", 7_000_000)
        A = httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {a.secret}"})
        B = httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {b.secret}"})
        spec = {"name": "helper", "model": "SmolLM2-135M-Instruct", "instructions": "Test agent.",
                "tools": ["echo"], "limits": {"max_tokens": 16}}
        for client, goal in ((A, "alpha's own goal"), (B, "beta-only secret goal")):
            ok(client.post("/v1/agents", json=spec), 201)
            run = ok(client.post("/v1/runs", json={"agent": "helper", "goal": goal}), 201)
            s.http.headers["Authorization"] = client.headers["Authorization"]
            wait_status(s, run["id"], TERMINAL)
        yield {"server": s, "alpha": a, "beta": b, "A": A, "B": B,
               "runs": {"alpha": ok(A.get("/v1/runs"))["data"], "beta": ok(B.get("/v1/runs"))["data"]}}
        A.close()
        B.close()


def test_with_auth_the_console_asks_for_a_key_and_shows_only_its_project(authed, console):
    s, alpha_run, beta_run = authed["server"], authed["runs"]["alpha"][0], authed["runs"]["beta"][0]
    c = console(s.url)
    page = c.open()
    dialog = page.get_by_role("dialog", name="API key")
    dialog.wait_for()  # the API answered 401: the page asks instead of showing anything
    assert page.locator("#runs-list tbody tr").count() == 0
    c.shot("auth-key")
    dialog.get_by_label("Key").fill("sk-not-a-key")
    dialog.get_by_role("button", name="Use key").click()
    dialog.locator("#key-reason", has_text="The key was refused").wait_for()  # asked again, saying why
    dialog.get_by_label("Key").fill(authed["alpha"].secret)
    dialog.get_by_role("button", name="Use key").click()
    page.locator("#runs-list tbody tr", has_text=alpha_run["id"]).wait_for()
    page.locator("#who", has_text=f"Project {authed['alpha'].key.project_id}").wait_for()
    listed = page.locator("#runs-list").inner_text()
    assert beta_run["id"] not in listed and "beta-only" not in listed
    assert page.locator("#runs-list tbody tr").count() == len(authed["runs"]["alpha"])
    assert authed["alpha"].secret not in page.content()  # the key is in sessionStorage, not in the page
    c.shot("auth-runs")

    page = c.open("#/costs")  # alpha's budget, with what alpha's run spent; not beta's
    (budget,) = ok(authed["A"].get("/v1/budgets"))["data"]
    row = page.locator("#limits-h ~ .scroll tbody tr")
    row.first.wait_for()
    assert row.count() == 1
    cells = row.inner_text().split("\t")
    assert cells[:6] == [f"key {authed['alpha'].key.id}", "month", "$1", f"${budget['spent_usd']}", "$0",
                         f"${budget['remaining_usd']}"]
    assert "$7" not in page.locator("main").inner_text()

    page = c.open(f"#/runs/{beta_run['id']}")  # another project's run, by its id: the API says 404
    page.locator("main [role=alert]").wait_for()
    assert "beta-only" not in page.locator("main").inner_text()
    page.reload()  # the key outlives a reload of the tab (sessionStorage), so no dialog this time
    page.locator("main [role=alert]").wait_for()
    assert not page.get_by_role("dialog", name="API key").is_visible()
    # the only errors logged are the refused requests: the first 401 and the other project's 404s
    assert all("status of 401" in e or "status of 404" in e for e in c.errors), c.errors
