"""Validation: every problem reported with the JSON path of the value at fault and its reason."""

from __future__ import annotations

import json
import math

import pytest

from mainspring.scenes import SceneInvalid, load_scene, validate
from tests.scenes.helpers import box, doc, living_room, sphere


def problems(document) -> list[tuple[str, str]]:
    return [(v.path, v.message) for v in validate(document)]


def test_the_living_room_is_valid_and_keeps_what_was_written():
    source = living_room()
    assert validate(source) == []
    scene = load_scene(source)
    assert len(scene.objects) == 16 and scene.object("cup_handle").parent == "cup"
    assert scene.to_doc() == source  # nothing added (defaults stay implicit), nothing lost


@pytest.mark.parametrize("edit, path, reason", [
    (lambda d: d["objects"][1]["size"].__setitem__(1, -0.05), "$.objects[1].size[1]", "greater than or equal to 0.001"),
    (lambda d: d["objects"][2].pop("height"), "$.objects[2].height", "required field is missing"),
    (lambda d: d["objects"][1].update(shape="cube"), "$.objects[1].shape", "unknown shape 'cube'"),
    (lambda d: d["objects"][1].pop("shape"), "$.objects[1].shape", "missing 'shape'"),
    (lambda d: d["objects"][6].update(rotation_quat=[0, 0, 0, 1]),
     "$.objects[6]", "rotation_deg or rotation_quat, not both"),
    (lambda d: d["objects"][6].update(rotation_deg=None), "$.objects[6].rotation_deg", "null is not allowed"),
    (lambda d: d["objects"][3].update(colour="red"), "$.objects[3].colour", "unknown field"),
    (lambda d: d["objects"][0].update(id="Floor"), "$.objects[0].id", "should match pattern"),
    (lambda d: d["objects"][7]["position"].__setitem__(0, "0.2"), "$.objects[7].position[0]", "valid number"),
    (lambda d: d["objects"][7]["position"].__setitem__(2, math.nan), "$.objects[7].position[2]", "finite number"),
    (lambda d: d["objects"][10].update(radius=5000), "$.objects[10].radius", "less than or equal to 1000"),
    (lambda d: d["materials"]["red"]["color"].__setitem__(0, 255),
     "$.materials.red.color[0]", "less than or equal to 1"),
    (lambda d: d["objects"][8].update(tube=0.05), "$.objects[8]", "tube 0.05 must be smaller than its radius 0.03"),
    (lambda d: d["objects"][15].update(height=0.15),
     "$.objects[15]", "capsule height 0.15 must exceed twice its radius"),
    (lambda d: d["objects"][6].pop("rotation_deg") and d["objects"][6].update(rotation_quat=[0, 0.3, 0, 0.9]),
     "$.objects[6]", "unit quaternion, its length is 0.9487"),
    (lambda d: d["camera"].update(look_at=d["camera"]["position"]), "$.camera", "position and look_at must differ"),
    (lambda d: d["camera"].update(znear=10, zfar=5), "$.camera", "znear 10 must be smaller than zfar 5"),
    (lambda d: d["camera"].update(yfov_deg=180), "$.camera.yfov_deg", "less than 180"),
    (lambda d: d["lights"][0].update(target=d["lights"][0]["position"]),
     "$.lights[0]", "position and target must differ"),
    (lambda d: d["room"].update(max=[3, -1, 3]), "$.room", "room max y (-1) must exceed min y (0)"),
    (lambda d: d["constraints"].append({"type": "touching", "a": "cup"}),
     "$.constraints[8].type", "unknown type 'touching'"),
    (lambda d: d["constraints"][0].pop("b"), "$.constraints[0].b", "required field is missing"),
    (lambda d: d["constraints"][0].update(tolerance=2), "$.constraints[0].tolerance", "less than or equal to 0.5"),
    (lambda d: d.update(schema="scene/0.2"), "$.schema", "'scene/0.1'"),
    (lambda d: d.pop("camera"), "$.camera", "required field is missing"),
])
def test_value_errors_name_their_path(edit, path, reason):
    source = living_room()
    edit(source)
    found = problems(source)
    assert len(found) == 1, found
    assert found[0][0] == path
    assert reason in found[0][1]


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["objects"][9].update(id="book"),
     [("$.objects[9].id", "duplicate id 'book' (first used at $.objects[6].id)")]),
    (lambda d: d["lights"][1].update(id="cup"),
     [("$.lights[1].id", "duplicate id 'cup' (first used at $.objects[7].id)")]),
    (lambda d: d["objects"][8].update(parent="mug"), [("$.objects[8].parent", "no object has id 'mug'")]),
    (lambda d: d["objects"][9].update(material="crystal"),
     [("$.objects[9].material", "no material named 'crystal' in $.materials")]),
    (lambda d: d["constraints"][1].update(b="desk"), [("$.constraints[1].b", "no object has id 'desk'")]),
    (lambda d: d["constraints"][1].update(b="cup"), [("$.constraints[1].b", "relates 'cup' to itself")]),
    (lambda d: d["constraints"][4].update(ids=["cup", "plate"]),
     [("$.constraints[4].ids[1]", "no object has id 'plate'")]),
    (lambda d: d.pop("room") and d["constraints"].append({"type": "inside_room", "a": "ball"}),
     [("$.constraints[8]", "inside_room needs a $.room")]),
    (lambda d: d["objects"][7].update(parent="cup_handle"),  # cup -> cup_handle -> cup
     [("$.objects[7].parent", "parent cycle: cup -> cup_handle -> cup")]),
])
def test_document_errors_name_their_path(edit, expected):
    source = living_room()
    edit(source)
    assert problems(source) == expected


def test_a_three_object_cycle_is_reported_once_and_a_self_parent_too():
    a = box("a", [1, 1, 1], [0, 0.5, 0], parent="c")
    b = box("b", [1, 1, 1], [0, 0.5, 0], parent="a")
    c = box("c", [1, 1, 1], [0, 0.5, 0], parent="b")
    d = box("d", [1, 1, 1], [0, 0.5, 0], parent="d")
    assert problems(doc(a, b, c, d)) == [("$.objects[0].parent", "parent cycle: a -> c -> b -> a"),
                                         ("$.objects[3].parent", "parent cycle: d -> d")]


def test_every_problem_is_reported_not_just_the_first():
    source = doc(box("a", [1, 0, 1], [0, 0, 0]), sphere("b", -1, [0, 0, 0]),
                 {"id": "c", "shape": "cylinder", "radius": 1})
    assert [p for p, _ in problems(source)] == ["$.objects[0].size[1]", "$.objects[1].radius", "$.objects[2].height"]


def test_unreadable_input_is_one_violation_at_the_root():
    assert problems('{"schema": "scene/0.1", "objects": [}') == [
        ("$", "not valid JSON: Expecting value at line 1 column 37")]
    assert problems("[1, 2]") == [("$", "a scene is a JSON object, got list")]
    assert problems(json.dumps(living_room()).encode()) == []  # bytes are read as JSON text


def test_load_scene_raises_with_every_violation_listed():
    source = living_room()
    source["objects"][1]["size"] = [1, 1]
    source["objects"][7]["radius"] = 0
    with pytest.raises(SceneInvalid) as info:
        load_scene(source)
    assert [v.path for v in info.value.violations] == ["$.objects[1].size", "$.objects[7].radius"]
    assert "invalid scene (2 problems):\n  $.objects[1].size: List should have at least 3 items" in str(info.value)


def test_mesh_assets_are_checked_against_the_scene_folder(tmp_path):
    source = doc({"id": "statue", "shape": "mesh", "asset": "assets/statue.glb"})
    assert validate(source) == []  # no folder given: the path's form is all that can be checked
    assert problems({**source}) == []
    found = validate(source, base_dir=tmp_path)
    assert [(v.path, v.message) for v in found] == [
        ("$.objects[0].asset", f"asset file not found: {tmp_path / 'assets/statue.glb'}")]
    bad_path = doc({"id": "statue", "shape": "mesh", "asset": "../secret.glb"})
    assert problems(bad_path)[0][0] == "$.objects[0].asset"
