"""The plan document a user (or, later, the planner agent) writes: a DAG of tasks, each naming an agent, its
inputs and the artifact schema it must meet; checked before anything is stored.

Loading (`load_plan`) only parses and type-checks; `validate_plan` checks the graph (unique ids, known
dependencies, no cycle, map_over among the dependencies, valid output schemas, known agents and tools) and
returns the order tasks can run in. Every refusal is one `PlanError` naming the JSON path that is wrong, so the
API answers a 400 that points at the line to fix and nothing is stored.

Artifacts pass between tasks as canonical JSON (`artifact_bytes`): the bytes stored for a task are the bytes
its dependents receive, and `artifact_hash` of them is what both sides record.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

TASK_ID = r"^[a-z0-9][a-z0-9_-]{0,63}$"
TEN_YEARS_S = 10 * 365 * 24 * 3600  # as agents.spec: bounds keep deadline arithmetic in range
PLAN_PRIORITY = 1_000_000  # |plan priority| bound: plan * 1000 + task priority must fit a 32-bit column
TASK_PRIORITY = 499  # |task priority| bound: below 1000 / 2, so plan priority always ranks first


class PlanError(ValueError):
    """A plan, a task or an artifact refused, or a request the plan store cannot honour.

    `param` is the JSON path of what is wrong ("tasks[2].depends_on"; None for the document as a whole) and
    `status` the HTTP status the API answers with (400 bad input, 404 unknown or another project's, 409 the
    wrong state)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


class TaskSpec(BaseModel):
    """One node of the DAG. `prompt` may say `{goal}` (the plan's goal) and, in a fan-out task, `{item}`."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(..., pattern=TASK_ID, description="unique in the plan; dependencies name it")
    agent: str = Field(..., min_length=1, max_length=100, description="a stored agent of the plan's project")
    prompt: str = Field(..., min_length=1, max_length=100_000, description="what this task must do")
    depends_on: list[str] = Field(default_factory=list, description="tasks whose artifacts this one reads")
    map_over: Optional[str] = Field(None, description="a dependency whose artifact is a JSON array: one subtask "
                                                      "per item; dependents of this task get the list of results")
    output_schema: Optional[dict[str, Any]] = Field(None, description="JSON Schema of the artifact; None: any "
                                                                      "JSON value")
    priority: int = Field(0, ge=-TASK_PRIORITY, le=TASK_PRIORITY, description="higher first, within the plan")
    on_failure: Literal["fail", "retry", "skip", "replan"] = "retry"
    max_attempts: int = Field(2, ge=1, le=10, description="runs of this task, the first included (retry)")
    max_replans: int = Field(2, ge=0, le=5, description="revisions the planner may make of this task when it "
                             "fails (replan); then it fails as any task does")
    complexity: Literal["auto", "simple", "hard"] = "auto"
    requires_approval: bool = Field(False, description="a human approves before the task starts")
    timeout_s: Optional[float] = Field(None, gt=0, le=TEN_YEARS_S)
    queue_timeout_s: Optional[float] = Field(None, gt=0, le=TEN_YEARS_S, description="the longest the task waits for "
                                             "capacity (ready, or preempted and paused) before it fails without a "
                                             "retry; None: the plan's queue_timeout_s")


class PlanSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    goal: str = Field(..., min_length=1, max_length=20_000)
    name: Optional[str] = Field(None, max_length=255)
    tasks: list[TaskSpec] = Field(..., min_length=1, max_length=1000)
    priority: int = Field(0, ge=-PLAN_PRIORITY, le=PLAN_PRIORITY, description="higher first, across plans")
    approve_plan: bool = Field(False, description="the whole plan waits for a human 'approve' before any task")
    approval_ttl_s: Optional[float] = Field(None, gt=0, le=TEN_YEARS_S, description="a gate (approve_plan, a "
                                            "task's requires_approval) undecided this long takes approval_expiry")
    approval_expiry: Literal["reject", "approve"] = Field("reject", description="the decision an expired gate takes")
    simple_model: Optional[str] = Field(None, min_length=1, max_length=255, description="the model simple tasks run "
                                        "on first (a cheaper one); a retry escalates to the agent's own model. None: "
                                        "every task on its agent's model")
    token_budget: Optional[int] = Field(None, ge=1)
    queue_timeout_s: Optional[float] = Field(None, gt=0, le=TEN_YEARS_S, description="the queue_timeout_s of a task "
                                             "without its own; None: tasks wait for capacity as long as it takes")
    message_timeout_s: float = Field(600, gt=0, le=TEN_YEARS_S, description="the longest a task waits for another's "
                                     "message (wait_for_message); then the wait ends with an error its agent sees")
    deadlock_policy: Literal["fail_youngest", "ask_human"] = Field(
        "fail_youngest", description="a wait-for cycle between tasks: fail the member dispatched last, or leave it "
        "to a human (POST /v1/diagnostics/deadlocks/{id}/resolve; past approval_ttl_s: fail_youngest)")
    max_handoffs: int = Field(6, ge=0, le=100, description="handoffs one task may have; one more is a livelock and "
                                                           "fails the task")
    cost_budget_usd: Optional[str] = Field(None, description="list-price USD, e.g. '0.50'")
    attachments: Optional[dict[str, str | list[str]]] = Field(
        None, description="what every task's run may read, as a run's attachments: {'docs': folder or file ids, "
        "'db': path or file id}; checked when the plan is created and stored as the server paths they resolve to")

    @field_validator("cost_budget_usd")
    @classmethod
    def _usd(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            amount = Decimal(v)
        except InvalidOperation:
            raise ValueError("must be a decimal amount of USD, like '0.50'")
        if not amount.is_finite() or amount < 0:
            raise ValueError("must be a finite amount of USD, zero or more")
        return v


# ---- loading -----------------------------------------------------------------------------------------------
def json_path(loc: tuple | list) -> str | None:
    """pydantic's ("tasks", 2, "id") as "tasks[2].id"; the empty location (the document) as None."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _looks_like_file(text: str) -> bool:
    return ("\n" not in text and len(text) < 4096 and not text.lstrip().startswith(("{", "["))
            and os.path.isfile(text))


def _parse(text: str) -> Any:
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise PlanError(f"not valid YAML: {problem}{where}")


def load_plan(source: str | Path | Mapping[str, Any]) -> PlanSpec:
    """A PlanSpec from JSON or YAML text, a file path (a Path, or a one-line str naming an existing file) or a
    dict. Only parsing and types are checked here; `validate_plan` checks the graph."""
    if isinstance(source, Mapping):
        doc: Any = dict(source)
    else:
        if isinstance(source, Path) or _looks_like_file(source):
            try:
                text = Path(source).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise PlanError(f"cannot read the plan file {str(source)!r}: {e}")
        else:
            text = source
        doc = _parse(text)
    if not isinstance(doc, dict):
        raise PlanError(f"a plan is a mapping with goal and tasks, not {type(doc).__name__}")
    try:
        return PlanSpec.model_validate(doc)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
        param = json_path(first["loc"])
        raise PlanError(f"{param or 'plan'}: {first['msg']}{more}", param=param)


# ---- the graph ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanGraph:
    """A valid plan's structure, as the store walks it: tasks by id, who depends on whom, the run order."""
    by_key: dict[str, TaskSpec]
    order: list[str]  # topological, ties in spec order
    dependents: dict[str, list[str]]  # task id -> the tasks that depend on it, in run order
    rank: dict[str, int]  # task id -> its place in `order`


def _topological(spec: PlanSpec) -> tuple[list[str], list[int]]:
    """Kahn's algorithm, always taking the earliest ready task in spec order. Returns (the order, []), or, when a
    cycle remains, (a partial order, the spec indexes of one real cycle in data-flow order: each task feeds the
    next), the cycle starting at its member earliest in the spec."""
    index = {t.id: i for i, t in enumerate(spec.tasks)}
    pending = [len(set(t.depends_on)) for t in spec.tasks]
    feeds: list[list[int]] = [[] for _ in spec.tasks]
    for i, t in enumerate(spec.tasks):
        for dep in set(t.depends_on):
            feeds[index[dep]].append(i)
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(spec.tasks[i].id)
        for j in feeds[i]:
            pending[j] -= 1
            if pending[j] == 0:
                heapq.heappush(ready, j)
    if len(order) == len(spec.tasks):
        return order, []
    # every task left has a dependency left: walk dependencies back from the first one until one repeats
    left = {i for i, n in enumerate(pending) if n > 0}
    walk: list[int] = []
    seen: dict[int, int] = {}
    i = min(left)
    while i not in seen:
        seen[i] = len(walk)
        walk.append(i)
        i = min(index[d] for d in spec.tasks[i].depends_on if index[d] in left)
    cycle = list(reversed(walk[seen[i]:]))  # dependency order reversed: each feeds the next
    start = cycle.index(min(cycle))
    return order, cycle[start:] + cycle[:start]


def validate_plan(spec: PlanSpec, *, agents: Mapping[str, set[str]] | None = None,
                  tools: set[str] | None = None) -> list[str]:
    """The task ids in an order they can run in (a dependency before its dependents, ties in spec order), or a
    PlanError for the first thing wrong. With `agents` (agent name -> its tool names) every task must name one
    of them; with `tools` too, every tool those agents use must be known."""
    index: dict[str, int] = {}
    for i, t in enumerate(spec.tasks):
        if t.id in index:
            raise PlanError(f"duplicate task id {t.id!r} (also tasks[{index[t.id]}])", param=f"tasks[{i}].id")
        index[t.id] = i
    for i, t in enumerate(spec.tasks):
        where = f"tasks[{i}]"
        for j, dep in enumerate(t.depends_on):
            if dep not in index:
                raise PlanError(f"task {t.id!r} depends on unknown task {dep!r}", param=f"{where}.depends_on[{j}]")
            if dep in t.depends_on[:j]:
                raise PlanError(f"task {t.id!r} lists {dep!r} twice in depends_on", param=f"{where}.depends_on[{j}]")
        if t.map_over is not None and t.map_over not in t.depends_on:
            raise PlanError(f"task {t.id!r} maps over {t.map_over!r}, which is not in its depends_on",
                            param=f"{where}.map_over")
        if t.map_over is None and "{item}" in t.prompt:
            raise PlanError(f"task {t.id!r} says {{item}} but maps over nothing (map_over)", param=f"{where}.prompt")
        if t.output_schema is not None:
            try:
                Draft202012Validator.check_schema(t.output_schema)
            except SchemaError as e:
                at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path)
                raise PlanError(f"task {t.id!r}: output_schema is not a valid JSON Schema: {e.message}"
                                + (f" (at {at.lstrip('.')})" if at else ""), param=f"{where}.output_schema")
        if agents is not None:
            if t.agent not in agents:
                raise PlanError(f"task {t.id!r} names unknown agent {t.agent!r}", param=f"{where}.agent")
            unknown = sorted(set(agents[t.agent]) - tools) if tools is not None else []
            if unknown:
                raise PlanError(f"task {t.id!r}: agent {t.agent!r} uses unknown tool {unknown[0]!r}",
                                param=f"{where}.agent")
    order, cycle = _topological(spec)
    if cycle:
        ids = [spec.tasks[i].id for i in cycle]
        raise PlanError("dependency cycle: " + " → ".join(ids + ids[:1]) + " (each task depends on the one before "
                        "it)", param=f"tasks[{cycle[0]}].depends_on")
    return order


def plan_graph(spec: PlanSpec) -> PlanGraph:
    """The structure of a plan that `validate_plan` accepted."""
    order = validate_plan(spec)
    rank = {k: i for i, k in enumerate(order)}
    dependents: dict[str, list[str]] = {k: [] for k in order}
    for t in spec.tasks:
        for dep in t.depends_on:
            dependents[dep].append(t.id)
    for k in dependents:
        dependents[k].sort(key=rank.__getitem__)
    return PlanGraph(by_key={t.id: t for t in spec.tasks}, order=order, dependents=dependents, rank=rank)


# ---- artifacts ---------------------------------------------------------------------------------------------
def artifact_bytes(value: Any) -> bytes:
    """The canonical JSON of an artifact: what is stored, hashed, and handed to dependents. NaN and infinities
    are refused (ValueError): they are not JSON, and a reader in another language could not decode them."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def artifact_hash(value: Any) -> str:
    return hashlib.sha256(artifact_bytes(value)).hexdigest()


def check_artifact(schema: dict[str, Any] | None, value: Any) -> None:
    """PlanError unless `value` is JSON and meets `schema` (None: any JSON value); the message gives the first
    error's path (param "artifact.items[2].name") and what is wrong, and how many more there are."""
    try:
        artifact_bytes(value)
    except (TypeError, ValueError) as e:
        raise PlanError(f"the artifact is not JSON: {e}", param="artifact")
    if schema is None:
        return
    errors = list(Draft202012Validator(schema).iter_errors(value))
    if not errors:
        return
    first = errors[0]
    param = "artifact" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    raise PlanError(f"the artifact does not match the output schema at {param}: {first.message}{more}", param=param)
