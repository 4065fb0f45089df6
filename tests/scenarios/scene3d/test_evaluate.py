"""The evaluator scores any scene by the brief's constraints, not the scene's own."""

from __future__ import annotations

import copy

import pytest

from mainspring.scenarios.scene3d import evaluate, load_briefs

CUP = next(b for b in load_briefs() if b.id == "cup_on_table")


def test_a_broken_copy_loses_exactly_what_it_broke():
    scene = copy.deepcopy(CUP.reference)
    cup = next(o for o in scene["objects"] if o["id"] == "cup")
    cup["position"][1] += 0.2  # the cup floats 20 cm over the table
    score = evaluate(scene, CUP)
    failed = {r.type: r for r in score.results if not r.passed}
    assert set(failed) == {"on_top_of", "no_floating"}
    assert failed["on_top_of"].value == pytest.approx(0.2) and failed["no_floating"].value == pytest.approx(0.2)
    assert score.score == pytest.approx(3 / 5) and score.num_passed == 3


def test_the_scene_cannot_grade_itself():
    scene = copy.deepcopy(CUP.reference)
    scene["objects"] = [o for o in scene["objects"] if o["id"] != "cup"]
    scene["constraints"] = [{"type": "on_floor", "a": "table"}]  # an easy promise it keeps
    score = evaluate(scene, CUP)
    assert score.valid and score.missing == ["cup"]
    missing = [r for r in score.results if r.quantity == "missing"]
    assert [r.label for r in missing] == ["on_top_of(cup, table)", "visible_in_camera(cup)"]
    assert all(not r.passed and r.value is None and r.detail == "missing object(s): cup" for r in missing)
    assert score.score == pytest.approx(3 / 5)


def test_an_invalid_scene_scores_zero_with_its_violations():
    scene = copy.deepcopy(CUP.reference)
    scene["objects"][1]["size"] = [1.2, 0.75]
    score = evaluate(scene, CUP)
    assert not score.valid and score.score == 0.0 and score.results == []
    assert [v.path for v in score.violations] == ["$.objects[1].size"]
    assert evaluate("{", CUP).to_dict()["violations"][0]["path"] == "$"
