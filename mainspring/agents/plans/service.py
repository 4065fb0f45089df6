"""Plans as one caller sees them: `AgentRuntime.plans` for the HTTP API and the CLI.

Scoping is the runtime's: a project's caller sees only its plans, and another project's plan is "not found"
(404), never "forbidden". Every change wakes the scheduler, so a new plan's first tasks start at once rather
than at the next poll.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Callable

from sqlalchemy import select

from mainspring.agents.journal import JournalError
from mainspring.agents.plans import budget, deadlocks, planner, store
from mainspring.agents.plans.plan_audit import PlanAudit, plan_audit
from mainspring.agents.plans.spec import PlanError, PlanSpec, load_plan
from mainspring.agents.plans.tables import DeadlockRow, PlanEventRow, PlanRow, PlanTaskRow, PlanWaitRow
from mainspring.agents.plans.transitions import in_scope
from mainspring.agents.spec import AgentSpec
from mainspring.agents.status import StepStatus
from mainspring.agents.tables import AgentRow, RunRow, StepRow
from mainspring.models import ChatModel, Usage
from mainspring.store.db import session

PLAN_ACTIONS = ("approve", "reject", "cancel", "pause", "resume")
TASK_ACTIONS = ("approve", "reject")


@dataclass
class TaskUsage:
    """Tokens and list-price cost of runs (a task's, retries included; or the plan's), and what the same usage
    would have cost with no routing: every call on its task's agent's own model (cost_strongest_u)."""
    runs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_u: int = 0
    cost_strongest_u: int = 0

    @property
    def saved_u(self) -> int:
        """What routing simple tasks to the plan's simple_model saved against the strongest model everywhere."""
        return self.cost_strongest_u - self.cost_u

    def add(self, run: RunRow, strongest_u: int) -> None:
        self.runs += 1
        self.prompt_tokens += run.prompt_tokens
        self.completion_tokens += run.completion_tokens
        self.cached_tokens += run.cached_tokens
        self.cost_u += run.cost_u
        self.cost_strongest_u += strongest_u


@dataclass
class PlanUsage(TaskUsage):
    tasks: dict[str, TaskUsage] = field(default_factory=dict)  # by task key (a fan-out item's own)


@cache
def _default_price() -> Callable[[str, Usage], int]:
    from mainspring.agents.worker import list_price

    return list_price()  # the built-in sheet, read once; the runtime passes its worker's (MAINSPRING_PRICES_FILE)


class Plans:
    def __init__(self, db: str, project: store.ProjectScope, api_key_id: str | None, tools: set[str],
                 wake: Callable[[], None] = lambda: None, model_exists: Callable[[str], bool] = lambda name: True,
                 price: Callable[[str, Usage], int] | None = None,
                 planner: Callable[[str], ChatModel] | None = None, planner_model: str = "smollm2",
                 attachments: Callable[[dict], dict[str, str]] | None = None):
        # raw attachments -> checked server paths for this scope's project (the runtime's AttachmentPolicy)
        self._attachments = attachments
        self.db, self.project, self.api_key_id, self.tools, self.wake = db, project, api_key_id, tools, wake
        self.model_exists = model_exists
        self.cancel_run: Callable[[str], None] = lambda run_id: None  # the runtime sets its scheduler's
        # model name -> the ChatModel the planner agent writes plans with (the runtime's resolver); planner_model:
        # the one used when a request names none
        self.planner, self.planner_model = planner, planner_model
        # (model, usage) -> list-price micro-USD: the worker's pricing of a run's model calls (agents/worker.py)
        self._price = price

    def _owner_project(self) -> int | None:
        return None if self.project is store.ANY else self.project  # type: ignore[return-value]

    def create(self, spec: PlanSpec) -> PlanRow:
        if spec.simple_model is not None and not self.model_exists(spec.simple_model):
            raise PlanError(f"unknown model {spec.simple_model!r}", param="simple_model")
        if spec.attachments:
            spec = spec.model_copy(update={"attachments": self._resolved(spec.attachments)})
        row = store.create_plan(self.db, spec, project_id=self._owner_project(), api_key_id=self.api_key_id,
                                tools=self.tools)
        self.wake()
        return row

    def _resolved(self, raw: dict) -> dict[str, str]:
        if self._attachments is None:
            raise PlanError("this plan service cannot check attachments", param="attachments")
        try:
            return self._attachments(raw)
        except JournalError as exc:  # AttachmentRefused: a path outside the allowed roots, another project's file
            raise PlanError(str(exc), param="attachments") from None

    def _planner_of(self, name: str) -> ChatModel:
        try:
            if self.planner is None:
                raise LookupError(name)
            return self.planner(name)
        except (KeyError, LookupError, JournalError):  # the API's resolver says "unknown model" as a JournalError
            raise PlanError(f"unknown planner model {name!r}", param="planner_model") from None

    async def create_from_goal(self, goal: str, *, planner_model: str | None = None, max_tasks: int = 8,
                               priority: int = 0, approve_plan: bool = False, name: str | None = None) -> PlanRow:
        """A plan the planner agent writes for `goal` over the project's agents (planner.py), stored once it
        validates. The planner call is not journaled: until the plan is stored nothing is, so a crash during the
        call loses nothing and the caller asks again. plan.created records {"planned_by": {model, attempts}}."""
        model_name = planner_model or self.planner_model
        agents = await asyncio.to_thread(planner.project_agents, self.db, self._owner_project())
        model = await asyncio.to_thread(self._planner_of, model_name)
        drafted = await planner.draft(model, goal, agents, max_tasks=max_tasks)  # the model call is async already
        spec = load_plan({"goal": goal, "name": name, "priority": priority, "approve_plan": approve_plan,
                          "tasks": [t.model_dump(exclude_defaults=True) for t in drafted.spec.tasks]})
        row = await asyncio.to_thread(
            store.create_plan, self.db, spec, project_id=self._owner_project(), api_key_id=self.api_key_id,
            tools=self.tools, origin={"planned_by": {"model": model_name, "attempts": drafted.attempts}})
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

    def run_states(self, plan_id: str) -> dict[str, tuple[str, str | None]]:
        """run id -> (status, pause_reason) of each task's current run."""
        self.get(plan_id)
        with session(self.db, readonly=True) as s:
            return {run_id: (status, reason) for run_id, status, reason in s.execute(
                select(RunRow.id, RunRow.status, RunRow.pause_reason).join(PlanTaskRow, PlanTaskRow.run_id == RunRow.id)
                .where(PlanTaskRow.plan_id == plan_id))}

    def raise_budget(self, plan_id: str, *, token_budget: int | None = None, cost_budget_u: int | None = None,
                     actor: str = "user") -> PlanRow:
        """The plan's budget raised; its runs paused for their budget get their new share and go on."""
        row, _resumed = budget.raise_budget(self.db, plan_id, token_budget=token_budget, cost_budget_u=cost_budget_u,
                                            actor=actor, project_id=self.project)
        self.wake()
        return row

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

    def audit(self, plan_id: str) -> PlanAudit:
        """Every run of the plan with its chain verified, and the plan-level head (plans/plan_audit.py)."""
        self.get(plan_id)  # another project's plan: not found
        return plan_audit(self.db, plan_id)

    # ---- deadlocks (plans/deadlocks.py) and the wait-for graph --------------------------------------------
    def deadlocks(self, plan_id: str | None = None, status: str | None = None,
                  limit: int = 100) -> list[DeadlockRow]:
        if plan_id is not None:
            self.get(plan_id)  # another project's plan: not found
        return deadlocks.listing(self.db, self.project, plan_id=plan_id, status=status, limit=limit)

    def deadlock(self, deadlock_id: str) -> DeadlockRow:
        return deadlocks.get(self.db, deadlock_id, self.project)

    def resolve_deadlock(self, deadlock_id: str, action: str, task: str, actor: str) -> DeadlockRow:
        row = deadlocks.resolve(self.db, deadlock_id, action, task, actor, self.project, self.cancel_run)
        self.wake()
        return row

    def waits(self, plan_id: str | None = None) -> list[PlanWaitRow]:
        """The open waits (the edges of the wait-for graph) of the caller's plans."""
        if plan_id is not None:
            self.get(plan_id)
        with session(self.db, readonly=True) as s:
            q = select(PlanWaitRow, PlanRow).join(PlanRow, PlanRow.id == PlanWaitRow.plan_id).where(
                PlanWaitRow.ended_at.is_(None))
            if plan_id is not None:
                q = q.where(PlanWaitRow.plan_id == plan_id)
            return [w for w, plan in s.execute(q.order_by(PlanWaitRow.id)).all() if in_scope(plan, self.project)]

    def usage(self, plan_id: str) -> PlanUsage:
        """Tokens and list-price cost of every run the plan's tasks had, retries included, per task and in all;
        and the same usage priced with no routing (cost_strongest_u, saved_u)."""
        plan = self.get(plan_id)  # another project's plan: not found
        simple = store.load_spec(plan).simple_model
        with session(self.db, readonly=True) as s:
            task_of = budget.plan_runs(s, plan_id)
            runs = list(s.scalars(select(RunRow).where(RunRow.id.in_(list(task_of))))) if task_of else []
            routed = [r for r in runs if simple is not None and r.model_override == simple]
            strongest = self._strongest(s, routed)
        total = PlanUsage()
        for r in runs:
            cost = strongest.get(r.id, r.cost_u)  # a run on its agent's own model: what it cost
            total.add(r, cost)
            total.tasks.setdefault(task_of[r.id], TaskUsage()).add(r, cost)
        return total

    def _strongest(self, s: Any, routed: list[RunRow]) -> dict[str, int]:
        """Each routed run's model calls priced, call by call as the worker priced them, at its agent's own model;
        a call that model has no price for counts at what it cost (no saving is claimed for it)."""
        if not routed:
            return {}
        price = self._price or _default_price()
        agent_ids = {r.agent_id for r in routed}
        model_of = {agent_id: AgentSpec.model_validate_json(body).model for agent_id, body in s.execute(
            select(AgentRow.id, AgentRow.spec_json).where(AgentRow.id.in_(agent_ids)))}
        run_model = {r.id: model_of.get(r.agent_id) for r in routed}
        out = dict.fromkeys(run_model, 0)
        for step in s.scalars(select(StepRow).where(StepRow.run_id.in_(list(run_model)), StepRow.kind == "model",
                                                    StepRow.status == StepStatus.COMPLETED)):
            model = run_model[step.run_id]
            usage = Usage(prompt_tokens=step.prompt_tokens, cached_tokens=step.cached_tokens,
                          completion_tokens=step.completion_tokens)
            out[step.run_id] += (price(model, usage) if model else 0) or step.cost_u
        return out
