"""The planner agent: a plan (a DAG of tasks) written by a model from a goal, under a JSON schema.

The model answers with `response_format` json_schema, so the embedded engine's constrained decoding can only
produce JSON of `planner_schema`. That schema makes the graph a DAG by construction: task ids are positional
("t1", "t2", ... as `const`, so the model cannot repeat or invent one) and task i's `depends_on` is an array of
the enum ["t1" .. "t(i-1)"], so every edge points at an earlier task and no cycle can be written. Agents are an
enum of the project's agents, so no unknown agent either. There are no other fields: a planned task runs with
the defaults (any JSON artifact, on_failure "retry").

Not every model honours the schema (an upstream endpoint may ignore response_format), so the answer is checked
as any plan is (`spec.load_plan` + `spec.validate_plan`), not against the schema itself: a plan that is a valid
DAG is accepted whatever its ids, and one that is not (a cycle, an unknown dependency or agent, not JSON) is
sent back to the model once with the error (`attempts`), then refused with PlanError 422. The planner call
itself is not journaled: nothing is stored until a plan validates, so a crash during it loses nothing and the
caller simply asks again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from mainspring.agents.journal import project_is
from mainspring.agents.plans.spec import PlanError, PlanSpec, load_plan, validate_plan
from mainspring.agents.tables import AgentRow
from mainspring.models import ChatModel, Message, ModelStopped, UpstreamError
from mainspring.store.db import session

log = logging.getLogger("mainspring.plans")

MAX_TASKS = 32  # the most tasks one planner answer may hold (the API's max_tasks bound)
MAX_AGENTS = 64  # agents offered to the planner: the system prompt stays short enough for a small context
PROMPT_CHARS = 240  # a planned task's prompt, in the schema: keeps each task to a few dozen tokens
SUMMARY_CHARS = 160  # an agent's instructions, as the planner sees them
TOKENS_PER_TASK = 48 + PROMPT_CHARS // 2  # id, agent, dependencies, JSON punctuation and a prompt at its longest
TASK_FIELDS = ("id", "agent", "prompt", "depends_on")
MAX_GOAL = 20_000  # as PlanSpec.goal: checked before the model is asked, so a bad goal is not the model's fault


@dataclass(frozen=True)
class AgentSummary:
    """An agent as the planner sees it: its name (what a task names), what it is told to do, its tools."""
    name: str
    instructions: str = ""
    tools: tuple[str, ...] = ()

    def line(self) -> str:
        about = " ".join(self.instructions.split())
        if len(about) > SUMMARY_CHARS:
            about = about[:SUMMARY_CHARS - 1].rstrip() + "…"
        tools = f" (tools: {', '.join(self.tools)})" if self.tools else ""
        return f"- {self.name}: {about or 'a general agent'}{tools}"


@dataclass
class Drafted:
    """A plan the planner wrote and `validate_plan` accepted, with how many model calls it took."""
    spec: PlanSpec
    attempts: int
    errors: list[str] = field(default_factory=list)  # why each earlier answer was refused


def project_agents(db: str, project_id: int | None) -> list[AgentSummary]:
    """The project's agents (the newest version of each name), as the planner sees them, by name: another
    project's agents are never offered."""
    found: dict[str, AgentSummary] = {}
    with session(db, readonly=True) as s:
        for name, body in s.execute(select(AgentRow.name, AgentRow.spec_json).where(
                project_is(AgentRow.project_id, project_id)).order_by(AgentRow.version)):
            spec = json.loads(body)
            found[name] = AgentSummary(name, spec.get("instructions") or "", tuple(spec.get("tools") or ()))
    return [found[k] for k in sorted(found)]


def task_id(i: int) -> str:
    """The id of the i-th planned task (1-based): positional, so a dependency can only name an earlier one."""
    return f"t{i}"


def _check_bounds(agents: list[str], max_tasks: int) -> None:
    if not agents:
        raise PlanError("create an agent first: the planner gives each task to one of the project's agents, and "
                        "there are none", status=400)
    if not 1 <= max_tasks <= MAX_TASKS:
        raise PlanError(f"max_tasks must be between 1 and {MAX_TASKS}", param="max_tasks")


def planner_schema(agents: list[str], max_tasks: int) -> dict[str, Any]:
    """The JSON Schema the planner writes under: {"tasks": [{id, agent, prompt, depends_on}, ...]}, 1..max_tasks
    tasks, each depending only on tasks before it (see the module docstring)."""
    _check_bounds(agents, max_tasks)
    agent_enum = sorted(set(agents))
    items = []
    for i in range(1, max_tasks + 1):
        earlier = [task_id(j) for j in range(1, i)]
        depends = ({"type": "array", "items": {"enum": earlier}, "maxItems": len(earlier)} if earlier
                   else {"type": "array", "maxItems": 0})
        items.append({"type": "object", "additionalProperties": False, "required": list(TASK_FIELDS),
                      "properties": {"id": {"const": task_id(i)}, "agent": {"enum": agent_enum},
                                     "prompt": {"type": "string", "minLength": 1, "maxLength": PROMPT_CHARS},
                                     "depends_on": depends}})
    return {"type": "object", "additionalProperties": False, "required": ["tasks"],
            "properties": {"tasks": {"type": "array", "minItems": 1, "maxItems": max_tasks, "prefixItems": items,
                                     "items": False}},
            # compact JSON: a small model otherwise spends its token budget on whitespace between tokens
            "x-guidance": {"whitespace_flexible": False, "whitespace_pattern": None}}


def system_prompt(agents: list[AgentSummary], max_tasks: int) -> str:
    first = agents[0].name
    second = agents[1].name if len(agents) > 1 else first
    # the example's prompts fit any goal (each task is also given the goal): a small model that copies the
    # example still writes a plan that works
    example = json.dumps({"tasks": [
        {"id": "t1", "agent": first, "prompt": "Find the key facts the goal needs.", "depends_on": []},
        {"id": "t2", "agent": second, "prompt": "Use those facts to complete the goal.", "depends_on": ["t1"]}]},
        separators=(",", ":"), ensure_ascii=False)
    return "\n".join([
        f"You plan work for a team of agents. Split the user's goal into at most {max_tasks} tasks; each task is "
        "done by one of these agents:",
        *(a.line() for a in agents),
        "Rules:",
        "- Task ids are t1, t2, t3, ... in order.",
        "- A task may depend only on tasks before it: its depends_on lists their ids, and it is given their results.",
        "- A prompt says what its task must do. Every task is also given the goal.",
        "- Use as few tasks as the goal needs.",
        "Answer with JSON only, like this example:",
        example])


def parse_plan(text: str, goal: str, agents: set[str], max_tasks: int, *, cut: bool = False) -> PlanSpec:
    """The planner's answer as a PlanSpec, or a PlanError saying what is wrong with it (`cut`: the answer hit
    max_tokens, so it is likely incomplete)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        why = "it was cut at max_tokens" if cut else f"{e.msg} at line {e.lineno} column {e.colno}"
        raise PlanError(f"the planner's answer is not JSON ({why})")
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list) or set(doc) != {"tasks"}:
        raise PlanError('the planner\'s answer is not a plan: it must be {"tasks": [...]} and nothing else')
    tasks = doc["tasks"]
    if len(tasks) > max_tasks:
        raise PlanError(f"the planner's plan has {len(tasks)} tasks, more than max_tasks ({max_tasks})")
    for i, t in enumerate(tasks):
        extra = sorted(set(t) - set(TASK_FIELDS)) if isinstance(t, dict) else []
        if extra:
            raise PlanError(f"tasks[{i}] has the field {extra[0]!r}; a planned task has only {', '.join(TASK_FIELDS)}")
        deps = t.get("depends_on") if isinstance(t, dict) else None
        if isinstance(deps, list) and all(isinstance(d, str) for d in deps):
            # a dependency named twice is the same edge: drop the repeat rather than refuse the plan
            t["depends_on"] = list(dict.fromkeys(deps))
    spec = load_plan({"goal": goal, "tasks": tasks})
    validate_plan(spec, agents={name: set() for name in agents})  # tools are the store's to check
    return spec


def _refusal(exc: PlanError) -> str:
    if exc.message.startswith("the planner's"):
        return exc.message
    what = "is not a DAG" if exc.message.startswith("dependency cycle") else "is invalid"
    where = f" at {exc.param}" if exc.param and not exc.message.startswith(exc.param) else ""
    return f"the planner's plan {what}{where}: {exc.message}"


async def ask(model: ChatModel, messages: list[Message], schema: dict, max_tokens: int,
              name: str = "plan") -> tuple[str, bool]:
    """One planner call under `schema` (named `name`): (its text, whether max_tokens cut it). A model failure is
    a PlanError, not retried here: it is not the plan's fault (an upstream's own retries have run). Also the
    replanner's (replan.py)."""
    try:
        out = await model.chat(messages, response_format={"type": "json_schema", "json_schema": {
            "name": name, "schema": schema, "strict": True}}, max_tokens=max_tokens, temperature=0.0)
    except ModelStopped as exc:  # only a restart of its server brings it back: the caller may retry then
        raise PlanError(f"the planner model {model.model!r} is not serving: {exc.message}", status=503) from exc
    except UpstreamError as exc:
        raise PlanError(f"the planner model {model.model!r} failed: {exc.message}", status=502) from exc
    except ValueError as exc:  # the engine refused the request (too long for its context, ...)
        raise PlanError(f"the planner model {model.model!r} refused the request: {exc}") from exc
    except Exception as exc:  # a timeout, a stopped engine: the caller may retry later
        log.warning("planner model %s failed: %r", model.model, exc)
        raise PlanError(f"the planner model {model.model!r} failed: {exc}", status=503) from exc
    return out.text or "", out.finish_reason == "length"


async def draft(model: ChatModel, goal: str, agents: list[AgentSummary], *, max_tasks: int = 8,
                attempts: int = 2) -> Drafted:
    """`draft_plan`, also saying how many calls it took and why earlier answers were refused."""
    if not goal.strip() or len(goal) > MAX_GOAL:
        raise PlanError(f"goal must be 1 to {MAX_GOAL} characters, not blank", param="goal")
    offered = sorted(agents, key=lambda a: a.name)[:MAX_AGENTS]
    names = [a.name for a in offered]
    schema = planner_schema(names, max_tasks)
    max_tokens = 64 + TOKENS_PER_TASK * max_tasks
    messages: list[Message] = [{"role": "system", "content": system_prompt(offered, max_tasks)},
                               {"role": "user", "content": f"Goal: {goal}"}]
    errors: list[str] = []
    for attempt in range(1, max(1, attempts) + 1):
        try:
            text, cut = await ask(model, messages, schema, max_tokens)
        except PlanError as exc:
            if not errors:
                raise
            # the retry's longer conversation may not fit where the first call did: the refusal is the news
            raise PlanError(f"{errors[-1]} (the retry could not be asked: {exc.message})", status=422) from exc
        try:
            spec = parse_plan(text, goal, set(names), max_tasks, cut=cut)
        except PlanError as exc:
            errors.append(_refusal(exc))
            log.info("planner attempt %d refused: %s", attempt, errors[-1])
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"That plan was refused: {errors[-1]}. Write the whole plan "
                                                     "again as JSON, fixing this."}]
            continue
        return Drafted(spec, attempt, errors)
    first = f"; the first: {errors[0]}" if errors[0] != errors[-1] else ""
    raise PlanError(f"{errors[-1]} (after {len(errors)} attempts{first})", status=422)


async def draft_plan(model: ChatModel, goal: str, agents: list[AgentSummary], *, max_tasks: int = 8,
                     attempts: int = 2) -> PlanSpec:
    """A plan for `goal` written by `model` over the project's `agents` (goal and tasks only: the caller sets the
    plan's other fields). A refused answer is sent back once with its error; the last refusal is PlanError 422,
    no agents PlanError 400."""
    return (await draft(model, goal, agents, max_tasks=max_tasks, attempts=attempts)).spec

