"""A plan's audit: every run it had (a handoff's and an ask_agent child's included) with its own chain verified,
and the plan-level head, which an edit of any run's entry changes. Scripted models (TEST-ONLY)."""

from __future__ import annotations

from sqlalchemy import text

from mainspring.agents.plans.plan_audit import plan_audit
from mainspring.agents.plans.spec import PlanSpec
from mainspring.store.db import session
from tests.agents.conftest import drive, make_runtime
from tests.agents.plans.test_coordination import Scripted, agent, task
from tests.agents.plans.test_scheduler import wait_plan


def test_the_plan_audit_links_every_run_and_notices_an_edit(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("writer", "handoff editor: finish it"))
    rt.put_agent(agent("editor", "ask checker: is it right"))
    rt.put_agent(agent("checker"))
    plan = PlanSpec(goal="g", tasks=[task("draft", "writer"), task("after", "checker", depends_on=["draft"])])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id)

    done = drive(rt, body)
    assert done.status == "succeeded"
    report = plan_audit(db_url, done.id)
    assert report.ok and report.events > 0
    tasks = [link.task for link in report.runs]
    assert tasks.count("draft") == 2 and tasks.count("after") == 1  # the writer's run and the editor's
    (child,) = [link for link in report.runs if link.task is None]  # the checker the editor asked
    editor = next(link for link in report.runs if link.run_id == child.parent_run_id)
    assert editor.task == "draft"
    assert all(link.verdict.entries > 0 for link in report.runs)
    assert plan_audit(db_url, done.id).head == report.head  # computed, stable

    with session(db_url) as s:  # tamper with one entry of the child run
        s.execute(text("UPDATE audit_log SET payload_json = '{}' WHERE run_id = :r AND seq = 1"),
                  {"r": child.run_id})
    tampered = plan_audit(db_url, done.id)
    assert not tampered.ok and tampered.head != report.head
    bad = next(link for link in tampered.runs if link.run_id == child.run_id)
    assert bad.verdict.broken_at == 1
