"""/v1/scenes/threads: the 3D scenario's design dialogue (`mainspring scene chat`) over HTTP, stored per project.

POST /v1/scenes/threads opens a thread: the first scene for the request, with the given constraints pinned as the
opening agreement (turn 0) and repaired towards. Each POST .../{id}/turns is one user turn: the model's edit, then
every pinned constraint re-checked and what the edit broke reported and repaired (scenarios/scene3d/dialogue.py).
Between turns a thread is one row holding its dialogue state as JSON (store/tables.py SceneThreadRow).

The dialogue belongs to the scenario layer, which this layer does not import (api and scenarios are independent
layers, pyproject.toml [tool.importlinter]): the app is handed it, `create_app(scene_dialogue=...)`, by the
composition root (cli.py `serve` gives scenarios/scene3d/thread_state.py's SceneThreads); without it these routes
answer 404 `not_served`. The model is resolved by the agent runtime's resolver, as an agent run's is, for the
caller's project, and each of its calls is billed as an API call of the caller (api/billed_model.py): the
caller's ledger, budgets and rate limits.

Tenancy as for stored responses: a thread belongs to the project of the key that opened it, and another project's
thread is a 404, as for an id never used. One turn at a time per thread: a second turn while one runs is a 409, at
once in this process, or, from another process on the same database, when it would save over a version that has
moved on. A turn is never lost silently.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from contextlib import contextmanager
from typing import Any, Iterator, Literal, Protocol, Sequence, cast

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select, update
from sqlalchemy.engine import CursorResult

from mainspring.agents.journal import JournalError, project_is
from mainspring.api.billed_model import BilledChat
from mainspring.api.errors import APIError, bad_request
from mainspring.api.routes import new_id
from mainspring.api.routes.agents import MAX_INT, api_error, page
from mainspring.models import ChatModel
from mainspring.scenes.constraint_model import Id
from mainspring.store.base import utcnow
from mainspring.store.db import session
from mainspring.store.tables import SceneThreadRow

router = APIRouter()
PREFIX = "/v1/scenes/threads"
ENDPOINT = PREFIX  # what the ledger rows of a thread's model calls name
MAX_OBJECTS = 8  # as `mainspring scene chat --ids`: the scene's decoding schema names every id
MAX_CONSTRAINTS = 64
MAX_TEXT = 20_000


class SceneDialogue(Protocol):
    """What these routes need of the design dialogue; scenarios/scene3d/thread_state.py SceneThreads is one."""

    def constraints(self, values: Sequence[Any],
                    object_ids: Sequence[str]) -> tuple[list[Any], list[tuple[int, str]]]: ...

    async def start(self, model: ChatModel, request: str, object_ids: Sequence[str], constraints: Sequence[Any],
                    max_rounds: int | None = None, token_budget: int | None = None) -> dict[str, Any]: ...

    async def turn(self, model: ChatModel, state: dict[str, Any], text: str,
                   constraints: Sequence[Any] = ()) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def object_ids(self, state: dict[str, Any]) -> list[str]: ...

    def view(self, state: dict[str, Any]) -> dict[str, Any]: ...


# ---- bodies ----------------------------------------------------------------------------------------------
class CreateSceneThread(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(..., min_length=1, max_length=255)
    request: str = Field(..., min_length=1, max_length=MAX_TEXT, description="what to build")
    objects: list[Id] = Field(..., min_length=1, max_length=MAX_OBJECTS, description="the scene's object ids")
    constraints: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_CONSTRAINTS,
                                              description="scene/0.1 constraints, pinned as the opening agreement")
    max_rounds: int | None = Field(None, ge=0, le=10, description="repair rounds per turn (default 3)")
    token_budget: int | None = Field(None, ge=1, le=MAX_INT, description="prompt + completion tokens, whole thread")


class SceneTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., min_length=1, max_length=MAX_TEXT, description="the user's turn")
    constraints: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_CONSTRAINTS,
                                              description="constraints the user pins with this turn")


class SceneThreadUsage(BaseModel):
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int


class PinnedConstraint(BaseModel):
    label: str
    turn: int  # the turn that agreed it (0: the opening request)
    constraint: dict[str, Any]


class SceneThreadObject(BaseModel):
    id: str
    object: Literal["scene.thread"] = "scene.thread"
    created_at: int
    updated_at: int
    model: str
    scene: dict[str, Any] | None  # the current scene/0.1 document (None: the first answer was no scene)
    pinned: list[PinnedConstraint]
    turns: list[dict[str, Any]]  # each turn's report: edit_error, added, changed, rejected, broken, repaired, ...
    max_rounds: int
    token_budget: int | None
    usage: SceneThreadUsage


class SceneTurnObject(SceneThreadObject):
    turn: dict[str, Any]  # the report of the turn just taken (also the last of `turns`)


class DeletedSceneThread(BaseModel):
    id: str
    object: Literal["scene.thread.deleted"] = "scene.thread.deleted"
    deleted: bool = True


# ---- what a route works with -----------------------------------------------------------------------------
def _dialogue(request: Request) -> SceneDialogue:
    dialogue = getattr(request.app.state, "scene_dialogue", None)
    if dialogue is None:  # a 4xx: the request is fine, this server does not serve it (and no answer here is a 5xx)
        raise APIError(404, "this server was started without the 3D scenario's design dialogue, so it serves no "
                       "scene threads (`mainspring serve` does)", code="not_served")
    return dialogue


def _db(request: Request) -> Any:
    return request.app.state.economics.db


def _project(request: Request) -> int | None:
    principal = request.state.principal
    return principal.project_id if principal is not None else None


def _not_found(thread_id: str) -> APIError:
    return APIError(404, f"Scene thread with id '{thread_id}' not found.", param="thread_id", code="not_found")


def _owned(s: Any, request: Request, thread_id: str) -> SceneThreadRow:
    row = s.scalar(select(SceneThreadRow).where(SceneThreadRow.id == thread_id,
                                                project_is(SceneThreadRow.project_id, _project(request))))
    if row is None:  # another project's thread is as absent as one that never was
        raise _not_found(thread_id)
    return row


async def _load(request: Request, thread_id: str) -> SceneThreadRow:
    def get() -> SceneThreadRow:
        with session(_db(request), readonly=True) as s:
            return _owned(s, request, thread_id)

    return await asyncio.to_thread(get)


async def _model(request: Request, name: str) -> ChatModel:
    """`name` as an agent run of the caller's project gets it: the agent runtime's resolver (the server's
    AppModels: the engine, upstreams, fine-tuned models), which may read the database, so off the loop."""
    resolve = request.app.state.agents.worker.env.models
    try:
        return await asyncio.to_thread(resolve, name, _project(request))
    except JournalError as exc:
        if exc.status != 400:  # 403: an upstream model for a local-only project
            raise api_error(exc) from None
    except LookupError:  # what a plain resolver (a mapping: KeyError) says for an unknown name
        pass
    # the chat route's answer for a name it does not serve (routes/models.py resolve_model)
    raise APIError(404, f"The model '{name}' does not exist; see GET /v1/models", param="model",
                   code="model_not_found")


def _billed(model: ChatModel, request: Request, name: str, call_id: str) -> ChatModel:
    """Every model call of the thread on the caller's ledger and budgets, as an API call is (402 when the
    budget cannot hold the next one: the turn is not saved, the thread stays as it was)."""
    return BilledChat(model, request, ENDPOINT, name, f"{call_id}-{secrets.token_hex(3)}")


def _constraints(dialogue: SceneDialogue, values: list[dict[str, Any]], object_ids: Sequence[str]) -> list[Any]:
    parsed, bad = dialogue.constraints(values, object_ids)
    if bad:
        i, why = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise bad_request(f"invalid value for 'constraints[{i}]': {why}{more}", param=f"constraints[{i}]",
                          code="invalid_value")
    return parsed


def _not_blank(text: str, param: str) -> None:
    if not text.strip():
        raise bad_request(f"'{param}' is blank: say what you want", param=param, code="invalid_value")


def _object(row: SceneThreadRow, dialogue: SceneDialogue, **extra: Any) -> Any:
    cls = SceneTurnObject if "turn" in extra else SceneThreadObject
    return cls(id=row.id, created_at=int(row.created_at.timestamp()), updated_at=int(row.updated_at.timestamp()),
               model=row.model, **dialogue.view(json.loads(row.state_json)), **extra)


# ---- one turn at a time ----------------------------------------------------------------------------------
_TURNING: set[tuple[int | None, str]] = set()  # (project, thread id) of the turns running in this process


@contextmanager
def _one_turn(request: Request, thread_id: str) -> Iterator[None]:
    """Refuses a second turn on a thread while one runs here (checked and claimed with no await between, so on
    one event loop nothing comes between them). Keyed by project too: one project's claims never touch
    another's."""
    key = (_project(request), thread_id)
    if key in _TURNING:
        raise APIError(409, f"scene thread {thread_id} is taking a turn; send the next one when it has answered",
                       param="thread_id", code="thread_busy")
    _TURNING.add(key)
    try:
        yield
    finally:
        _TURNING.discard(key)


async def _save(request: Request, row: SceneThreadRow, state: dict[str, Any]) -> SceneThreadRow:
    """The turn's state, written only over the version it started from: a turn saved meanwhile by another
    process wins and this one is a 409 (never silently over it)."""
    def write() -> SceneThreadRow:
        with session(_db(request)) as s:
            # an UPDATE returns a CursorResult (with rowcount); Session.execute is typed as the general Result
            done = cast(CursorResult, s.execute(
                update(SceneThreadRow)
                .where(SceneThreadRow.id == row.id, SceneThreadRow.version == row.version,
                       project_is(SceneThreadRow.project_id, _project(request)))
                .values(state_json=json.dumps(state), version=row.version + 1, updated_at=utcnow())))
            if done.rowcount != 1:
                if s.get(SceneThreadRow, row.id) is None:
                    raise APIError(404, f"scene thread {row.id} was deleted while this turn ran; it is not saved",
                                   param="thread_id", code="not_found")
                raise APIError(409, f"another turn on scene thread {row.id} was saved while this one ran; this "
                               "turn is not saved: read the thread and send it again", param="thread_id",
                               code="thread_busy")
            return _owned(s, request, row.id)

    return await asyncio.to_thread(write)


# ---- routes ----------------------------------------------------------------------------------------------
@router.post(PREFIX)
async def create_scene_thread(body: CreateSceneThread, request: Request) -> SceneThreadObject:
    """Writes the first scene (exactly `objects`) and repairs it towards `constraints`, pinned as turn 0."""
    dialogue = _dialogue(request)
    _not_blank(body.request, "request")
    if len(set(body.objects)) != len(body.objects):
        raise bad_request("'objects' names an id more than once", param="objects", code="invalid_value")
    constraints = _constraints(dialogue, body.constraints, body.objects)
    thread_id = new_id("sth_")
    model = _billed(await _model(request, body.model), request, body.model, thread_id)
    state = await dialogue.start(model, body.request, body.objects, constraints, body.max_rounds, body.token_budget)
    principal, now = request.state.principal, utcnow()
    row = SceneThreadRow(id=thread_id, project_id=_project(request),
                         api_key_id=principal.id if principal is not None else None, model=body.model,
                         state_json=json.dumps(state), version=1, created_at=now, updated_at=now)

    def insert() -> None:
        with session(_db(request)) as s:
            s.add(row)

    await asyncio.to_thread(insert)
    return _object(row, dialogue)


@router.post(PREFIX + "/{thread_id}/turns")
async def take_scene_turn(thread_id: str, body: SceneTurn, request: Request) -> SceneTurnObject:
    """One user turn: the edit, `constraints` pinned, every agreement re-checked and what the edit broke repaired.
    The answer is the thread after it, with the turn's report as `turn`."""
    dialogue = _dialogue(request)
    _not_blank(body.text, "text")
    await _load(request, thread_id)  # a thread the caller cannot see is a 404 before it can be busy
    with _one_turn(request, thread_id):
        row = await _load(request, thread_id)  # read again under the claim: the state this turn continues
        state = json.loads(row.state_json)
        constraints = _constraints(dialogue, body.constraints, dialogue.object_ids(state))
        model = _billed(await _model(request, row.model), request, row.model, f"{row.id}-v{row.version}")
        state, turn = await dialogue.turn(model, state, body.text, constraints)
        saved = await _save(request, row, state)
    return _object(saved, dialogue, turn=turn)


@router.get(PREFIX)
async def list_scene_threads(request: Request, limit: int = Query(20, ge=1, le=100)) -> dict:
    """The caller's project's threads, newest first."""
    dialogue = _dialogue(request)

    def rows() -> list[SceneThreadRow]:
        with session(_db(request), readonly=True) as s:
            return list(s.scalars(select(SceneThreadRow)
                                  .where(project_is(SceneThreadRow.project_id, _project(request)))
                                  .order_by(SceneThreadRow.created_at.desc(), SceneThreadRow.id.desc()).limit(limit)))

    return page([_object(r, dialogue) for r in await asyncio.to_thread(rows)])


@router.get(PREFIX + "/{thread_id}")
async def get_scene_thread(thread_id: str, request: Request) -> SceneThreadObject:
    return _object(await _load(request, thread_id), _dialogue(request))


@router.delete(PREFIX + "/{thread_id}")
async def delete_scene_thread(thread_id: str, request: Request) -> DeletedSceneThread:
    """A turn still running on the thread then finds it gone and is not saved (its answer says so)."""
    def drop() -> None:
        with session(_db(request)) as s:
            s.delete(_owned(s, request, thread_id))

    await asyncio.to_thread(drop)
    return DeletedSceneThread(id=thread_id)
