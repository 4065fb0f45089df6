"""Admission: may this ready task start now? The scheduler's `max_running` counts tasks in flight; this adds the
other capacities a task's run holds while in flight, checked per task in the scheduler's dispatch order:

- project budget: a task of a plan charged to an API key (the run's model calls reserve against the key's project
  budgets: agents/charges.py) waits while a budget of that project has nothing left (billing/budgets.py: spent
  plus the holds of calls in flight at or past its hard limit): started, its run would pause at its first call
  and hold a slot until someone resumes it.
- sandbox slots: a task whose agent has a sandboxed tool (tools/code.py SANDBOX_TOOLS) may hold a sandbox slot at
  any step; such tasks in flight stay within Settings.sandbox_slots.
- engine throughput: a task whose run calls a model served by a local engine starts only while each run on it
  would still get Settings.plan_min_run_tokens_per_s: in flight on it + 1 <= max(1, measured tokens/s / floor).
  The measured rate comes from the runtime (model name -> tokens/s, None: unknown or not a local engine, no limit).

A blocked task stays ready (the next tick asks again) and the tasks after it may still start: nothing blocks the
line. Its plan gets one `task.admission_blocked` event (reason, attempt) per change of reason, not one per tick:
the plan's last such event for the task, unless a dispatch or a resume came after it, is what was said already.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from mainspring.agents.journal import project_is
from mainspring.agents.plans import store
from mainspring.agents.plans.tables import PlanEventRow, PlanRow, PlanTaskRow, TaskStatus
from mainspring.agents.plans.task_run import route
from mainspring.agents.plans.transitions import ANY, open_plan
from mainspring.agents.tables import AgentRow, RunRow
from mainspring.agents.tools.code import SANDBOX_TOOLS
from mainspring.store.db import session

BUDGET = "project budget exhausted"
SANDBOX = "sandbox slots full"
ENGINE = "engine throughput"
EVENT = "task.admission_blocked"
RESETS = ("task.dispatched", "task.resumed")  # after one of these, the task's next block is news again
MAX_LOOK = 1024  # ready tasks looked at in one pass: past that many blocked ones, the rest wait for the next tick
MEMO = 4096  # tasks remembered with their last reason (the events are the truth: the memo only saves reads)

IN_FLIGHT = (TaskStatus.DISPATCHED, TaskStatus.RUNNING)  # the scheduler's: a preempted task gave its slot up


@dataclass(frozen=True)
class Demand:
    """What one task's run holds while in flight."""
    project_id: int | None
    model: str  # the model its run calls ("" when its agent is missing: creating its run fails it)
    sandbox: bool
    charged: bool = False  # its plan's runs are charged to an API key, so its project's budgets apply


def model_cap(rate: float | None, floor: float) -> int | None:
    """How many runs an engine measured at `rate` tokens/s may serve at once with each getting `floor` tokens/s;
    None: no limit (the rate is unknown, or there is no floor). At least one: a slow engine still serves."""
    if rate is None or floor <= 0:
        return None
    return max(1, math.floor(max(rate, 0.0) / floor))


@dataclass
class Pass:
    """One dispatch pass: the load in flight when it began, grown by each task it admits."""
    slots: int | None  # sandbox slots; None: not limited
    floor: float  # tokens/s per run; 0: not limited
    rate: Callable[[str], float | None]  # model name -> measured tokens/s
    key: Callable[[str], str]  # model name -> the engine it runs on (aliases counted together)
    exhausted: Callable[[int | None], bool]  # project id -> a budget of it has nothing left
    sandboxes: int = 0
    on_engine: Counter = field(default_factory=Counter)
    taken: int = 0

    def load(self, running: Iterable[Demand]) -> Pass:
        for d in running:
            self._count(d)
        return self

    def reason(self, d: Demand) -> str | None:
        """Why `d` may not start now, or None: it may."""
        if d.charged and d.project_id is not None and self.exhausted(d.project_id):
            return BUDGET
        if d.sandbox and self.slots is not None and self.sandboxes + 1 > self.slots:
            return SANDBOX
        if d.model and self.floor > 0:
            cap = model_cap(self.rate(d.model), self.floor)
            if cap is not None and self.on_engine[self.key(d.model)] + 1 > cap:
                return ENGINE
        return None

    def take(self, d: Demand) -> None:
        """`d` started: it holds its share from now on."""
        self._count(d)
        self.taken += 1

    def _count(self, d: Demand) -> None:
        self.sandboxes += d.sandbox
        if d.model:
            self.on_engine[self.key(d.model)] += 1


def candidates(free: int, next_tasks: Callable[[int], list[PlanTaskRow]], taken: Callable[[], int],
               limit: int = MAX_LOOK) -> Iterator[PlanTaskRow]:
    """The scheduler's waiting tasks in its order, each once, until `free` were taken: a window of `free` first,
    doubled while blocked tasks fill it (a task dispatched meanwhile leaves the next window, hence the ids)."""
    seen: set[str] = set()
    want = free
    while True:
        batch = next_tasks(want)
        for task in batch:
            if taken() >= free:
                return
            if task.id not in seen:
                seen.add(task.id)
                yield task
        if len(batch) < want or want >= limit or taken() >= free:
            return
        want = min(limit, want * 2)


# ---- what a task holds, from the database ------------------------------------------------------------------------
def _agent_demand(spec_json: str | None, model: str | None, project_id: int | None, charged: bool) -> Demand:
    if spec_json is None:
        return Demand(project_id, "", False, charged)
    body = json.loads(spec_json)
    tools = set(body.get("tools") or [])
    return Demand(project_id, model or body.get("model") or "", bool(tools & SANDBOX_TOOLS), charged)


def _demand(s: Session, task: PlanTaskRow, plan: PlanRow, run: RunRow | None, agents: dict[tuple, str | None]
            ) -> Demand:
    """From the task's run when it has one (the agent version and model it pinned), else as the scheduler would
    create its run (task_run.route: the plan's simple model or the agent's)."""
    charged = plan.api_key_id is not None
    if run is not None:
        body = s.scalar(select(AgentRow.spec_json).where(AgentRow.id == run.agent_id))
        return _agent_demand(body, run.model_override, plan.project_id, charged)
    plan_spec = store.load_spec(plan)
    spec = next((t for t in plan_spec.tasks if t.id == task.spec_key), None)
    if spec is None:
        return Demand(plan.project_id, "", False, charged)
    name = task.agent_override or spec.agent
    if (plan.project_id, name) not in agents:
        agents[(plan.project_id, name)] = s.scalars(
            select(AgentRow.spec_json).where(AgentRow.name == name, project_is(AgentRow.project_id, plan.project_id))
            .order_by(AgentRow.version.desc())).first()
    return _agent_demand(agents[(plan.project_id, name)], route(plan_spec, spec, task.attempt), plan.project_id,
                         charged)


def _exhausted(db: str) -> Callable[[int | None], bool]:
    from mainspring.billing import budgets

    known: dict[int | None, bool] = {}

    def exhausted(project_id: int | None) -> bool:
        if project_id not in known:
            with session(db, readonly=True) as s:
                known[project_id] = any(b.remaining_u <= 0 for b in budgets.status(s, "project", project_id))
        return known[project_id]
    return exhausted


class Admission:
    """The scheduler's admission rules and limits (the runtime passes Settings' numbers and the engine's rate)."""

    def __init__(self, *, sandbox_slots: int | None = None, min_tokens_per_s: float = 0.0,
                 engine_rate: Callable[[str], float | None] | None = None,
                 engine_key: Callable[[str], str] | None = None) -> None:
        self.sandbox_slots, self.min_tokens_per_s = sandbox_slots, min_tokens_per_s
        self.engine_rate = engine_rate or (lambda name: None)
        self.engine_key = engine_key or (lambda name: name)
        self._noted: dict[str, tuple[Any, str]] = {}  # task id -> (its updated_at, the reason last said)
        self._agents: dict[tuple, str | None] = {}

    def begin(self, db: str) -> Pass:
        """A pass over the load in flight now."""
        self._agents = {}  # per pass: a new agent version is seen at the next tick
        with session(db, readonly=True) as s:
            rows = s.execute(select(PlanTaskRow, PlanRow, RunRow).join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                             .outerjoin(RunRow, RunRow.id == PlanTaskRow.run_id)
                             .where(PlanTaskRow.status.in_(IN_FLIGHT))).all()
            running = [_demand(s, task, plan, run, self._agents) for task, plan, run in rows]
        return Pass(self.sandbox_slots, self.min_tokens_per_s, self.engine_rate, self.engine_key,
                    _exhausted(db)).load(running)

    def demand(self, db: str, task: PlanTaskRow) -> Demand:
        with session(db, readonly=True) as s:
            plan = s.get(PlanRow, task.plan_id)
            if plan is None:
                return Demand(task.project_id, "", False)
            run = s.get(RunRow, task.run_id) if task.status == TaskStatus.PREEMPTED and task.run_id else None
            return _demand(s, task, plan, run, self._agents)

    def note_blocked(self, db: str, task: PlanTaskRow, reason: str) -> bool:
        """Append `task.admission_blocked` unless the plan already says this task waits for this reason; whether
        it appended one."""
        said = (task.updated_at, reason)  # any transition of the task since (a dispatch, a retry) makes it news
        if self._noted.get(task.id) == said:
            return False
        if len(self._noted) >= MEMO:
            self._noted.clear()
        with session(db, readonly=True) as s:
            fresh = last_reason(s, task) != reason
        if fresh:
            with session(db) as s:
                tx = open_plan(s, task.plan_id, ANY)  # locks the plan: its event numbering
                fresh = last_reason(s, task) != reason
                if fresh:
                    tx.event(EVENT, task.key, reason=reason, attempt=task.attempt)
        self._noted[task.id] = said
        return fresh


def last_reason(s: Session, task: PlanTaskRow) -> Any:
    """The reason of the task's last admission_blocked event, None when a dispatch or resume came after it (a queue
    timeout names it too: queue_wait.py)."""
    last = s.execute(select(PlanEventRow.type, PlanEventRow.data_json)
                     .where(PlanEventRow.plan_id == task.plan_id, PlanEventRow.task_key == task.key,
                            PlanEventRow.type.in_([EVENT, *RESETS]))
                     .order_by(PlanEventRow.seq.desc()).limit(1)).first()
    return json.loads(last[1]).get("reason") if last is not None and last[0] == EVENT else None
