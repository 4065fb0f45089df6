"""Plans as one caller sees them: `AgentRuntime.plans` for the HTTP API and the CLI.

Scoping is the runtime's: a project's caller sees only its plans, and another project's plan is "not found"
(404), never "forbidden". Every change wakes the scheduler, so a new plan's first tasks start at once rather
than at the next poll.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy import select

from mainspring.agents.plans import store
from mainspring.agents.plans.spec import PlanError, PlanSpec
from mainspring.agents.plans.tables import PlanEventRow, PlanRow, PlanTaskRow
from mainspring.agents.tables import RunRow
from mainspring.store.db import session

PLAN_ACTIONS = ("approve", "reject", "cancel", "pause", "resume")
TASK_ACTIONS = ("approve", "reject")


@dataclass
class PlanUsage:
    runs: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_u: int


class Plans:
    def __init__(self, db: str, project: store.ProjectScope, api_key_id: str | None, tools: set[str],
                 wake: Callable[[], None] = lambda: None, model_exists: Callable[[str], bool] = lambda name: True):
        self.db, self.project, self.api_key_id, self.tools, self.wake = db, project, api_key_id, tools, wake
        self.model_exists = model_exists

    def _owner_project(self) -> int | None:
        return None if self.project is store.ANY else self.project  # type: ignore[return-value]

    def create(self, spec: PlanSpec) -> PlanRow:
        if spec.simple_model is not None and not self.model_exists(spec.simple_model):
            raise PlanError(f"unknown model {spec.simple_model!r}", param="simple_model")
        row = store.create_plan(self.db, spec, project_id=self._owner_project(), api_key_id=self.api_key_id,
                                tools=self.tools)
        self.wake()
        return row

    def get(self, plan_id: str) -> PlanRow:
        return store.plan(self.db, plan_id, project_id=self.project)

    def recent(self, limit: int = 50, status: str | None = None) -> list[PlanRow]:
        return store.plans(self.db, self._owner_project(), limit=limit, status=status)

    def tasks(self, plan_id: str) -> list[PlanTaskRow]:
        return store.tasks(self.db, plan_id, project_id=self.project)

    def events(self, plan_id: str, after: int = 0, limit: int = 500) -> list[PlanEventRow]:
        return store.events(self.db, plan_id, after, limit, project_id=self.project)

    def act(self, plan_id: str, action: str, actor: str, comment: str | None = None) -> PlanRow:
        if action not in PLAN_ACTIONS:
            raise PlanError(f"unknown action {action!r}; one of {', '.join(PLAN_ACTIONS)}", param="action")
        kw: dict[str, Any] = {"project_id": self.project}
        if action == "approve":
            row = store.approve_plan(self.db, plan_id, actor, **kw)
        elif action == "reject":
            row = store.reject_plan(self.db, plan_id, actor, comment=comment, **kw)
        else:
            row = {"cancel": store.cancel_plan, "pause": store.pause_plan,
                   "resume": store.resume_plan}[action](self.db, plan_id, actor=actor, **kw)
        self.wake()
        return row

    def act_on_task(self, plan_id: str, task_key: str, action: str, actor: str,
                    comment: str | None = None) -> PlanTaskRow:
        if action not in TASK_ACTIONS:
            raise PlanError(f"unknown action {action!r}; one of {', '.join(TASK_ACTIONS)}", param="action")
        task = next((t for t in self.tasks(plan_id) if t.key == task_key), None)
        if task is None:
            raise PlanError(f"plan {plan_id} has no task {task_key!r}", status=404)
        if action == "approve":
            row = store.approve_task(self.db, task.id, actor, project_id=self.project)
        else:
            row = store.reject_task(self.db, task.id, actor, comment=comment, project_id=self.project)
        self.wake()
        return row

    def usage(self, plan_id: str) -> PlanUsage:
        """Tokens and list-price cost of every run the plan's tasks had, retries included."""
        self.get(plan_id)  # another project's plan: not found
        with session(self.db, readonly=True) as s:
            dispatched = s.scalars(select(PlanEventRow.data_json).where(PlanEventRow.plan_id == plan_id,
                                                                      PlanEventRow.type == "task.dispatched"))
            run_ids = {json.loads(body).get("run_id") for body in dispatched} - {None}
            runs = list(s.scalars(select(RunRow).where(RunRow.id.in_(run_ids)))) if run_ids else []
        return PlanUsage(runs=len(runs), prompt_tokens=sum(r.prompt_tokens for r in runs),
                         completion_tokens=sum(r.completion_tokens for r in runs),
                         cached_tokens=sum(r.cached_tokens for r in runs), cost_u=sum(r.cost_u for r in runs))
