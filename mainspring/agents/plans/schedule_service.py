"""Schedules as one caller sees them: `AgentRuntime.schedules` for the HTTP API and the CLI.

Scoping is the runtime's, as for plans (service.py): a project's caller sees only its schedules, another
project's is "not found" (404). What a schedule starts is checked when it is created (the plan against the
project's agents and the known tools, the agent's existence), so a bad one is a 400 then, not a failure at its
first fire. A webhook's delivery comes through the operator's view (it carries no API key: its signature is
its authentication) and starts what it starts in the schedule's own project, charged to the key that created it.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from sqlalchemy import select

from mainspring.agents.journal import now, project_is
from mainspring.agents.plans import schedules, store
from mainspring.agents.plans.schedule_tables import ScheduleFireRow, ScheduleRow
from mainspring.agents.plans.schedules import Fired, ScheduleError
from mainspring.agents.plans.spec import PlanError, PlanSpec, validate_plan
from mainspring.agents.tables import AgentRow
from mainspring.store.db import session


class Schedules:
    def __init__(self, db: str, project: store.ProjectScope, api_key_id: str | None, tools: set[str],
                 wake: Callable[[], None] = lambda: None, notify: Callable[[], None] = lambda: None,
                 model_exists: Callable[[str], bool] = lambda name: True):
        self.db, self.project, self.api_key_id, self.tools = db, project, api_key_id, tools
        self.wake = wake  # the plan scheduler: a fired plan's first tasks start now, not at the next poll
        self.notify = notify  # the local worker: a fired run is there to claim
        self.model_exists = model_exists

    def _owner_project(self) -> int | None:
        return None if self.project is store.ANY else self.project  # type: ignore[return-value]

    def _target(self, plan: PlanSpec | None, agent: str | None, goal: str | None) -> dict[str, Any]:
        if (plan is None) == (agent is None):
            raise ScheduleError("a schedule starts either a plan or an agent run: give `plan`, or `agent` and "
                                "`goal`", param="plan")
        project = self._owner_project()
        if plan is not None:
            if goal is not None:
                raise ScheduleError("a plan brings its own goal; `goal` goes with `agent`", param="goal")
            if plan.attachments:  # checked per fire would need the creating key's rights kept: not built
                raise ScheduleError("a scheduled plan cannot take attachments yet; attach to a plan created "
                                    "directly", param="plan.attachments")
            if plan.simple_model is not None and not self.model_exists(plan.simple_model):
                raise ScheduleError(f"unknown model {plan.simple_model!r}", param="plan.simple_model")
            with session(self.db, readonly=True) as s:
                agents = store._stored_agents(s, project)
            try:
                validate_plan(plan, agents=agents, tools=self.tools)
            except PlanError as exc:
                raise ScheduleError(str(exc), param=f"plan.{exc.param}" if exc.param else "plan") from None
            return {"plan": json.loads(plan.model_dump_json(exclude_defaults=True))}
        if not goal:
            raise ScheduleError("an agent schedule needs the run's `goal`", param="goal")
        with session(self.db, readonly=True) as s:
            if s.scalar(select(AgentRow.id).where(AgentRow.name == agent,
                                                  project_is(AgentRow.project_id, project)).limit(1)) is None:
                raise ScheduleError(f"no agent {agent!r}", param="agent")
        return {"agent": agent, "goal": goal}

    def create(self, name: str, *, kind: str | None = None, cron: str | None = None, timezone: str = "UTC",
               plan: PlanSpec | None = None, agent: str | None = None,
               goal: str | None = None) -> tuple[ScheduleRow, str | None]:
        """The schedule and, for a webhook, its secret (returned this once only)."""
        kind = kind or ("cron" if cron is not None else None)
        if kind is None:
            raise ScheduleError("give `cron` (a cron expression), or `kind: webhook`", param="cron")
        if kind == "webhook" and cron is not None:
            raise ScheduleError("a webhook schedule fires on deliveries, not on a cron", param="cron")
        if kind == "cron" and not cron:
            raise ScheduleError("a cron schedule needs `cron`", param="cron")
        schedules.zone(timezone)
        if cron is not None:
            schedules.check_cron(cron, timezone)
        target = self._target(plan, agent, goal)
        return schedules.create_schedule(self.db, name=name, kind=kind, cron=cron, timezone=timezone, target=target,
                                         project_id=self._owner_project(), api_key_id=self.api_key_id, now=now())

    def get(self, schedule_id: str) -> ScheduleRow:
        return schedules.schedule(self.db, schedule_id, self.project)

    def recent(self, limit: int = 100) -> list[ScheduleRow]:
        return schedules.schedules(self.db, self.project, limit)

    def fires(self, schedule_id: str, limit: int = 20) -> list[ScheduleFireRow]:
        self.get(schedule_id)  # another project's: not found
        return schedules.fires(self.db, schedule_id, limit)

    def pause(self, schedule_id: str) -> ScheduleRow:
        return schedules.set_enabled(self.db, schedule_id, False, self.project, now())

    def resume(self, schedule_id: str) -> ScheduleRow:
        row = schedules.set_enabled(self.db, schedule_id, True, self.project, now())
        self.wake()
        return row

    def delete(self, schedule_id: str) -> None:
        schedules.delete_schedule(self.db, schedule_id, self.project)

    def deliver(self, schedule_id: str, body: bytes, signature: str | None, delivery_id: str | None) -> Fired:
        """A webhook delivery (see schedules.fire_webhook); whatever it started is picked up at once."""
        fired = schedules.fire_webhook(self.db, schedule_id, body, signature, delivery_id, now())
        if not fired.duplicate:
            self.wake()
            self.notify()
        return fired
