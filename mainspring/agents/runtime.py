"""AgentRuntime: the one object the HTTP API and the CLI use — agents, runs, interrupts, events, audit —
plus the worker that drives runs in this process.

Tenancy: every agent, thread and run belongs to a project (None: anonymous, the single local user with auth
off). `runtime.scoped(project_id, api_key_id)` is the view a caller gets: each of its reads, lists and actions
sees only that project's rows, and another project's id is "not found" (404), never "forbidden", so a caller
cannot even learn that it exists. The unscoped runtime is the operator's (the worker, the CLI's local tools).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from sqlalchemy import func, select, true
from sqlalchemy.orm import Session

from mainspring.agents import audit, control, journal
from mainspring.agents.attachments import AttachmentPolicy
from mainspring.agents.event_bus import EventBus
from mainspring.agents.journal import JournalError, project_is
from mainspring.agents.loop import ModelResolver
from mainspring.agents.plans import store as plan_store
from mainspring.agents.delegate import ask_agent_tool
from mainspring.agents.plans.admission import Admission
from mainspring.agents.plans.plan_tools import coordination_tools
from mainspring.agents.plans.schedule_service import Schedules
from mainspring.agents.plans.scheduler import PlanScheduler
from mainspring.agents.plans.service import Plans
from mainspring.agents.spec import AgentSpec
from mainspring.agents.status import InterruptStatus
from mainspring.agents.tables import (AgentRow, ArtifactRow, EventRow, InterruptRow, RunRow, StepRow,
                                      ThreadRow, ToolCallRow)
from mainspring.agents.tools.base import Tool
from mainspring.agents.worker import Worker, list_price
from mainspring.config import Settings
from mainspring.models import ChatModel
from mainspring.store.db import init_db, session
from mainspring.store.ids import new_id


def default_tools(settings: Settings) -> dict[str, Tool]:
    from mainspring.agents.tools.registry import builtin_registry

    registry = builtin_registry(settings, enable_http=settings.agent_http_fetch)
    return {name: registry.get(name) for name in registry.names()}


@dataclass(frozen=True)
class Scope:
    project_id: int | None = None
    api_key_id: str | None = None
    operator: bool = False  # sees every project: the worker and local tools, never an HTTP caller


OPERATOR = Scope(operator=True)


class AgentRuntime:
    scope: Scope = OPERATOR

    def __init__(self, settings: Settings, *, models: ModelResolver,
                 tools: Mapping[str, Tool] | None = None,
                 sandbox: Any = None, db_url: str | None = None):
        self.settings = settings
        self.db = db_url or settings.resolved_database_url()
        init_db(self.db)
        self.tools = dict(tools if tools is not None else default_tools(settings))
        # what plan tasks' agents coordinate with (messages, handoffs); a tool of the same name given here wins
        for coordination in coordination_tools(self.db, wake=lambda: self.scheduler.wake()):
            self.tools.setdefault(coordination.name, coordination)
        self.tools.setdefault("ask_agent", ask_agent_tool(self.db, notify=lambda: self.worker.notify()))
        if sandbox is None:  # cheap until a job runs: the host is checked on first use
            from mainspring.sandbox import get_sandbox

            sandbox = get_sandbox()
        self.worker = Worker(self.db, models=models, tools=self.tools, data_dir=settings.data_dir,
                             capacity=settings.agent_max_runs, lease_s=settings.agent_lease_s, sandbox=sandbox,
                             price=list_price(settings.prices_file))
        # the plan scheduler of this process: acts while it holds the deployment's lease (agents/plans/leader.py)
        self.scheduler = PlanScheduler(self.db, self.worker.owner, max_running=settings.plan_max_running,
                                       lease_s=min(settings.agent_lease_s, 10.0), notify=self.worker.notify,
                                       interrupt=lambda run_id, order: self.worker.interrupt(
                                           run_id, order, cut=order == "cancel"),
                                       # a failed on_failure "replan" task is revised by the planner's model
                                       replanner=self._planner_model, replan_model=settings.model,
                                       # sandbox slots, the engine's measured tokens/s (the server's resolver
                                       # measures its engine; a plain one has none) and project budgets
                                       admission=Admission(sandbox_slots=settings.sandbox_slots,
                                                           min_tokens_per_s=settings.plan_min_run_tokens_per_s,
                                                           engine_rate=getattr(models, "engine_rate", None),
                                                           engine_key=getattr(models, "engine_key", None)))
        self.worker.on_run_done = self.scheduler.wake  # a task's run ended: its dependents may be ready now
        self.event_bus = EventBus(self.db)  # wakes the SSE followers of runs (api/routes/runs.py)
        self.attachments = AttachmentPolicy.from_settings(settings)
        self.worker.env.attachments = self.attachments

    def scoped(self, project_id: int | None, api_key_id: str | None = None) -> AgentRuntime:
        """This runtime as project `project_id` sees it (sharing the worker and database)."""
        view = copy.copy(self)
        view.scope = Scope(project_id, api_key_id)
        return view

    # ---- what the scope sees ----------------------------------------------------------------------------
    def _mine(self, column) -> Any:
        return true() if self.scope.operator else project_is(column, self.scope.project_id)

    def _run(self, s: Session, run_id: str) -> RunRow:
        run = journal.get_run(s, run_id)
        if not self.scope.operator and run.project_id != self.scope.project_id:
            raise JournalError(f"no run {run_id!r}", status=404)  # the same answer as for an id never used
        return run

    async def start(self) -> None:
        await self.worker.start()
        await self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()
        await self.worker.stop()

    @property
    def plans(self) -> Plans:
        """Plans (task graphs of agent runs) as this scope sees them."""
        plans = Plans(self.db, plan_store.ANY if self.scope.operator else self.scope.project_id, self.scope.api_key_id,
                      set(self.tools), wake=self.scheduler_wake, model_exists=self._model_exists,
                      price=self.worker.env.price, planner=self._planner_model, planner_model=self.settings.model,
                      attachments=lambda raw: self.attachments.resolve(self.db, self.scope.project_id, raw))
        plans.cancel_run = self.scheduler.cancel_run  # a deadlock's victim, failed by a person
        return plans

    def _planner_model(self, name: str) -> ChatModel:
        """The planner agent's model: resolved as a run's is, for this scope's project (a default of
        Settings.model, which the server's resolver serves on its engine)."""
        return self.worker.env.models(name, self.scope.project_id)

    @property
    def schedules(self) -> Schedules:
        """Cron schedules and webhook triggers of plans and agent runs, as this scope sees them."""
        return Schedules(self.db, plan_store.ANY if self.scope.operator else self.scope.project_id,
                         self.scope.api_key_id, set(self.tools), wake=self.scheduler_wake, notify=self.worker.notify,
                         model_exists=self._model_exists)

    def _model_exists(self, name: str) -> bool:
        try:
            self.worker.env.models(name, self.scope.project_id)
        except (KeyError, LookupError, JournalError):  # the API's resolver says "unknown model" as a JournalError
            return False
        return True

    def scheduler_wake(self) -> None:
        self.worker.soon(self.scheduler.wake)  # the scheduler's event belongs to the worker's event loop

    def _of_run(self, s: Session, table: type, row_id: str, what: str) -> Any:
        """Row `row_id` of a table hanging off runs (interrupts, artifacts), when its run is the scope's."""
        row = s.get(table, row_id)
        if row is None or not (self.scope.operator or s.get(RunRow, row.run_id).project_id == self.scope.project_id):
            raise JournalError(f"no {what} {row_id!r}", status=404)
        return row

    # ---- agents and runs --------------------------------------------------------------------------------
    def put_agent(self, spec: AgentSpec) -> AgentRow:
        unknown = sorted(set(spec.tools) - set(self.tools))
        if unknown:
            raise JournalError(f"unknown tools {unknown}; available: {sorted(self.tools)}", status=400)
        try:
            # an unknown model is refused now, not when a run fails later
            self.worker.env.models(spec.model, self.scope.project_id)
        except (KeyError, LookupError) as exc:
            raise JournalError(f"unknown model {spec.model!r}", status=400) from exc
        return journal.put_agent(self.db, spec, self.scope.project_id)

    def agent(self, name_or_id: str) -> AgentRow:
        with session(self.db, readonly=True) as s:
            mine = self._mine(AgentRow.project_id)
            row = s.scalar(select(AgentRow).where(AgentRow.id == name_or_id, mine)) or s.scalars(
                select(AgentRow).where(AgentRow.name == name_or_id, mine).order_by(AgentRow.version.desc())).first()
            if row is None:
                raise JournalError(f"no agent {name_or_id!r}", status=404)
            return row

    def agents(self) -> list[AgentRow]:
        with session(self.db, readonly=True) as s:
            return list(s.scalars(select(AgentRow).where(self._mine(AgentRow.project_id))
                                  .order_by(AgentRow.name, AgentRow.version)))

    def start_run(self, agent: str, goal: str, *, attachments: dict | None = None, **options: Any) -> RunRow:
        """A queued run; `attachments` ({"docs": folder | [file ids], "db": path | file id}) are checked and
        resolved to server paths first (agents/attachments.py)."""
        agent_id = self.agent(agent).id
        resolved = self.attachments.resolve(self.db, self.scope.project_id, attachments or {})
        run = journal.create_run(self.db, agent_id, goal, attachments=resolved, project_id=self.scope.project_id,
                                 api_key_id=self.scope.api_key_id, **options)
        self.worker.notify()
        return run

    def run(self, run_id: str) -> RunRow:
        with session(self.db, readonly=True) as s:
            return self._run(s, run_id)

    def runs(self, status: str | None = None, limit: int = 50) -> list[RunRow]:
        with session(self.db, readonly=True) as s:
            q = select(RunRow).where(self._mine(RunRow.project_id)).order_by(RunRow.created_at.desc()).limit(limit)
            if status:
                q = q.where(RunRow.status == status)
            return list(s.scalars(q))

    def steps(self, run_id: str) -> list[dict]:
        """The run's journal, readable: each step with its tool calls and their results."""
        with session(self.db, readonly=True) as s:
            self._run(s, run_id)
            calls: dict[str, list[ToolCallRow]] = {}
            for c in s.scalars(select(ToolCallRow).where(ToolCallRow.run_id == run_id).order_by(ToolCallRow.ordinal)):
                calls.setdefault(c.step_id, []).append(c)
            out = []
            for st in s.scalars(select(StepRow).where(StepRow.run_id == run_id).order_by(StepRow.seq)):
                out.append({
                    "id": st.id, "seq": st.seq, "kind": st.kind, "status": st.status, "attempts": st.attempts,
                    "output": json.loads(st.output_json) if st.output_json else None,
                    "usage": {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.completion_tokens,
                              "cached_tokens": st.cached_tokens}, "cost_u": st.cost_u,
                    "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments_json, "status": c.status,
                                    "attempts": c.attempts, "idempotency_key": c.idempotency_key,
                                    "result": json.loads(c.result_json) if c.result_json else None}
                                   for c in calls.get(st.id, [])]})
            return out

    def events(self, run_id: str, after: int = 0, limit: int = 500) -> list[EventRow]:
        with session(self.db, readonly=True) as s:
            self._run(s, run_id)
            return list(s.scalars(select(EventRow).where(EventRow.run_id == run_id, EventRow.id > after)
                                  .order_by(EventRow.id).limit(limit)))

    # ---- people acting on runs --------------------------------------------------------------------------
    def interrupts(self, run_id: str | None = None,
                   status: str | None = InterruptStatus.PENDING) -> list[InterruptRow]:
        with session(self.db, readonly=True) as s:
            q = (select(InterruptRow).join(RunRow, RunRow.id == InterruptRow.run_id)
                 .where(self._mine(RunRow.project_id)).order_by(InterruptRow.created_at))
            if run_id:
                q = q.where(InterruptRow.run_id == run_id)
            if status:
                q = q.where(InterruptRow.status == status)
            return list(s.scalars(q))

    def resolve(self, interrupt_id: str, decision: str, *, actor: str = "user", arguments: dict | None = None,
                comment: str | None = None) -> InterruptRow:
        with session(self.db, readonly=True) as s:
            self._of_run(s, InterruptRow, interrupt_id, "interrupt")
        row = control.resolve(self.db, interrupt_id, decision, actor=actor, arguments=arguments, comment=comment)
        self.worker.notify()
        return row

    def act(self, run_id: str, action: str, actor: str = "user") -> RunRow:
        """cancel (cuts the step in flight, sandboxed jobs included) | interrupt (pause now, cutting the step
        in flight) | pause (after the step in flight) | resume."""
        self.run(run_id)  # another project's run: 404 before anything changes
        control.request(self.db, run_id, "pause" if action == "interrupt" else action, actor)
        if action in ("cancel", "pause", "interrupt"):
            self.worker.interrupt(run_id, "cancel" if action == "cancel" else "pause", cut=action != "pause")
        self.worker.notify()
        return self.run(run_id)

    def create_thread(self, metadata: dict | None = None) -> ThreadRow:
        with session(self.db) as s:
            row = ThreadRow(id=new_id("thread_"), project_id=self.scope.project_id,
                            metadata_json=json.dumps(metadata) if metadata else None)
            s.add(row)
            return row

    def raise_budget(self, run_id: str, *, token_budget: int | None = None, cost_budget_u: int | None = None,
                     actor: str = "user") -> RunRow:
        self.run(run_id)
        control.raise_budget(self.db, run_id, token_budget=token_budget, cost_budget_u=cost_budget_u, actor=actor)
        self.worker.notify()
        return self.run(run_id)

    # ---- artifacts and audit ----------------------------------------------------------------------------
    def artifacts(self, run_id: str) -> list[ArtifactRow]:
        with session(self.db, readonly=True) as s:
            self._run(s, run_id)
            return list(s.scalars(select(ArtifactRow).where(ArtifactRow.run_id == run_id)))

    def artifact_path(self, artifact_id: str) -> tuple[ArtifactRow, Path]:
        with session(self.db, readonly=True) as s:
            row = self._of_run(s, ArtifactRow, artifact_id, "artifact")
            return row, self.settings.data_dir / row.path

    def verify_audit(self, run_id: str) -> audit.Verdict:
        with session(self.db, readonly=True) as s:
            self._run(s, run_id)
            return audit.verify(s, run_id)

    def export_audit(self, run_id: str) -> Iterator[str]:
        with session(self.db, readonly=True) as s:
            self._run(s, run_id)
            yield from list(audit.export_jsonl(s, run_id))

    def counts(self) -> dict[str, int]:
        with session(self.db, readonly=True) as s:
            return dict(s.execute(select(RunRow.status, func.count()).group_by(RunRow.status)).all())
