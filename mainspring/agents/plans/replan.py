"""Replanning: a failed task with on_failure "replan" is revised by the planner model and runs again.

The DAG keeps its shape: the planner revises the failed task itself, never the graph. `transitions.fail` puts
such a task in "replanning" (durable, its dependents still waiting) while it has revisions left (max_replans).
The leader then, beside its ticks (`Replanner`, started by the scheduler after each tick it led), asks the
planner model for a new {"agent", "prompt"} for that one task, given the plan's goal, the task's prompt and
agent, the keys of the upstream artifacts it reads and the error. The model answers under a JSON schema
(response_format json_schema, as planner.py: the agent an enum of the project's agents); an answer that is not
JSON or names an unknown agent is sent back once with its error, then the task fails with "replanning failed:
..." and its dependents are cancelled, as for any failure.

The revision is stored on the task row (agent_override, prompt_override, replans + 1) and the task is ready
again with attempt + 1 (task.replanned), in one transaction that checks the task is still replanning with the
same `replans` count: a compare-and-set, so of two schedulers (a deposed leader's late answer) one applies it
and the other is refused. The planner call is not journaled: a leader killed during it leaves the task
replanning, and the next leader asks again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy import select

from mainspring.agents.journal import JournalError
from mainspring.agents.plans import planner, store
from mainspring.agents.plans.spec import PlanError
from mainspring.agents.plans.tables import PlanRow, PlanStatus, PlanTaskRow, TaskStatus
from mainspring.agents.plans.transitions import done, fail, guarded, settle
from mainspring.models import ChatModel, Message
from mainspring.store.base import utcnow as now
from mainspring.store.db import session

log = logging.getLogger("mainspring.plans")

FIELDS = ("agent", "prompt")
MAX_PROMPT = 100_000  # as TaskSpec.prompt: a model that ignores the schema's maxLength is still bounded
# what the planner is shown of the goal, the task's prompt and the error: enough to revise, short enough for a
# small model's context (the task's run is still given the whole goal and its artifacts)
SHOWN_CHARS = 4_000
MAX_TOKENS = 64 + planner.TOKENS_PER_TASK
PER_PASS = 4  # tasks revised per pass; the next pass (after the next tick) takes the rest
TIMEOUT_S = 300.0  # one planner call; past it the task fails rather than holding the pass


@dataclass(frozen=True)
class Pending:
    """A task waiting for its revision, with what the planner is told about it."""
    task_id: str
    key: str
    project_id: int | None
    replans: int  # the compare-and-set: revisions it had when read
    goal: str
    agent: str
    prompt: str
    upstream: tuple[str, ...]
    error: str


@dataclass(frozen=True)
class Revision:
    agent: str
    prompt: str
    attempts: int = 1


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 1] + "…"


def pending(db: str, limit: int = PER_PASS) -> list[Pending]:
    """Replanning tasks of running plans, highest priority first, then longest waiting."""
    with session(db, readonly=True) as s:
        rows = s.execute(select(PlanTaskRow, PlanRow).join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                         .where(PlanTaskRow.status == TaskStatus.REPLANNING, PlanRow.status == PlanStatus.RUNNING)
                         .order_by(PlanTaskRow.priority.desc(), PlanTaskRow.updated_at, PlanTaskRow.id)
                         .limit(limit)).all()
    out = []
    for task, plan in rows:
        spec = next(t for t in store.load_spec(plan).tasks if t.id == task.spec_key)
        upstream = [d for d in spec.depends_on if not (task.item_index is not None and d == spec.map_over)]
        out.append(Pending(task.id, task.key, plan.project_id, task.replans, plan.goal,
                           task.agent_override or spec.agent, task.prompt_override or spec.prompt,
                           tuple(upstream), task.error or "unknown error"))
    return out


def revision_schema(agents: list[str]) -> dict[str, Any]:
    """The JSON Schema the planner answers under: {"agent": one of the project's agents, "prompt": ...}."""
    return {"type": "object", "additionalProperties": False, "required": list(FIELDS),
            "properties": {"agent": {"enum": sorted(set(agents))},
                           "prompt": {"type": "string", "minLength": 1, "maxLength": planner.PROMPT_CHARS}},
            "x-guidance": {"whitespace_flexible": False, "whitespace_pattern": None}}  # as planner_schema


def messages_for(task: Pending, agents: list[planner.AgentSummary]) -> list[Message]:
    example = json.dumps({"agent": agents[0].name, "prompt": "Do the task again, avoiding the error."},
                         separators=(",", ":"), ensure_ascii=False)
    system = "\n".join([
        "You revise one task of a plan after it failed. The task can be given to one of these agents:",
        *(a.line() for a in agents),
        "Rules:",
        "- Write a new prompt for the task that avoids its error, and name the agent best able to do it (it may "
        "stay the same).",
        f"- The prompt is at most {planner.PROMPT_CHARS} characters. The task is also given the goal and the "
        "results of the tasks it reads.",
        "Answer with JSON only, like this example:",
        example])
    reads = ", ".join(task.upstream) if task.upstream else "nothing"
    user = (f"Goal: {_cut(task.goal)}\nTask: {task.key}\nAgent: {task.agent}\nPrompt: {_cut(task.prompt)}\n"
            f"It reads the results of: {reads}\nIt failed with: {_cut(task.error)}")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_revision(text: str, agents: set[str], *, cut: bool = False) -> Revision:
    """The planner's answer as a Revision, or a PlanError saying what is wrong with it."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        why = "it was cut at max_tokens" if cut else f"{e.msg} at line {e.lineno} column {e.colno}"
        raise PlanError(f"the planner's answer is not JSON ({why})")
    if not isinstance(doc, dict) or set(doc) != set(FIELDS):
        raise PlanError('the planner\'s answer is not a revision: it must be {"agent": ..., "prompt": ...} and '
                        "nothing else")
    agent, prompt = doc["agent"], doc["prompt"]
    if not isinstance(agent, str) or agent not in agents:
        raise PlanError(f"the planner's revision names unknown agent {agent!r}")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT:
        raise PlanError(f"the planner's revision needs a prompt of 1 to {MAX_PROMPT} characters")
    return Revision(agent, prompt)


async def revise(model: ChatModel, task: Pending, agents: list[planner.AgentSummary], *, attempts: int = 2,
                 timeout_s: float = TIMEOUT_S) -> Revision:
    """The planner's revision of `task`; a refused answer is sent back once with its error. PlanError when the
    last answer is refused or the model fails."""
    offered = sorted(agents, key=lambda a: a.name)[:planner.MAX_AGENTS]
    if not offered:
        raise PlanError("the plan's project has no agents")
    names = [a.name for a in offered]
    messages, schema, errors = messages_for(task, offered), revision_schema(names), []
    for attempt in range(1, max(1, attempts) + 1):
        try:
            async with asyncio.timeout(timeout_s):
                text, cut = await planner.ask(model, messages, schema, MAX_TOKENS, name="revision")
        except TimeoutError:
            raise PlanError(f"the planner model {model.model!r} did not answer within {timeout_s:g} s") from None
        try:
            found = parse_revision(text, set(names), cut=cut)
        except PlanError as exc:
            errors.append(exc.message)
            log.info("replanning %s: attempt %d refused: %s", task.key, attempt, exc.message)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"That revision was refused: {exc.message}. Answer again as "
                                                     "JSON, fixing this."}]
            continue
        return Revision(found.agent, found.prompt, attempt)
    raise PlanError(f"{errors[-1]} (after {len(errors)} attempts)")


# ---- the two outcomes, each one transaction guarded by the replans count -------------------------------------
def apply_revision(db: str, task_id: str, replans: int, revision: Revision, model: str) -> PlanTaskRow:
    """replanning (with `replans` revisions so far) -> ready with the revision and attempt + 1; PlanError 409 when
    the task is no longer that (another scheduler applied one, the plan ended)."""
    with session(db) as s:
        t = now()
        tx, task = guarded(s, task_id, TaskStatus.REPLANNING, "replan", when=(PlanTaskRow.replans == replans,),
                           status=TaskStatus.READY.value, replans=replans + 1, agent_override=revision.agent,
                           prompt_override=revision.prompt, attempt=PlanTaskRow.attempt + 1, run_id=None,
                           dispatched_at=None, handoffs=0, ready_at=t, updated_at=t)
        tx.event("task.replanned", task.key, agent=revision.agent, prompt=revision.prompt, replan=replans + 1,
                 model=model, attempt=task.attempt, planner_attempts=revision.attempts)
        return task


def fail_replanning(db: str, task_id: str, replans: int, error: str) -> PlanTaskRow:
    """replanning -> failed with `error`, not replanned again; its dependents are cancelled (guarded as
    `apply_revision`)."""
    with session(db) as s:
        tx, task = guarded(s, task_id, TaskStatus.REPLANNING, "fail the replanning of",
                           when=(PlanTaskRow.replans == replans,), updated_at=now())
        done(tx, fail(tx, task, error, retryable=False))
        settle(tx)
        return task


async def replan_one(db: str, task: Pending, model_of: Callable[[str], ChatModel] | None, model_name: str,
                     *, timeout_s: float = TIMEOUT_S) -> PlanTaskRow:
    """Revise `task` and apply the revision, or fail it with why. PlanError 409 when another got there first."""
    if model_of is None:
        return await asyncio.to_thread(fail_replanning, db, task.task_id, task.replans,
                                       "replanning needs a planner model, and none is configured")
    try:
        model = await asyncio.to_thread(model_of, model_name)
        agents = await asyncio.to_thread(planner.project_agents, db, task.project_id)
        revision = await revise(model, task, agents, timeout_s=timeout_s)
    except (KeyError, LookupError, JournalError):  # as Plans._planner_of: the resolver's "unknown model"
        return await asyncio.to_thread(fail_replanning, db, task.task_id, task.replans,
                                       f"replanning failed: unknown planner model {model_name!r}")
    except PlanError as exc:
        return await asyncio.to_thread(fail_replanning, db, task.task_id, task.replans,
                                       f"replanning failed: {exc.message}")
    return await asyncio.to_thread(apply_revision, db, task.task_id, task.replans, revision, model_name)


async def replan_pending(db: str, model_of: Callable[[str], ChatModel] | None, model_name: str, *,
                         limit: int = PER_PASS, timeout_s: float = TIMEOUT_S) -> int:
    """One pass: up to `limit` replanning tasks, one at a time. Returns how many changed (revised or failed)."""
    changed = 0
    for task in await asyncio.to_thread(pending, db, limit):
        try:
            await replan_one(db, task, model_of, model_name, timeout_s=timeout_s)
        except PlanError as exc:  # another scheduler applied its revision, or the plan ended meanwhile
            log.info("replanning %s: %s", task.key, exc.message)
            continue
        changed += 1
    return changed


class Replanner:
    """The scheduler's replanning, in the background of its loop: `kick` (after a tick this process led) starts
    a pass unless one is going, so a slow planner model never holds up the ticks."""

    def __init__(self, db: str, model_of: Callable[[str], ChatModel] | None, model_name: str, *,
                 on_done: Callable[[], None] = lambda: None, limit: int = PER_PASS) -> None:
        self.db, self.model_of, self.model_name, self.limit = db, model_of, model_name, limit
        self.on_done = on_done  # a task is ready (or failed): the scheduler's next tick should see it now
        self._pass: asyncio.Task | None = None

    def kick(self) -> None:
        if self._pass is None or self._pass.done():
            self._pass = asyncio.create_task(self._run(), name="plan-replanner")

    async def _run(self) -> None:
        try:
            changed = await replan_pending(self.db, self.model_of, self.model_name, limit=self.limit)
        except Exception:  # a database hiccup: the next kick tries again
            log.exception("plan replanning failed")
            return
        if changed:
            self.on_done()

    async def stop(self) -> None:
        if self._pass is not None:
            self._pass.cancel()
            await asyncio.gather(self._pass, return_exceptions=True)
            self._pass = None
