"""A plan's audit: every run it had (each task's attempts and handoffs, and the runs they asked with ask_agent),
each run's own hash chain verified (agents/audit.py), and one plan-level chain linking them.

The plan chain is computed, not stored: h_0 = GENESIS, then one link per plan event in order
(sha256(h | seq | type | task | created_at | data)), then one per run in the order the plan met them
(sha256(h | run id | that run's audit head)). Its `head` changes if any plan event, or any entry of any of the
plan's runs, is edited, added or dropped; keep a head elsewhere (a ticket, a commit) to check a plan against
later, as with a run's own head.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sqlalchemy import select

from mainspring.agents import audit
from mainspring.agents.plans.tables import PlanEventRow
from mainspring.agents.tables import RunRow
from mainspring.store.db import session

RUN_EVENTS = ("task.dispatched", "task.handed_off")  # the events that name a new run of a task


@dataclass
class RunLink:
    run_id: str
    task: str | None  # the plan task it worked on (None: a run asked by one of them)
    parent_run_id: str | None
    verdict: audit.Verdict


@dataclass
class PlanAudit:
    plan_id: str
    ok: bool  # every run's chain verifies
    head: str  # the plan chain's last hash
    events: int
    runs: list[RunLink]


def _link(prev: str, *parts: object) -> str:
    return hashlib.sha256("|".join((prev, *map(str, parts))).encode()).hexdigest()


def plan_audit(db: str, plan_id: str) -> PlanAudit:
    """The audit of plan `plan_id` (the caller checks it may see the plan)."""
    with session(db, readonly=True) as s:
        events = list(s.scalars(select(PlanEventRow).where(PlanEventRow.plan_id == plan_id)
                                .order_by(PlanEventRow.seq)))
        head = audit.GENESIS
        order: list[tuple[str, str | None]] = []
        for ev in events:
            head = _link(head, ev.seq, ev.type, ev.task_key or "", ev.created_at.isoformat(), ev.data_json)
            run_id = json.loads(ev.data_json).get("run_id") if ev.type in RUN_EVENTS else None
            if run_id and run_id not in {r for r, _ in order}:
                order.append((run_id, ev.task_key))
        links: list[RunLink] = []
        frontier: list[tuple[str, str | None, str | None]] = [(run_id, task, None) for run_id, task in order]
        seen: set[str] = set()
        while frontier:
            run_id, task, parent = frontier.pop(0)
            if run_id in seen or s.get(RunRow, run_id) is None:
                continue  # a run id written down whose run was never created (a crash; the task then failed)
            seen.add(run_id)
            links.append(RunLink(run_id, task, parent, audit.verify(s, run_id)))
            children = s.scalars(select(RunRow.id).where(RunRow.parent_run_id == run_id).order_by(RunRow.created_at))
            frontier.extend((child, None, run_id) for child in children)
    for link in links:
        head = _link(head, link.run_id, link.verdict.head)
    return PlanAudit(plan_id, all(r.verdict.ok for r in links), head, len(events), links)
