"""The design dialogue on a scripted model: pinned constraints are re-checked after every turn,
an edit that breaks an earlier agreement is caught, reported and repaired, new and changed
constraints are pinned, and a bad edit leaves the scene as it was."""

from __future__ import annotations

import asyncio

from mainspring.scenarios.scene3d import load_briefs
from mainspring.scenarios.scene3d.dialogue import parse_constraints, start_thread, user_turn
from mainspring.scenes.patch import dumps
from tests.scenarios.scene3d.scripted import ScriptedModel
from tests.scenarios.scene3d.test_refine import patch, written

CUP = next(b for b in load_briefs() if b.id == "cup_on_table")
TALLER = dumps({"patch": [{"op": "replace", "path": "/objects/0/size/1", "value": 1.0},
                          {"op": "replace", "path": "/objects/0/position/1", "value": 0.5}], "constraints": []})
CUP_BACK_ON_TOP = patch(("/objects/1/position/1", 1.05))


def open_thread(model):
    return asyncio.run(start_thread(model, CUP.request(), CUP.objects, CUP.constraints))


def test_an_edit_breaking_a_pinned_constraint_is_caught_and_repaired():
    model = ScriptedModel([dumps(written(0.8)), TALLER, CUP_BACK_ON_TOP])
    thread = open_thread(model)
    assert [p.label for p in thread.pinned] == [
        "on_floor(table)", "on_top_of(cup, table)", "visible_in_camera(cup)", "no_overlap(*)", "no_floating(*)"]
    assert thread.turns[0].failing == [] and thread.turns[0].stop_reason == "passed"

    turn = asyncio.run(user_turn(model, thread, "Make the table taller."))
    assert "on_top_of(cup, table)" in turn.broken and "no_overlap(*)" in turn.broken  # caught and reported
    assert turn.repaired and turn.failing == [] and turn.stop_reason == "passed"
    assert [r.kind for r in turn.rounds] == ["edit", "patch"]
    assert thread.doc["objects"][0]["size"] == [1.2, 1.0, 0.8] and thread.doc["objects"][1]["position"][1] == 1.05
    told = model.calls[2]["messages"][-1]["content"]  # the repair request names the broken agreement
    assert "on_top_of(cup, table): gap = -0.25 m" in told and "cup is /objects/1" in told
    asked = model.calls[1]["messages"][-1]["content"]
    assert asked.startswith("Make the table taller.\nAgreed constraints: on_floor(table), on_top_of(cup, table)")
    assert model.calls[1]["response_format"]["json_schema"]["name"] == "scene_edit"
    assert model.calls[1]["messages"][:3] == model.calls[0]["messages"] + [
        {"role": "assistant", "content": dumps(written(0.8))}]  # the conversation only grows at its end


def test_a_break_the_model_does_not_repair_is_reported_not_accepted():
    idle = patch(("/objects/1/position/0", 0.25))
    model = ScriptedModel([dumps(written(0.8)), TALLER, idle, idle, idle])
    thread = open_thread(model)
    turn = asyncio.run(user_turn(model, thread, "Make the table taller."))
    assert not turn.repaired and turn.stop_reason == "max_rounds"
    assert "on_top_of(cup, table)" in turn.failing and "on_top_of(cup, table)" in turn.to_dict()["broken"]


def test_new_and_changed_constraints_are_pinned():
    looser = dumps({"patch": [{"op": "replace", "path": "/objects/1/position/0", "value": 0.1}],
                    "constraints": [{"type": "visible_in_camera", "a": "cup", "min_pixels": 10}]})
    model = ScriptedModel([dumps(written(0.8)), looser])
    thread = open_thread(model)
    near = parse_constraints([{"type": "near", "a": "cup", "b": "table", "max": 0.5}])[0]
    turn = asyncio.run(user_turn(model, thread, "Move the cup a little, it only needs to be seen.", near))
    assert turn.changed == ["visible_in_camera(cup)"] and turn.added == ["near(cup, table)"]
    assert turn.broken == [] and turn.failing == [] and turn.rounds[0].applied
    assert len(thread.pinned) == 6 and thread.pinned[2].constraint.min_pixels == 10 and thread.pinned[2].turn == 1
    assert thread.pinned[-1].turn == 1 and thread.to_dict()["pinned"][-1]["constraint"]["type"] == "near"


def test_a_bad_edit_leaves_the_scene_and_is_said():
    off = dumps({"patch": [{"op": "remove", "path": "/objects/1"}], "constraints": []})
    still = patch(("/objects/0/position/0", 0.0))
    model = ScriptedModel([dumps(written(0.8)), off, still, still, still])
    thread = open_thread(model)
    before = dumps(thread.doc)
    turn = asyncio.run(user_turn(model, thread, "Drop the cup."))
    # removing the cup is a valid edit; the agreements about it are what it breaks, and no
    # layout patch brings an object back: reported, not accepted
    assert "on_top_of(cup, table)" in turn.broken and not turn.repaired and turn.score.missing == ["cup"]
    bad, why = parse_constraints([{"type": "on_top_of", "a": "cup"}, "nonsense"])
    assert bad == [] and len(why) == 2
    model2 = ScriptedModel([dumps(written(0.8)), dumps({"patch": [{"op": "replace", "path": "/objects/0/size/0",
                                                                   "value": 0}], "constraints": []})])
    thread2 = open_thread(model2)
    turn2 = asyncio.run(user_turn(model2, thread2, "Make the table flat."))
    assert turn2.edit_error.startswith("the edit was not applied: it makes the scene invalid")
    assert dumps(thread2.doc) == before and turn2.failing == []


def test_a_model_constraint_contradicting_an_agreement_is_not_pinned_but_the_users_is():
    turned = dumps({"patch": [{"op": "replace", "path": "/objects/1/position/0", "value": 0.1}],
                    "constraints": [{"type": "on_top_of", "a": "table", "b": "cup"}]})
    second_edit = dumps({"patch": [{"op": "replace", "path": "/objects/1/position/0", "value": 0.15}],
                         "constraints": []})
    model = ScriptedModel([dumps(written(0.8)), turned, second_edit])
    thread = open_thread(model)
    turn = asyncio.run(user_turn(model, thread, "Move the cup a little."))
    assert turn.rejected == ["on_top_of(table, cup): contradicts on_top_of(cup, table), agreed in turn 0"]
    assert [p.label for p in thread.pinned].count("on_top_of(cup, table)") == 1 and turn.failing == []
    near, far = parse_constraints([{"type": "near", "a": "cup", "b": "table", "max": 0.5},
                                   {"type": "far", "a": "table", "b": "cup", "min": 2.0}])[0]
    thread.pin([near], 1)
    model.answers += [patch(("/objects/1/position/2", 0.12))] * 3  # repairs that do not reach 2 m
    turn2 = asyncio.run(user_turn(model, thread, "Now the cup goes far from the table.", [far]))
    assert turn2.changed == ["far(table, cup)"] and "near(cup, table)" not in [p.label for p in thread.pinned]
