"""The checker's verified repairs: each suggested patch makes its constraint pass and breaks
nothing that passed (measured again here, not taken on trust); a move that would break an
agreement gives way to one that does not; repairs chain into one patch; none for an invalid
scene; the loop quotes them, and leaves them out when told to."""

from __future__ import annotations

import asyncio
import copy
import random

import pytest

from mainspring.scenarios.scene3d import load_briefs
from mainspring.scenarios.scene3d.dialogue import parse_constraints
from mainspring.scenarios.scene3d.refine import RefineConfig, Target, refine
from mainspring.scenarios.scene3d.repair import combine_repairs, repair_violations, suggest_repairs
from mainspring.scenes.patch import apply_patch, dumps
from tests.scenarios.scene3d.scripted import ScriptedModel

BRIEFS = load_briefs()


def jolted(brief, seed: int) -> dict:
    """The brief's reference scene with each of its objects moved up to 0.4 m on every axis."""
    rng = random.Random(seed)
    doc = copy.deepcopy(brief.reference)
    for obj in doc["objects"]:
        if "position" in obj and obj["id"] in brief.objects:
            obj["position"] = [round(v + rng.uniform(-0.4, 0.4), 3) for v in obj["position"]]
    return doc


def target(objects: list[str], *constraints: dict) -> Target:
    parsed, bad = parse_constraints(list(constraints))
    assert bad == []
    return Target("t", objects, parsed)


def test_every_suggested_repair_fixes_its_constraint_and_keeps_what_passed():
    failed = repaired = 0
    for brief in BRIEFS:
        t = Target.of(brief)
        doc = jolted(brief, seed=len(brief.id))
        score = t.score(doc)
        assert score.valid
        was = {r.index for r in score.results if r.passed}
        repairs = suggest_repairs(doc, score, t)
        failed += len(score.results) - len(was)
        repaired += len(repairs)
        for index, repair in repairs.items():
            assert index not in was and repair.label == score.results[index].label
            after = t.score(apply_patch(doc, repair.ops))
            assert after.valid and after.results[index].passed, (brief.id, repair)
            assert all(after.results[i].passed for i in was), (brief.id, repair)
    assert failed > 40
    assert repaired / failed > 0.6  # most failures of a jolted scene have a measured fix


def scene(*objects: dict) -> dict:
    return {"schema": "scene/0.1", "objects": list(objects), "camera": {"position": [0, 2, 5], "look_at": [0, 0.5, 0]}}


SHELF = {"id": "shelf", "shape": "box", "size": [0.6, 0.1, 0.6], "position": [-1.0, 0.05, 0]}
CRATE = {"id": "crate", "shape": "box", "size": [0.6, 0.6, 0.6], "position": [-0.9, 0.3, 1.5]}


def test_a_move_that_would_break_an_agreement_gives_way_to_moving_the_other_object():
    ball = {"id": "ball", "shape": "sphere", "radius": 0.1, "position": [-1.0, 0.2, 0]}
    doc = scene(SHELF, ball, CRATE)
    t = target(["shelf", "ball", "crate"], {"type": "on_top_of", "a": "ball", "b": "shelf"},
               {"type": "left_of", "a": "ball", "b": "crate", "min": 0.5})
    score = t.score(doc)
    assert [r.passed for r in score.results] == [True, False]
    (repair,) = suggest_repairs(doc, score, t).values()
    # moving the ball left would take it off the shelf: the crate goes right instead
    assert [op["path"] for op in repair.ops] == ["/objects/2/position/0"]
    assert repair.ops[0]["value"] > CRATE["position"][0]
    after = t.score(apply_patch(doc, repair.ops))
    assert all(r.passed for r in after.results)


def test_facing_is_repaired_by_turning_the_object():
    chair = {"id": "chair", "shape": "box", "size": [0.5, 0.8, 0.5], "position": [0, 0.4, 0]}
    tv = {"id": "tv", "shape": "box", "size": [1.0, 0.6, 0.1], "position": [2.0, 0.3, 0]}
    doc = scene(chair, tv)
    t = target(["chair", "tv"], {"type": "facing", "a": "chair", "b": "tv"})
    (repair,) = suggest_repairs(doc, t.score(doc), t).values()
    assert repair.ops == [{"op": "add", "path": "/objects/0/rotation_deg", "value": [0, 90.0, 0]}]
    assert t.score(apply_patch(doc, repair.ops)).results[0].passed


def test_repairs_chain_into_one_patch_on_the_scene_each_step_leaves():
    brief = next(b for b in BRIEFS if b.id == "shelf_with_boxes")
    doc = copy.deepcopy(brief.reference)
    shelf = next(i for i, o in enumerate(doc["objects"]) if o["id"] == "shelf")
    doc["objects"][shelf]["position"][1] += 0.3  # the shelf floats off its posts, the boxes sink into it
    t = Target.of(brief)
    score = t.score(doc)
    ops, fixed = combine_repairs(doc, score, t)
    assert len(fixed) >= 3 and ops
    after = t.score(apply_patch(doc, ops))
    assert all(after.results[i].passed for i in fixed)
    assert after.num_passed == score.num_passed + len(fixed)


def test_nothing_is_suggested_for_an_invalid_scene():
    doc = scene({"id": "a", "shape": "box", "size": [1, 1, 1], "position": [0, 0.5, 0]},
                {"id": "a", "shape": "box", "size": [1, 1, 1], "position": [0, 2, 0]})  # a duplicate id
    t = target(["a"], {"type": "on_floor", "a": "a"})
    score = t.score(doc)
    assert not score.valid
    assert suggest_repairs(doc, score, t) == {}


CUP = next(b for b in BRIEFS if b.id == "cup_on_table")


def floating_cup() -> dict:
    return {"schema": "scene/0.1", "objects": [
        {"id": "table", "shape": "box", "size": [1.2, 0.75, 0.8], "position": [0, 0.375, 0]},
        {"id": "cup", "shape": "cylinder", "radius": 0.04, "height": 0.1, "position": [0.2, 1.0, 0.1]}],
        "camera": {"position": [1.8, 1.6, 2.2], "look_at": [0, 0.6, 0]}}


@pytest.mark.parametrize("hints", [True, False])
def test_the_loop_quotes_the_verified_patch_unless_told_not_to(hints):
    fix = dumps({"patch": [{"op": "replace", "path": "/objects/1/position/1", "value": 0.8}]})
    model = ScriptedModel([dumps(floating_cup()), fix])
    result = asyncio.run(refine(model, CUP, RefineConfig(repair_hints=hints)))
    assert result.passed
    feedback = model.calls[1]["messages"][-1]["content"]
    quoted = f"The checker verified that this patch fixes it: {fix}"
    assert (quoted in feedback) is hints
    assert "on_top_of(cup, table): gap = 0.2 m" in feedback  # the measurement is there either way


SNOWMAN = next(b for b in BRIEFS if b.id == "snowman")


def blind_scene(brief) -> dict:
    """What the embedded model wrote for several briefs: every object at one point, and the camera
    at that point too, looking at itself (invalid), with a constraint relating an object to itself."""
    objects = [{"id": oid, "shape": "box", "size": [0.6, 0.6, 0.6], "position": [0.3, 0.3, 0.3]}
               for oid in brief.objects]
    return {"schema": "scene/0.1", "objects": objects,
            "camera": {"position": [0.3, 0.3, 0.3], "look_at": [0.3, 0.3, 0.3]},
            "constraints": [{"type": "on_top_of", "a": brief.objects[0], "b": brief.objects[0]}]}


def test_an_invalid_scene_gets_the_patch_that_makes_it_valid():
    doc = blind_scene(SNOWMAN)
    t = Target.of(SNOWMAN)
    score = t.score(doc)
    assert not score.valid and [v.path for v in score.violations] == ["$.camera"]
    ops = repair_violations(doc, score, t)  # validation names the self-relation only once the camera is fixed
    assert {"op": "remove", "path": "/constraints/0"} in ops
    assert {op["path"] for op in ops} >= {"/camera/position", "/camera/look_at"}
    assert t.score(apply_patch(doc, ops)).valid


def test_the_loop_quotes_the_validity_patch_and_the_patch_format_allows_it():
    doc = blind_scene(SNOWMAN)
    t = Target.of(SNOWMAN)
    ops = repair_violations(doc, t.score(doc), t)
    model = ScriptedModel([dumps(doc), dumps({"patch": ops})])  # the script checks the answer against the format
    result = asyncio.run(refine(model, SNOWMAN, RefineConfig(max_rounds=1)))
    feedback = model.calls[1]["messages"][-1]["content"]
    assert f"The checker verified that this patch makes it valid: {dumps({'patch': ops})}" in feedback
    assert result.rounds[1].applied and result.final.valid
