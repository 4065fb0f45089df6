"""The console's plan page in chromium: a plan's tasks with their live states, a gated task's run approved from
the run view, and the plan's tasks moving on to succeeded without a reload."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.api.test_agent_routes import AgentServer, agent_server, make_agent, ok, wait_status


@pytest.fixture
def srv(tmp_path) -> Iterator[AgentServer]:
    with agent_server(tmp_path / "data") as s:
        yield s


def task_row(page, key: str):
    return page.locator("#tasks tbody tr", has=page.locator("td:first-child", has_text=key))


def test_plan_tasks_with_live_states(srv, console):
    make_agent(srv, "gate", ["guarded"])
    make_agent(srv, "helper", ["echo"])
    plan = ok(srv.http.post("/v1/plans", json={"goal": "ship it", "name": "release", "tasks": [
        {"id": "check", "agent": "gate", "prompt": "check {goal}"},
        {"id": "announce", "agent": "helper", "prompt": "announce it", "depends_on": ["check"]}]}))
    c = console(srv.url)
    page = c.open("#/plans")
    page.get_by_role("link", name="release").click()
    check = task_row(page, "check")
    check.locator(".badge", has_text="waiting_approval").wait_for()  # its run waits for a human
    assert "waiting" in task_row(page, "announce").inner_text()
    graph = page.get_by_role("img", name="Task graph")  # the same states, drawn: check → announce
    assert graph.locator('g[data-task="check"]').get_attribute("data-status") == "running"
    assert graph.locator('g[data-task="announce"]').get_attribute("data-status") == "waiting"
    assert graph.locator("path.edge").count() == 1
    c.shot("plan-waiting")

    run_id = next(t["run_id"] for t in ok(srv.http.get(f"/v1/plans/{plan['id']}"))["tasks"] if t["key"] == "check")
    wait_status(srv, run_id, ("waiting_approval",))
    check.get_by_role("link", name=run_id).click()
    page.get_by_role("article", name="Approval for guarded").get_by_role("button", name="Approve").click()
    page.locator("#run-status", has_text="succeeded").wait_for()
    page.go_back()
    page.locator("#plan-status", has_text="succeeded").wait_for(timeout=30_000)
    for key in ("check", "announce"):
        assert "succeeded" in task_row(page, key).inner_text()
        assert page.locator(f'#task-graph g[data-task="{key}"]').get_attribute("data-status") == "succeeded"
    c.shot("plan-done")
    assert c.errors == [], c.errors
