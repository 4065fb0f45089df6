"""AgentRuntime: the one object the HTTP API and the CLI use — agents, runs, interrupts, events, audit —
plus the worker that drives runs in this process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from sqlalchemy import func, select

from mainspring.agents import audit, control, journal
from mainspring.agents.journal import JournalError
from mainspring.agents.spec import AgentSpec
from mainspring.agents.tables import (AgentRow, ArtifactRow, EventRow, InterruptRow, RunRow, StepRow,
                                      ThreadRow, ToolCallRow)
from mainspring.agents.tools.base import Tool
from mainspring.agents.worker import Worker, list_price
from mainspring.config import Settings
from mainspring.store.db import init_db, session


def app_models(app) -> Callable[[str], Any]:
    """Model names an agent may use in this server: the embedded engine's (or "default"), and the upstreams."""
    from mainspring.models import LocalModel, OpenAICompatibleModel

    cache: dict[str, Any] = {}

    def resolve(name: str):
        if name in cache:
            return cache[name]
        engine = app.state.engine
        route = app.state.upstreams.get(name)
        if route is not None:
            model = OpenAICompatibleModel(route.upstream.url("/v1"), route.upstream.api_key or None,
                                          model=route.model.remote, timeout=route.upstream.timeout_s)
        elif engine is not None and name in ("default", "smollm2", engine.engine.name):
            model = LocalModel(engine)
        else:
            raise JournalError(f"unknown model {name!r} for an agent", status=400)
        cache[name] = model
        return model

    return resolve


def default_tools(settings: Settings) -> dict[str, Tool]:
    from mainspring.agents.tools.registry import builtin_registry

    registry = builtin_registry(settings, enable_http=settings.agent_http_fetch)
    return {name: registry.get(name) for name in registry.names()}


class AgentRuntime:
    def __init__(self, settings: Settings, *, models: Callable[[str], Any], tools: Mapping[str, Tool] | None = None,
                 sandbox: Any = None, db_url: str | None = None):
        self.settings = settings
        self.db = db_url or settings.resolved_database_url()
        init_db(self.db)
        self.tools = dict(tools if tools is not None else default_tools(settings))
        if sandbox is None:  # cheap until a job runs: the host is checked on first use
            from mainspring.sandbox import get_sandbox

            sandbox = get_sandbox()
        self.worker = Worker(self.db, models=models, tools=self.tools, data_dir=settings.data_dir,
                             capacity=settings.agent_max_runs, lease_s=settings.agent_lease_s, sandbox=sandbox,
                             price=list_price(settings.prices_file))

    async def start(self) -> None:
        await self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    # ---- agents and runs --------------------------------------------------------------------------------
    def put_agent(self, spec: AgentSpec) -> AgentRow:
        unknown = sorted(set(spec.tools) - set(self.tools))
        if unknown:
            raise JournalError(f"unknown tools {unknown}; available: {sorted(self.tools)}", status=400)
        try:
            self.worker.env.models(spec.model)  # an unknown model is refused now, not when a run fails later
        except (KeyError, LookupError) as exc:
            raise JournalError(f"unknown model {spec.model!r}", status=400) from exc
        return journal.put_agent(self.db, spec)

    def agent(self, name_or_id: str) -> AgentRow:
        with session(self.db, readonly=True) as s:
            row = s.get(AgentRow, name_or_id) or s.scalars(
                select(AgentRow).where(AgentRow.name == name_or_id).order_by(AgentRow.version.desc())).first()
            if row is None:
                raise JournalError(f"no agent {name_or_id!r}", status=404)
            return row

    def agents(self) -> list[AgentRow]:
        with session(self.db, readonly=True) as s:
            return list(s.scalars(select(AgentRow).order_by(AgentRow.name, AgentRow.version)))

    def start_run(self, agent: str, goal: str, **options: Any) -> RunRow:
        run = journal.create_run(self.db, self.agent(agent).id, goal, **options)
        self.worker.notify()
        return run

    def run(self, run_id: str) -> RunRow:
        with session(self.db, readonly=True) as s:
            return journal.get_run(s, run_id)

    def runs(self, status: str | None = None, limit: int = 50) -> list[RunRow]:
        with session(self.db, readonly=True) as s:
            q = select(RunRow).order_by(RunRow.created_at.desc()).limit(limit)
            if status:
                q = q.where(RunRow.status == status)
            return list(s.scalars(q))

    def steps(self, run_id: str) -> list[dict]:
        """The run's journal, readable: each step with its tool calls and their results."""
        with session(self.db, readonly=True) as s:
            journal.get_run(s, run_id)
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
            journal.get_run(s, run_id)
            return list(s.scalars(select(EventRow).where(EventRow.run_id == run_id, EventRow.id > after)
                                  .order_by(EventRow.id).limit(limit)))

    # ---- people acting on runs --------------------------------------------------------------------------
    def interrupts(self, run_id: str | None = None, status: str | None = "pending") -> list[InterruptRow]:
        with session(self.db, readonly=True) as s:
            q = select(InterruptRow).order_by(InterruptRow.created_at)
            if run_id:
                q = q.where(InterruptRow.run_id == run_id)
            if status:
                q = q.where(InterruptRow.status == status)
            return list(s.scalars(q))

    def resolve(self, interrupt_id: str, decision: str, *, actor: str = "user", arguments: dict | None = None,
                comment: str | None = None) -> InterruptRow:
        row = control.resolve(self.db, interrupt_id, decision, actor=actor, arguments=arguments, comment=comment)
        self.worker.notify()
        return row

    def act(self, run_id: str, action: str, actor: str = "user") -> RunRow:
        """cancel (cuts the step in flight, sandboxed jobs included) | interrupt (pause now, cutting the step
        in flight) | pause (after the step in flight) | resume."""
        control.request(self.db, run_id, "pause" if action == "interrupt" else action, actor)
        if action in ("cancel", "pause", "interrupt"):
            self.worker.interrupt(run_id, "cancel" if action == "cancel" else "pause", cut=action != "pause")
        self.worker.notify()
        return self.run(run_id)

    def create_thread(self, metadata: dict | None = None) -> ThreadRow:
        with session(self.db) as s:
            row = ThreadRow(id=journal.new_id("thread"), metadata_json=json.dumps(metadata) if metadata else None)
            s.add(row)
            return row

    def raise_budget(self, run_id: str, *, token_budget: int | None = None, cost_budget_u: int | None = None,
                     actor: str = "user") -> RunRow:
        control.raise_budget(self.db, run_id, token_budget=token_budget, cost_budget_u=cost_budget_u, actor=actor)
        self.worker.notify()
        return self.run(run_id)

    # ---- artifacts and audit ----------------------------------------------------------------------------
    def artifacts(self, run_id: str) -> list[ArtifactRow]:
        with session(self.db, readonly=True) as s:
            journal.get_run(s, run_id)
            return list(s.scalars(select(ArtifactRow).where(ArtifactRow.run_id == run_id)))

    def artifact_path(self, artifact_id: str) -> tuple[ArtifactRow, Path]:
        with session(self.db, readonly=True) as s:
            row = s.get(ArtifactRow, artifact_id)
            if row is None:
                raise JournalError(f"no artifact {artifact_id!r}", status=404)
            return row, self.settings.data_dir / row.path

    def verify_audit(self, run_id: str) -> audit.Verdict:
        with session(self.db, readonly=True) as s:
            journal.get_run(s, run_id)
            return audit.verify(s, run_id)

    def export_audit(self, run_id: str) -> Iterator[str]:
        with session(self.db, readonly=True) as s:
            journal.get_run(s, run_id)
            yield from list(audit.export_jsonl(s, run_id))

    def counts(self) -> dict[str, int]:
        with session(self.db, readonly=True) as s:
            return dict(s.execute(select(RunRow.status, func.count()).group_by(RunRow.status)).all())
