"""Scene design threads (/v1/scenes/threads) on a real server: a thread opened, edited turn by turn with its
pinned constraints kept, read back from the database; an edit that breaks an agreement reported and repaired in
the answer; list and delete; another project's thread a 404; bad input a 400 naming the field; a second turn
while one runs a 409, in this process and from another process that saved first.

The model is the scene tests' scripted one (it answers scene / patch JSON and checks each answer against the
format it was asked for), served through the agent runtime's resolver, as the server serves an agent run's.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import pytest

from mainspring.agents.journal import JournalError
from mainspring.scenarios.scene3d import load_briefs
from mainspring.scenes.patch import dumps
from mainspring.store.db import dispose_engines
from tests.scenarios.scene3d.scripted import ScriptedModel
from tests.scenarios.scene3d.test_refine import patch, written
from tests.servers import serve

from .test_agent_routes import NoEngine, ok

os.environ.setdefault("LP_NUM_THREADS", "1")  # llvmpipe renders visible_in_camera checks: one of two cores

CUP = next(b for b in load_briefs() if b.id == "cup_on_table")
OPEN = {"model": "scripted", "request": CUP.request(), "objects": list(CUP.objects),
        "constraints": [c.model_dump(mode="json") for c in CUP.constraints], "max_rounds": 2}
FIRST = dumps(written(0.8))  # a first scene that keeps every constraint of the brief
NUDGE = dumps({"patch": [{"op": "replace", "path": "/objects/1/position/0", "value": 0.1}], "constraints": []})
TALLER = dumps({"patch": [{"op": "replace", "path": "/objects/0/size/1", "value": 1.0},
                          {"op": "replace", "path": "/objects/0/position/1", "value": 0.5}], "constraints": []})
CUP_BACK_ON_TOP = patch(("/objects/1/position/1", 1.05))
NEAR = {"type": "near", "a": "cup", "b": "table", "max": 0.5}


class GatedModel(ScriptedModel):
    """The scripted model whose turn edits wait for `release`, with `entered` set once one waits."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__(answers)
        self.entered, self.release = threading.Event(), threading.Event()

    async def chat(self, messages, *, response_format=None, **kwargs):
        if (response_format or {}).get("json_schema", {}).get("name") == "scene_edit":
            self.entered.set()
            await asyncio.to_thread(self.release.wait, 30)
        return await super().chat(messages, response_format=response_format, **kwargs)


@dataclass
class World:
    url: str
    app: Any
    A: httpx.Client
    B: httpx.Client
    models: dict[str, Any]

    def use(self, model: ScriptedModel) -> ScriptedModel:
        self.models["scripted"] = model
        return model


@contextmanager
def scene_server(data_dir, models: dict[str, Any]) -> Iterator[Any]:
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from mainspring.scenarios.scene3d.thread_state import SceneThreads

    def resolve(name: str, project_id: int | None = None) -> Any:
        if name not in models:  # what the server's resolver (api/agent_models.py) says
            raise JournalError(f"unknown model {name!r} for an agent", status=400)
        return models[name]

    app = create_app(Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir}/db.sqlite", require_auth=True),
                     engine=NoEngine(), agent_models=resolve, agent_tools={}, scene_dialogue=SceneThreads())
    try:
        with serve(app, None) as srv:
            yield srv
    finally:
        dispose_engines()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    from mainspring.billing.keys import create_key
    from mainspring.store.db import session

    models: dict[str, Any] = {}
    with scene_server(tmp_path_factory.mktemp("scene-threads"), models) as srv:
        with session(srv.app.state.economics.db) as db:
            a, b = create_key(db, "alpha"), create_key(db, "beta")
        A = httpx.Client(base_url=srv.url, timeout=120, headers={"Authorization": f"Bearer {a.secret}"})
        B = httpx.Client(base_url=srv.url, timeout=120, headers={"Authorization": f"Bearer {b.secret}"})
        yield World(srv.url, srv.app, A, B, models)
        A.close()
        B.close()


def error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def labels(thread: dict) -> list[tuple[str, int]]:
    return [(p["label"], p["turn"]) for p in thread["pinned"]]


def test_a_thread_is_opened_edited_and_read_back(world):
    model = world.use(ScriptedModel([FIRST, NUDGE]))
    thread = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    assert thread["id"].startswith("sth_") and thread["object"] == "scene.thread" and thread["model"] == "scripted"
    assert labels(thread) == [("on_floor(table)", 0), ("on_top_of(cup, table)", 0), ("visible_in_camera(cup)", 0),
                              ("no_overlap(*)", 0), ("no_floating(*)", 0)]
    assert thread["scene"] == written(0.8) and thread["max_rounds"] == 2
    assert [t["turn"] for t in thread["turns"]] == [0] and thread["turns"][0]["stop_reason"] == "passed"
    usage = thread["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0

    after = ok(world.A.post(f"/v1/scenes/threads/{thread['id']}/turns",
                            json={"text": "Move the cup a little, and keep it near the table.", "constraints": [NEAR]}))
    turn = after["turn"]
    assert turn["turn"] == 1 and turn["added"] == ["near(cup, table)"] and turn["edit_error"] is None
    assert turn["broken"] == [] and turn["failing"] == [] and turn["repaired"]
    assert after["scene"]["objects"][1]["position"] == [0.1, 0.8, 0.1]  # what the edit said, nothing else
    assert after["scene"]["objects"][0] == written(0.8)["objects"][0]
    assert labels(after) == labels(thread) + [("near(cup, table)", 1)]  # every agreement kept, the new one pinned
    assert after["usage"]["total_tokens"] > usage["total_tokens"] and after["updated_at"] >= thread["created_at"]
    # the turn continued the stored conversation: its prompt is the first call's plus what happened since
    assert model.calls[1]["messages"][:3] == model.calls[0]["messages"] + [{"role": "assistant", "content": FIRST}]

    again = ok(world.A.get(f"/v1/scenes/threads/{thread['id']}"))  # read back from the database
    assert again == {k: v for k, v in after.items() if k != "turn"}
    assert [t["turn"] for t in again["turns"]] == [0, 1] and again["turns"][1] == turn


def test_a_turn_that_breaks_an_agreement_is_reported_and_repaired(world):
    world.use(ScriptedModel([FIRST, TALLER, CUP_BACK_ON_TOP]))
    thread = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    after = ok(world.A.post(f"/v1/scenes/threads/{thread['id']}/turns", json={"text": "Make the table taller."}))
    turn = after["turn"]
    assert "on_top_of(cup, table)" in turn["broken"] and "no_overlap(*)" in turn["broken"]  # caught and reported
    assert turn["repaired"] and turn["failing"] == [] and turn["stop_reason"] == "passed"
    assert [r["kind"] for r in turn["rounds"]] == ["edit", "patch"] and turn["rounds"][1]["applied"]
    assert after["scene"]["objects"][0]["size"] == [1.2, 1.0, 0.8]  # the edit the user asked for stays
    assert after["scene"]["objects"][1]["position"][1] == 1.05  # and the cup is back on top
    assert labels(after) == labels(thread)
    assert ok(world.A.get(f"/v1/scenes/threads/{thread['id']}"))["turns"][1]["broken"] == turn["broken"]


def test_a_threads_model_calls_are_on_the_callers_ledger_and_budget(world):
    from sqlalchemy import select

    from mainspring.billing import budgets
    from mainspring.billing.keys import create_key
    from mainspring.store.db import session
    from mainspring.store.tables import LedgerEntry

    priced = "SmolLM2-135M-Instruct"  # on the built-in price sheet ("scripted" is not, so it is not metered)
    model = world.models[priced] = ScriptedModel([FIRST, NUDGE])
    db = world.app.state.economics.db
    with session(db) as s:
        key = create_key(s, "gamma")
    C = httpx.Client(base_url=world.url, timeout=120, headers={"Authorization": f"Bearer {key.secret}"})

    def rows() -> list[LedgerEntry]:
        with session(db, readonly=True) as s:
            return list(s.scalars(select(LedgerEntry).where(LedgerEntry.api_key_id == key.key.id)))

    thread = ok(C.post("/v1/scenes/threads", json={**OPEN, "model": priced}))
    opened = rows()
    assert len(opened) == len(model.calls) >= 1  # one ledger row per model call, under the caller's key
    assert {r.endpoint for r in opened} == {"/v1/scenes/threads"} and {r.model for r in opened} == {priced}
    assert sum(r.tokens_output for r in opened) == thread["usage"]["completion_tokens"]
    assert all(r.cost_total_u > 0 for r in opened)

    with session(db) as s:
        budgets.set_budget(s, "key", key.key.id, "total", sum(r.cost_total_u for r in opened))  # spent: nothing left
    err = error(C.post(f"/v1/scenes/threads/{thread['id']}/turns", json={"text": "Move the cup."}), 402)
    assert err["code"] == "budget_exceeded"
    assert len(model.calls) == len(opened) and len(rows()) == len(opened)  # refused before the model ran
    assert ok(C.get(f"/v1/scenes/threads/{thread['id']}")) == thread  # the stored thread is as it was
    C.close()


def test_threads_are_listed_newest_first_and_deleted(world):
    world.use(ScriptedModel([FIRST, FIRST]))
    first = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    second = ok(world.A.post("/v1/scenes/threads", json={**OPEN, "constraints": []}))
    listed = ok(world.A.get("/v1/scenes/threads"))
    assert listed["object"] == "list"
    ids = [t["id"] for t in listed["data"]]
    assert ids.index(second["id"]) < ids.index(first["id"])
    assert [t["id"] for t in ok(world.A.get("/v1/scenes/threads", params={"limit": 1}))["data"]] == [second["id"]]
    assert ok(world.A.delete(f"/v1/scenes/threads/{second['id']}")) == {
        "id": second["id"], "object": "scene.thread.deleted", "deleted": True}
    assert error(world.A.get(f"/v1/scenes/threads/{second['id']}"), 404)["code"] == "not_found"
    assert error(world.A.delete(f"/v1/scenes/threads/{second['id']}"), 404)["param"] == "thread_id"
    assert second["id"] not in [t["id"] for t in ok(world.A.get("/v1/scenes/threads"))["data"]]
    assert error(world.A.get("/v1/scenes/threads", params={"limit": 0}), 400)["param"] == "limit"


def test_another_projects_thread_is_not_found(world):
    world.use(ScriptedModel([FIRST]))
    mine = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    path = f"/v1/scenes/threads/{mine['id']}"
    for r in (world.B.get(path), world.B.post(f"{path}/turns", json={"text": "Take it."}), world.B.delete(path)):
        body = error(r, 404)
        assert body == {"message": f"Scene thread with id '{mine['id']}' not found.", "type": "invalid_request_error",
                        "param": "thread_id", "code": "not_found"}
    assert mine["id"] not in [t["id"] for t in ok(world.B.get("/v1/scenes/threads"))["data"]]
    assert ok(world.A.get(path)) == mine  # nothing of A's changed


@pytest.mark.parametrize("change, param", [
    ({"request": ""}, "request"),
    ({"request": "   "}, "request"),
    ({"objects": []}, "objects"),
    ({"objects": ["table", "table"]}, "objects"),
    ({"objects": ["Table", "cup"]}, "objects[0]"),
    ({"constraints": [{"type": "on_top_of", "a": "cup", "b": "shelf"}]}, "constraints[0]"),
    ({"constraints": [NEAR, {"type": "hovering", "a": "cup"}]}, "constraints[1]"),
    ({"max_rounds": 11}, "max_rounds"),
    ({"max_rounds": -1}, "max_rounds"),
    ({"max_rounds": "many"}, "max_rounds"),
    ({"token_budget": 0}, "token_budget"),
    ({"colour": "red"}, "colour"),
])
def test_bad_input_is_a_400_naming_the_field(world, change, param):
    world.use(ScriptedModel([]))  # no answers: a request that reached the model would fail as a 500
    body = error(world.A.post("/v1/scenes/threads", json={**OPEN, **change}), 400)
    assert body["param"] == param and body["type"] == "invalid_request_error", body


def test_a_nan_in_a_constraint_is_a_400(world):
    world.use(ScriptedModel([]))
    raw = json.dumps({**OPEN, "constraints": [{**NEAR, "max": float("nan")}]})  # NaN: Python's JSON parser reads it
    r = world.A.post("/v1/scenes/threads", content=raw, headers={"Content-Type": "application/json"})
    assert error(r, 400)["param"] == "constraints[0]"


def test_an_unknown_model_and_bad_turns(world):
    world.use(ScriptedModel([FIRST]))
    body = error(world.A.post("/v1/scenes/threads", json={**OPEN, "model": "no-such-model"}), 404)
    assert body["code"] == "model_not_found" and body["param"] == "model"  # as /v1/chat/completions answers
    thread = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    turns = f"/v1/scenes/threads/{thread['id']}/turns"
    assert error(world.A.post(turns, json={"text": ""}), 400)["param"] == "text"
    assert error(world.A.post(turns, json={"text": " \n"}), 400)["param"] == "text"
    lamp = {"type": "near", "a": "lamp", "b": "table", "max": 1.0}  # no lamp in this scene
    assert "lamp" in error(world.A.post(turns, json={"text": "Keep the lamp near.", "constraints": [lamp]}),
                           400)["message"]
    assert ok(world.A.get(f"/v1/scenes/threads/{thread['id']}")) == thread  # nothing of it changed


def test_a_stopped_engine_is_a_503_and_stores_no_thread(world, embedded):
    from mainspring.models import LocalModel
    from tests.engine_faults import stopped_engine

    engine = stopped_engine(embedded)
    try:
        world.models["stopped"] = LocalModel(engine)
        before = [t["id"] for t in ok(world.B.get("/v1/scenes/threads"))["data"]]
        body = error(world.B.post("/v1/scenes/threads", json={**OPEN, "model": "stopped"}), 503)
    finally:
        engine.close()
    assert body["code"] == "engine_stopped"
    assert [t["id"] for t in ok(world.B.get("/v1/scenes/threads"))["data"]] == before


def test_a_server_without_the_dialogue_serves_no_threads(tmp_path):
    """create_app without `scene_dialogue` (the scenario layer's, handed in by cli.py): a 404 saying so, not a 5xx."""
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    app = create_app(Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/db.sqlite"), engine=NoEngine(),
                     agent_models=lambda name, project=None: ScriptedModel([]), agent_tools={})
    try:
        with serve(app, None) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            assert error(http.post("/v1/scenes/threads", json=OPEN), 404)["code"] == "not_served"
            assert error(http.get("/v1/scenes/threads"), 404)["code"] == "not_served"
    finally:
        dispose_engines()


def _turn_in_background(client: httpx.Client, path: str, text: str) -> tuple[threading.Thread, list]:
    answer: list = []
    worker = threading.Thread(target=lambda: answer.append(client.post(path, json={"text": text})))
    worker.start()
    return worker, answer


def test_a_second_turn_while_one_runs_is_a_409_and_nothing_is_lost(world):
    model = world.use(GatedModel([FIRST, NUDGE]))
    thread = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    turns = f"/v1/scenes/threads/{thread['id']}/turns"
    worker, answer = _turn_in_background(world.A, turns, "Move the cup a little.")
    assert model.entered.wait(30)  # the first turn is with the model
    busy = error(world.A.post(turns, json={"text": "Make the table taller."}), 409)
    assert busy["code"] == "thread_busy" and busy["param"] == "thread_id"
    model.release.set()
    worker.join(60)
    first = ok(answer[0])
    assert first["turn"]["turn"] == 1 and len(model.answers) == 0  # the refused turn never reached the model
    assert [t["request"] for t in ok(world.A.get(f"/v1/scenes/threads/{thread['id']}"))["turns"]] == [
        CUP.request(), "Move the cup a little."]


def test_a_turn_saved_meanwhile_by_another_process_wins(world):
    """Another server on the same database saved a turn while this one ran: this turn is a 409, not written
    over it (the row's version moved on)."""
    from sqlalchemy import update

    from mainspring.store.db import session
    from mainspring.store.tables import SceneThreadRow

    model = world.use(GatedModel([FIRST, NUDGE]))
    thread = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    worker, answer = _turn_in_background(world.A, f"/v1/scenes/threads/{thread['id']}/turns", "Move the cup.")
    assert model.entered.wait(30)
    with session(world.app.state.economics.db) as s:  # what the other process's save does to the row
        s.execute(update(SceneThreadRow).where(SceneThreadRow.id == thread["id"])
                  .values(version=SceneThreadRow.version + 1))
    model.release.set()
    worker.join(60)
    assert error(answer[0], 409)["code"] == "thread_busy"
    stored = ok(world.A.get(f"/v1/scenes/threads/{thread['id']}"))
    assert stored["turns"] == thread["turns"] and stored["scene"] == thread["scene"]  # the other save stands


def test_a_thread_deleted_while_its_turn_runs_stays_deleted(world):
    model = world.use(GatedModel([FIRST, NUDGE]))
    thread = ok(world.A.post("/v1/scenes/threads", json=OPEN))
    worker, answer = _turn_in_background(world.A, f"/v1/scenes/threads/{thread['id']}/turns", "Move the cup.")
    assert model.entered.wait(30)
    ok(world.A.delete(f"/v1/scenes/threads/{thread['id']}"))
    model.release.set()
    worker.join(60)
    assert "deleted while this turn ran" in error(answer[0], 404)["message"]
    assert error(world.A.get(f"/v1/scenes/threads/{thread['id']}"), 404)["code"] == "not_found"
