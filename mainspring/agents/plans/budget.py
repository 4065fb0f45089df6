"""A plan's token and cost budget, split across its tasks' runs; a task whose run paused for its budget; raising
the plan's budget.

The split: when the scheduler creates a task's run, the run's budget is what the plan has left divided evenly
over the tasks still to be given a run (this one included; each fan-out item is a task). What the plan has
left is its budget less what its runs used (retries included) and less what its live runs may still use: a
live run holds its whole budget, so two runs created one after the other get the same share and the plan
cannot be overspent by runs in flight together. A run that used less than its share leaves the rest to the
tasks after it. The agent's own limit, when smaller, wins; a plan without a budget leaves its runs their
agent's limits.

A run that would go over its share pauses (the loop's budget check, pause_reason "budget") and its task stays
in flight: nothing more is spent on it, and `task.over_budget` is appended once per pause (per run and budget).
Raising the plan's budget gives each budget-paused run an even share of the new remainder on top of what it
used, through the runs' own budget-raise path (control.raise_budget), which queues it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from mainspring.agents import control
from mainspring.agents.plans.spec import PlanError
from mainspring.agents.plans.tables import PLAN_TERMINAL, TASK_TERMINAL, PlanEventRow, PlanRow, PlanTaskRow, TaskStatus
from mainspring.agents.plans.transitions import ANY, IN_FLIGHT, ProjectScope, graph, open_plan
from mainspring.agents.spec import AgentSpec
from mainspring.agents.status import TERMINAL, RunStatus
from mainspring.agents.tables import AgentRow, RunRow
from mainspring.store.db import session

OVER_BUDGET = "budget"  # the pause_reason the loop parks a run with
RUN_EVENTS = ("task.dispatched", "task.handed_off")  # the plan events that give a task a run (data: run_id)


@dataclass(frozen=True)
class RunSpend:
    """One run of the plan, as far as its budget goes."""
    run_id: str
    task_key: str
    live: bool  # not finished: it may still spend up to its budget
    tokens: int  # prompt + completion, as the loop counts against token_budget
    cost_u: int
    token_budget: int | None
    cost_budget_u: int | None

    def held(self) -> tuple[int, int]:
        """(tokens, micro-USD) this run takes out of the plan's budget: what it used, or while it is live, its
        whole budget (or more, if it went over it)."""
        if not self.live:
            return self.tokens, self.cost_u
        return max(self.tokens, self.token_budget or 0), max(self.cost_u, self.cost_budget_u or 0)


@dataclass(frozen=True)
class Ledger:
    token_budget: int | None
    cost_budget_u: int | None
    runs: list[RunSpend]
    waiting: int  # tasks not finished that have no live run (a fan-out task stands for its items once it has them)
    paused: list[RunSpend]  # live runs of in-flight tasks paused for their budget


# ---- pure ----------------------------------------------------------------------------------------------------
def share(budget: int | None, held: int, tasks: int) -> int | None:
    """An even share of what is left of `budget` once `held` is taken out, over `tasks` (None: no budget)."""
    if budget is None:
        return None
    return max(0, budget - held) // max(1, tasks)


def smaller(a: int | None, b: int | None) -> int | None:
    """The tighter of two limits, None being no limit."""
    return b if a is None else a if b is None else min(a, b)


def held(runs: list[RunSpend], *, used_only: frozenset[str] = frozenset()) -> tuple[int, int]:
    """What the runs take out of the plan's budget; those in `used_only` count what they used (they get a new
    budget)."""
    tokens = cost = 0
    for r in runs:
        t, c = (r.tokens, r.cost_u) if r.run_id in used_only else r.held()
        tokens, cost = tokens + t, cost + c
    return tokens, cost


def agent_limits(spec: AgentSpec) -> tuple[int | None, int | None]:
    from mainspring.billing.prices import usd_to_micro

    limits = spec.limits
    return limits.token_budget, usd_to_micro(limits.cost_budget_usd) if limits.cost_budget_usd else None


# ---- the one read ----------------------------------------------------------------------------------------------
def plan_runs(s: Session, plan_id: str) -> dict[str, str]:
    """run id -> task key of every run the plan's tasks had: each run id is in the event that gave the task its
    run (a dispatch, retries included; a handoff), and a task's current run in its row."""
    found: dict[str, str] = {}
    for key, body in s.execute(select(PlanEventRow.task_key, PlanEventRow.data_json).where(
            PlanEventRow.plan_id == plan_id, PlanEventRow.type.in_(RUN_EVENTS))):
        run_id = json.loads(body).get("run_id")
        if run_id and key:
            found[run_id] = key
    for key, run_id in s.execute(select(PlanTaskRow.key, PlanTaskRow.run_id).where(
            PlanTaskRow.plan_id == plan_id, PlanTaskRow.run_id.is_not(None))):
        if run_id is not None:
            found.setdefault(run_id, key)
    return found


def ledger(s: Session, plan: PlanRow) -> Ledger:
    """Every run the plan's tasks had, retries included, and the tasks still waiting for a run."""
    spec = graph(plan)[0]
    fan_out = {t.id for t in spec.tasks if t.map_over is not None}
    task_of = plan_runs(s, plan.id)
    rows = list(s.scalars(select(RunRow).where(RunRow.id.in_(list(task_of))))) if task_of else []
    runs = [RunSpend(r.id, task_of[r.id], r.status not in TERMINAL, r.prompt_tokens + r.completion_tokens, r.cost_u,
                     r.token_budget, r.cost_budget_u) for r in rows]
    by_id = {r.id: r for r in rows}
    spend = {r.run_id: r for r in runs}
    waiting, paused = 0, []
    for status, spec_key, item_index, run_id in s.execute(
            select(PlanTaskRow.status, PlanTaskRow.spec_key, PlanTaskRow.item_index, PlanTaskRow.run_id)
            .where(PlanTaskRow.plan_id == plan.id)):
        if status in TASK_TERMINAL:
            continue
        if item_index is None and spec_key in fan_out and status == TaskStatus.RUNNING:
            continue  # fanned out: its items are the tasks
        if run_id in spend and spend[run_id].live:
            run = by_id[run_id]
            if status in IN_FLIGHT and run.status == RunStatus.PAUSED and run.pause_reason == OVER_BUDGET:
                paused.append(spend[run_id])
            continue
        waiting += 1
    return Ledger(plan.token_budget, plan.cost_budget_u, runs, waiting, paused)


def new_run_budget(db: str, plan_id: str, agent_id: str) -> tuple[int | None, int | None]:
    """(token_budget, cost_budget_u) for the run the scheduler is about to create for one of the plan's tasks
    (its task dispatched, its run not there yet): the plan's even share, or the agent's own limit when smaller;
    None where the plan sets no budget (the run then keeps its agent's)."""
    with session(db, readonly=True) as s:
        plan = s.get(PlanRow, plan_id)
        if plan is None or (plan.token_budget is None and plan.cost_budget_u is None):
            return None, None
        book = ledger(s, plan)
        agent = s.get(AgentRow, agent_id)
        own_tokens, own_cost = agent_limits(AgentSpec.model_validate_json(agent.spec_json)) if agent else (None, None)
    tokens, cost = held(book.runs)
    return (smaller(share(book.token_budget, tokens, book.waiting), own_tokens) if book.token_budget is not None
            else None,
            smaller(share(book.cost_budget_u, cost, book.waiting), own_cost) if book.cost_budget_u is not None
            else None)


# ---- a run paused for its budget -------------------------------------------------------------------------------
def _paused_runs(s: Session, plan_id: str) -> list[tuple[str, RunRow]]:
    return [(key, run) for key, run in s.execute(
        select(PlanTaskRow.key, RunRow).join(RunRow, RunRow.id == PlanTaskRow.run_id)
        .where(PlanTaskRow.plan_id == plan_id, PlanTaskRow.status.in_(IN_FLIGHT),
               RunRow.status == RunStatus.PAUSED, RunRow.pause_reason == OVER_BUDGET)).all()]


def _noted(s: Session, plan_id: str) -> set[tuple]:
    bodies = s.scalars(select(PlanEventRow.data_json).where(PlanEventRow.plan_id == plan_id,
                                                            PlanEventRow.type == "task.over_budget"))
    return {(d.get("run_id"), d.get("token_budget"), d.get("cost_budget_u")) for d in map(json.loads, bodies)}


def note_over_budget(db: str, plan_id: str) -> int:
    """Append `task.over_budget` (used and budget) for each of the plan's in-flight tasks whose run paused for its
    budget and has no such event yet at this budget; how many were appended. The scheduler's reconcile calls it
    for each plan with such a run; cheap when there is nothing new to note (only a read)."""
    def due(s: Session) -> list[tuple[str, RunRow]]:
        noted = _noted(s, plan_id)
        return [(k, r) for k, r in _paused_runs(s, plan_id) if (r.id, r.token_budget, r.cost_budget_u) not in noted]

    with session(db, readonly=True) as s:
        if not due(s):
            return 0
    with session(db) as s:
        tx = open_plan(s, plan_id, ANY)  # locks the plan: a concurrent caller waits, then finds them noted
        found = due(s)
        for key, run in found:
            tx.event("task.over_budget", key, run_id=run.id, used_tokens=run.prompt_tokens + run.completion_tokens,
                     token_budget=run.token_budget, cost_u=run.cost_u, cost_budget_u=run.cost_budget_u)
        return len(found)


# ---- raising the plan's budget ---------------------------------------------------------------------------------
def _raise_in_plan(db: str, plan_id: str, token_budget: int | None, cost_budget_u: int | None, actor: str,
                   project_id: ProjectScope) -> tuple[PlanRow, list[tuple[str, int | None, int | None]]]:
    if token_budget is None and cost_budget_u is None:
        raise PlanError("give token_budget, cost_budget_usd or both", param="token_budget")
    for value, param in ((token_budget, "token_budget"), (cost_budget_u, "cost_budget_usd")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise PlanError(f"{param} must be a whole number, zero or more", param=param)
    with session(db) as s:
        tx = open_plan(s, plan_id, project_id)
        plan = tx.plan
        if plan.status in PLAN_TERMINAL:
            raise PlanError(f"cannot raise the budget of plan {plan_id}: it is {plan.status}", status=409)
        for new, old, param in ((token_budget, plan.token_budget, "token_budget"),
                                (cost_budget_u, plan.cost_budget_u, "cost_budget_usd")):
            if new is not None and old is not None and new < old:
                raise PlanError(f"{param} can only be raised: the plan's is {old}, more than {new}", param=param)
        before = {"token_budget": plan.token_budget, "cost_budget_u": plan.cost_budget_u}
        if token_budget is not None:
            plan.token_budget = token_budget
        if cost_budget_u is not None:
            plan.cost_budget_u = cost_budget_u
        book = ledger(s, plan)
        # the paused runs get a new budget: they count what they used, and share the rest with the tasks to come
        again = frozenset(r.run_id for r in book.paused)
        tokens, cost = held(book.runs, used_only=again)
        n = book.waiting + len(again)
        t_share, c_share = share(plan.token_budget, tokens, n), share(plan.cost_budget_u, cost, n)
        agents = dict(s.execute(select(RunRow.id, AgentRow.spec_json).join(AgentRow, AgentRow.id == RunRow.agent_id)
                                .where(RunRow.id.in_(list(again)))).all()) if again else {}
        changes = []
        for r in book.paused:
            own_tokens, own_cost = agent_limits(AgentSpec.model_validate_json(agents[r.run_id]))
            # never below the run's budget: a raise of the plan does not lower any run's
            new_tokens = None if t_share is None else max(r.token_budget or 0, smaller(r.tokens + t_share, own_tokens)
                                                          or 0)
            new_cost = None if c_share is None else max(r.cost_budget_u or 0, smaller(r.cost_u + c_share, own_cost)
                                                        or 0)
            changes.append((r.run_id, new_tokens, new_cost))
        tx.event("plan.budget_raised", actor=actor, before=before,
                 after={"token_budget": plan.token_budget, "cost_budget_u": plan.cost_budget_u},
                 runs=[{"run_id": run_id, "token_budget": t, "cost_budget_u": c} for run_id, t, c in changes])
        return plan, changes


def raise_budget(db: str, plan_id: str, *, token_budget: int | None = None, cost_budget_u: int | None = None,
                 actor: str = "user", project_id: ProjectScope = ANY) -> tuple[PlanRow, list[str]]:
    """Store the plan's new budget (never lower than it was) with a `plan.budget_raised` event, then give each
    of its budget-paused runs its new share through the runs' budget-raise path, which queues it again. Returns
    the plan and the ids of the runs queued again. A crash between the two leaves the runs paused: raising
    again with the same values finishes the job."""
    plan, changes = _raise_in_plan(db, plan_id, token_budget, cost_budget_u, actor, project_id)
    resumed = []
    for run_id, tokens, cost in changes:
        run = control.raise_budget(db, run_id, token_budget=tokens, cost_budget_u=cost, actor=actor)
        if run.status == RunStatus.QUEUED:
            resumed.append(run_id)
    return plan, resumed
