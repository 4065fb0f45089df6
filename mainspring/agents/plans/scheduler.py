"""The plan scheduler: decides which ready task runs next, and turns each task into an ordinary durable run.

Every server process runs one; only the holder of the "plan-scheduler" lease acts (leader.py), the others
stand by. A tick of the leader:
0. gates: an approval gate undecided past its plan's approval_ttl_s takes its approval_expiry; a task waiting for
   capacity (ready, or preempted and paused) past its queue_timeout_s fails without a retry (queue_wait.py).
1. reconcile: each dispatched or running task looks at its run. A finished run completes the task with its
   result (the artifact, checked against the task's schema by the store) or fails it with the run's error;
   a task past its `timeout_s` has its run cancelled and fails (retried per on_failure with a fresh run);
   a dispatched task whose run row is missing (the leader died between writing the run id down and creating
   the run) gets its run now, under that same id; a cancelled task's run that still goes on is cancelled.
2. dispatch: while fewer than `max_running` tasks are in flight, the next ready task is taken by priority
   (plan priority, then task priority), and among equal priority from the project with the fewest tasks in
   flight (fair share: one project's 500 ready tasks do not starve another's 5), oldest first within it.
   The task is marked dispatched with a fresh run id (the guarded update: exactly one scheduler wins it),
   then the run is created with that id. The workers of every process claim runs as they always do: the only
   runs of a plan are those the scheduler created.
3. preempt: when every slot is taken and a waiting task outranks the lowest-priority running one, that one is
   marked preempted and its run paused at its next step boundary (the journal keeps every completed step);
   the slot goes to the waiting task at once. A preempted task whose run has paused competes for slots like a
   ready one, and winning one resumes its run, which goes on from its last completed step.

A task's run calls its agent's model, or the plan's `simple_model` when the task is simple (declared, or by a
rule of thumb: task_run.route) on its first attempt; a retry escalates to the agent's own model.

A run's goal is the task's prompt ({goal} and {item} filled in) followed by each upstream artifact whole, as
the exact canonical JSON the upstream stored, with its sha256: no summary between stages. A task with an
output_schema runs with that schema as the run's own, so its final answer is checked JSON (agents/output.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import and_, func, or_, select

from mainspring.agents import control, journal
from mainspring.agents.journal import JournalError, project_is
from mainspring.agents.plans import budget, deadlocks, handoffs, leader, queue_wait, replan, schedules, store
from mainspring.agents.plans.admission import Admission, candidates
from mainspring.agents.plans.task_run import render_goal, route
from mainspring.agents.plans.spec import PlanError, PlanSpec, TaskSpec
from mainspring.agents.plans.tables import PlanRow, PlanStatus, PlanTaskRow, TaskStatus
from mainspring.agents.polling import IdlePace
from mainspring.agents.status import TERMINAL, RunStatus
from mainspring.agents.tables import AgentRow, RunRow
from mainspring.models import ChatModel
from mainspring.store.db import session
from mainspring.store.ids import new_id

log = logging.getLogger("mainspring.plans")

IN_FLIGHT = (TaskStatus.DISPATCHED, TaskStatus.RUNNING)  # what takes a slot (a preempted task gave its slot up)
ACTOR = "plan-scheduler"


@dataclass
class TickReport:
    leader: bool = False
    term: int | None = None
    completed: int = 0
    failed: int = 0
    dispatched: int = 0
    recreated: int = 0
    preempted: int = 0
    resumed: int = 0
    timed_out: int = 0
    expired: int = 0
    queue_timed_out: int = 0  # tasks that waited for capacity past their queue_timeout_s (queue_wait.py)
    fired: int = 0  # plans and runs started by schedules (schedules.py)
    handed_off: int = 0
    deadlocks: int = 0
    blocked: dict[str, int] = field(default_factory=dict)  # ready tasks held back, by reason (admission.py)

    def acted(self) -> bool:
        """Whether this tick changed anything or held a ready task back: the scheduler then looks again soon."""
        return bool(self.blocked) or any((self.completed, self.failed, self.dispatched, self.recreated,
                                          self.preempted, self.resumed, self.timed_out, self.expired,
                                          self.queue_timed_out, self.fired, self.handed_off, self.deadlocks))


class PlanScheduler:
    def __init__(self, db: str, owner: str, *, max_running: int = 8, lease_s: float = 10.0, poll_s: float = 0.5,
                 notify: Callable[[], None] = lambda: None,
                 interrupt: Callable[[str, str], None] = lambda run_id, order: None, admission: Admission | None = None,
                 replanner: Callable[[str], ChatModel] | None = None, replan_model: str = "smollm2") -> None:
        self.db, self.owner = db, owner
        self.max_running, self.lease_s, self.poll_s = max_running, lease_s, poll_s
        self.notify = notify  # the local worker: a new run is there to claim
        # the local worker, at once: (run id, "pause") stops the run at its next step boundary, (run id, "cancel")
        # cuts its step in flight; another process's worker reads the journaled request at its next heartbeat
        self.interrupt = interrupt
        self.admission = admission or Admission()  # capacities beyond max_running: admission.py
        self._main: asyncio.Task | None = None
        self._wake = asyncio.Event()
        # failed on_failure "replan" tasks revised by the planner model `replan_model`, beside the ticks (replan.py)
        self.replans = replan.Replanner(db, replanner, replan_model, on_done=self.wake)

    # ---- the loop ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._main = asyncio.create_task(self._run(), name="plan-scheduler")

    async def stop(self) -> None:
        if self._main:
            self._main.cancel()
            await asyncio.gather(self._main, return_exceptions=True)
            self._main = None
        await self.replans.stop()
        try:
            await asyncio.to_thread(leader.release, self.db, leader.SCHEDULER_LEASE, self.owner)
        except Exception:  # shutting down: the lease then runs out by itself
            log.exception("plan scheduler: could not release the lease")

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        pace = IdlePace(self.poll_s)
        while True:
            found = True
            try:
                report = await asyncio.to_thread(self.tick)
                if report.leader:
                    self.replans.kick()
                found = report.acted()
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup must not stop scheduling
                log.exception("plan scheduler tick failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pace.after(found)):  # not wait_for: see worker.py's _run
                    await self._wake.wait()

    # ---- one tick ------------------------------------------------------------------------------------------
    def tick(self) -> TickReport:
        report = TickReport()
        report.term = leader.hold(self.db, leader.SCHEDULER_LEASE, self.owner, self.lease_s)
        if report.term is None:
            return report
        report.leader = True
        self._expire_gates(report)
        report.queue_timed_out = queue_wait.check(self.db, self.cancel_run)
        report.fired = schedules.fire_due(self.db, journal.now())
        self._reconcile(report)
        report.deadlocks = deadlocks.check(self.db, self.cancel_run)
        self._dispatch(report)
        if self._preempt(report):
            self._dispatch(report)
        if report.dispatched or report.recreated or report.resumed or report.handed_off or report.fired:
            self.notify()
        return report

    def _expire_gates(self, report: TickReport) -> None:
        """A gate left undecided past its plan's approval_ttl_s takes the plan's approval_expiry, journaled with
        the actor "expiry" like any decision (plan gates wait from the plan's creation, task gates from when the
        task reached its gate)."""
        with session(self.db, readonly=True) as s:
            plans = list(s.scalars(select(PlanRow).where(PlanRow.status == PlanStatus.AWAITING_APPROVAL)))
            gated = list(s.execute(select(PlanTaskRow, PlanRow).join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                                   .where(PlanTaskRow.status == TaskStatus.AWAITING_APPROVAL,
                                          PlanRow.status == PlanStatus.RUNNING)).all())
        t = journal.now()
        for plan, since, task in [*((p, p.created_at, None) for p in plans), *((p, k.updated_at, k) for k, p in gated)]:
            spec = store.load_spec(plan)
            if spec.approval_ttl_s is None or (t - since).total_seconds() <= spec.approval_ttl_s:
                continue
            why = f"undecided for {spec.approval_ttl_s:g} s: {spec.approval_expiry}"
            try:
                if task is None and spec.approval_expiry == "approve":
                    store.approve_plan(self.db, plan.id, "expiry")
                elif task is None:
                    store.reject_plan(self.db, plan.id, "expiry", comment=why)
                elif spec.approval_expiry == "approve":
                    store.approve_task(self.db, task.id, "expiry")
                else:
                    store.reject_task(self.db, task.id, "expiry", comment=why)
            except PlanError as exc:  # a person decided meanwhile
                log.info("plan %s: gate not expired: %s", plan.id, exc)
                continue
            report.expired += 1

    def _reconcile(self, report: TickReport) -> None:
        with session(self.db, readonly=True) as s:
            # each task with its run and its plan, read once a tick (the plan's spec is parsed once per plan: store)
            rows = s.execute(
                select(PlanTaskRow, RunRow, PlanRow).outerjoin(RunRow, RunRow.id == PlanTaskRow.run_id)
                .join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                .where(PlanTaskRow.status.in_([*IN_FLIGHT, TaskStatus.PREEMPTED, TaskStatus.CANCELLED]),
                       PlanTaskRow.run_id.is_not(None))).all()
        for task, run, plan in rows:
            spec = next(t for t in store.load_spec(plan).tasks if t.id == task.spec_key)
            try:
                if task.status == TaskStatus.CANCELLED:
                    if run is not None and run.status not in TERMINAL:
                        control.request(self.db, run.id, "cancel", actor="plan")
                elif run is None:
                    self._create_run(task, task.run_id)
                    report.recreated += 1
                elif run.status == RunStatus.SUCCEEDED and run.stop_reason == "handoff":
                    self._hand_off(task, spec, run, plan)
                    report.handed_off += 1
                elif run.status == RunStatus.SUCCEEDED:
                    done = store.complete_task(self.db, task.id, self._artifact(spec, run))
                    if done.status == TaskStatus.SUCCEEDED:
                        report.completed += 1
                    else:
                        report.failed += 1
                elif run.status in TERMINAL:
                    reason = run.error or run.stop_reason or run.status
                    store.fail_task(self.db, task.id, f"run {run.id} {run.status}: {reason}")
                    report.failed += 1
                elif self._timed_out(task, spec):
                    self._time_out(task, spec, run)
                    report.timed_out += 1
                elif task.status == TaskStatus.DISPATCHED and run.status != RunStatus.QUEUED:
                    store.mark_running(self.db, task.id)
            except (PlanError, JournalError) as exc:  # a person changed it meanwhile: the next tick sees it
                log.info("plan task %s: %s", task.key, exc)
        # a run paused for its share of the plan's budget: the plan's event stream says so (once per budget)
        for plan_id in {plan.id for _, run, plan in rows if run is not None and run.status == RunStatus.PAUSED
                        and run.pause_reason == "budget"}:
            budget.note_over_budget(self.db, plan_id)

    def _hand_off(self, task: PlanTaskRow, spec: TaskSpec, run: RunRow, plan: PlanRow) -> None:
        """The run handed its task to another agent: the task goes on with a fresh run of that agent (its id
        written down first, as at dispatch), or fails as a livelock past the plan's max_handoffs."""
        hand = handoffs.request_of(run.result)
        if hand is None:
            store.fail_task(self.db, task.id, f"run {run.id} ended as a handoff without saying to whom")
            return
        limit = store.load_spec(plan).max_handoffs
        if task.handoffs >= limit:
            agents = [*handoffs.chain(self.db, task, spec.agent), hand["to"]]
            found = deadlocks.livelock(self.db, plan.id, task.key, agents, limit)
            store.fail_task(self.db, task.id, f"livelock ({found.id}): handed over {len(agents) - 1} times, past "
                            f"max_handoffs={limit}: {deadlocks.spell(agents)}", retryable=False)
            return
        run_id = new_id("run_")
        store.hand_off(self.db, task.id, run.id, run_id, hand)
        task.handoffs, task.agent_override, task.run_id = task.handoffs + 1, hand["to"], run_id
        self._create_run(task, run_id)

    def cancel_run(self, run_id: str) -> None:
        """Cancel a run now (a deadlock's victim): journaled, and its step in flight cut if it is local."""
        try:
            control.request(self.db, run_id, "cancel", actor=ACTOR)
        except JournalError:  # it ended meanwhile
            return
        self.interrupt(run_id, "cancel")

    @staticmethod
    def _timed_out(task: PlanTaskRow, spec: TaskSpec) -> bool:
        """Its `timeout_s` has passed since this attempt was dispatched (time spent preempted included)."""
        timeout = spec.timeout_s
        return timeout is not None and task.dispatched_at is not None and \
            (journal.now() - task.dispatched_at).total_seconds() > timeout

    def _time_out(self, task: PlanTaskRow, spec: TaskSpec, run: RunRow) -> None:
        """The run is cancelled first (a crash in between leaves a cancelled run, which fails the task at the next
        tick anyway), then the task fails per its on_failure: a retry gets a fresh run and a fresh clock."""
        control.request(self.db, run.id, "cancel", actor=ACTOR)
        self.interrupt(run.id, "cancel")
        store.fail_task(self.db, task.id, f"timed out after {spec.timeout_s:g} s (run {run.id} cancelled)")

    @staticmethod
    def _artifact(spec: TaskSpec, run: RunRow) -> Any:
        """The run's result as the task's artifact: JSON when the task declares a schema, else the text."""
        if spec.output_schema is None:
            return run.result or ""
        try:
            return json.loads(run.result or "")
        except json.JSONDecodeError:
            return run.result  # the store's schema check fails it with the reason


    def _in_flight(self) -> Counter:
        with session(self.db, readonly=True) as s:
            return Counter(dict(s.execute(
                select(PlanTaskRow.project_id, func.count()).where(PlanTaskRow.status.in_(IN_FLIGHT))
                .group_by(PlanTaskRow.project_id)).all()))

    def _dispatch(self, report: TickReport) -> None:
        in_flight = self._in_flight()
        free = self.max_running - sum(in_flight.values())
        if free <= 0:
            return
        gate = self.admission.begin(self.db)
        for task in candidates(free, lambda n: self._next_tasks(n, in_flight), lambda: gate.taken):
            demand = self.admission.demand(self.db, task)
            reason = gate.reason(demand)
            if reason is not None:  # it stays ready (the next tick asks again); the tasks after it may start
                report.blocked[reason] = report.blocked.get(reason, 0) + 1
                self.admission.note_blocked(self.db, task, reason)
                continue
            if task.status == TaskStatus.PREEMPTED:
                if self._resume(task, report):
                    gate.take(demand)
                continue
            run_id = new_id("run_")
            try:
                store.mark_dispatched(self.db, task.id, run_id)
            except PlanError:  # another scheduler took it, or a person cancelled it
                continue
            gate.take(demand)
            try:
                self._create_run(task, run_id)
            except (PlanError, JournalError) as exc:  # e.g. its agent was deleted: the task fails with why
                store.fail_task(self.db, task.id, f"cannot start the task's run: {exc}")
                continue
            report.dispatched += 1

    def _resume(self, task: PlanTaskRow, report: TickReport) -> bool:
        """A preempted task's turn again: its run first (a crash between the two leaves a running run of a
        preempted task, recorded when it ends), then the task."""
        assert task.run_id is not None  # preempted: it has its run
        try:
            control.request(self.db, task.run_id, "resume", actor=ACTOR)
            store.resume_task(self.db, task.id)
        except (PlanError, JournalError) as exc:
            log.info("plan task %s: not resumed: %s", task.key, exc)
            return False
        report.resumed += 1
        return True

    def _preempt(self, report: TickReport) -> bool:
        """With every slot taken, pause the lowest-priority running task for a waiting one that outranks it."""
        in_flight = self._in_flight()
        if sum(in_flight.values()) < self.max_running:
            return False
        waiting = self._next_tasks(1, in_flight)
        # a waiting task that may not start (admission.py) would only hand the slot to another
        if not waiting or self.admission.begin(self.db).reason(self.admission.demand(self.db, waiting[0])):
            return False
        with session(self.db, readonly=True) as s:
            victim = s.scalars(select(PlanTaskRow).join(RunRow, RunRow.id == PlanTaskRow.run_id)
                               .where(PlanTaskRow.status == TaskStatus.RUNNING,
                                      RunRow.status.in_([RunStatus.RUNNING, RunStatus.QUEUED]),
                                      PlanTaskRow.priority < waiting[0].priority)
                               .order_by(PlanTaskRow.priority, PlanTaskRow.dispatched_at.desc())).first()
        if victim is None or victim.run_id is None:
            return False
        try:  # the task first: a crash before the pause leaves its run to end and be recorded, never stuck
            store.preempt_task(self.db, victim.id, by=waiting[0].key)
            control.request(self.db, victim.run_id, "pause", actor=ACTOR)
            self.interrupt(victim.run_id, "pause")
        except (PlanError, JournalError) as exc:  # it ended meanwhile
            log.info("plan task %s: not preempted: %s", victim.key, exc)
            return False
        report.preempted += 1
        return True

    def _next_tasks(self, free: int, in_flight: Counter) -> list[PlanTaskRow]:
        """Up to `free` waiting tasks: by priority, then the project with fewest in flight, then oldest."""
        with session(self.db, readonly=True) as s:
            # ready tasks, and preempted ones whose run has paused: both wait for a slot
            waiting = or_(PlanTaskRow.status == TaskStatus.READY,
                          and_(PlanTaskRow.status == TaskStatus.PREEMPTED, PlanTaskRow.run_id.in_(
                              select(RunRow.id).where(RunRow.status == RunStatus.PAUSED))))
            projects = list(s.scalars(
                select(PlanTaskRow.project_id).join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                .where(waiting, PlanRow.status == PlanStatus.RUNNING).distinct()))
            pool: list[PlanTaskRow] = []
            for project in projects:  # each project's best `free`: enough whichever project wins each turn
                pool += s.scalars(
                    select(PlanTaskRow).join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                    .where(waiting, PlanRow.status == PlanStatus.RUNNING,
                           project_is(PlanTaskRow.project_id, project))
                    .order_by(PlanTaskRow.priority.desc(), PlanTaskRow.ready_at,
                              func.coalesce(PlanTaskRow.item_index, -1), PlanTaskRow.id).limit(free)).all()
        counts = Counter(in_flight)
        chosen: list[PlanTaskRow] = []
        while pool and len(chosen) < free:
            top = max(t.priority for t in pool)
            pick = min((t for t in pool if t.priority == top), key=lambda t: counts[t.project_id])
            chosen.append(pick)
            pool.remove(pick)
            counts[pick.project_id] += 1
        return chosen

    def _create_run(self, task: PlanTaskRow, run_id: str) -> None:
        with session(self.db, readonly=True) as s:
            plan = s.get(PlanRow, task.plan_id)
            assert plan is not None
            plan_spec = store.load_spec(plan)
            spec = next(t for t in plan_spec.tasks if t.id == task.spec_key)
            agent = task.agent_override or spec.agent  # after a handoff: the agent the task is with
            agent_id = s.scalars(select(AgentRow.id).where(AgentRow.name == agent,
                                                           project_is(AgentRow.project_id, plan.project_id))
                                 .order_by(AgentRow.version.desc())).first()
            if agent_id is None:
                raise PlanError(f"no agent {agent!r} in the plan's project")
        goal = "\n\n".join(filter(None, [render_goal(spec, store.task_inputs(self.db, task.id)),
                                          handoffs.context(self.db, task)]))
        token_budget, cost_budget_u = budget.new_run_budget(self.db, plan.id, agent_id)
        journal.create_run(self.db, agent_id, goal, priority=task.priority, project_id=plan.project_id,
                           api_key_id=plan.api_key_id, run_id=run_id, output_schema=spec.output_schema,
                           model=route(plan_spec, spec, task.attempt), token_budget=token_budget,
                           cost_budget_u=cost_budget_u, attachments=resolved_attachments(plan_spec))


def resolved_attachments(plan: PlanSpec) -> dict[str, str] | None:
    """The plan's attachments as Plans.create stored them: server paths, one per kind (never file-id lists)."""
    if not plan.attachments:
        return None
    if any(not isinstance(v, str) for v in plan.attachments.values()):
        raise PlanError("the plan's attachments were stored unresolved", param="attachments")
    return {k: v for k, v in plan.attachments.items() if isinstance(v, str)}
