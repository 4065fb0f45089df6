"""JSON Patch revisions: untouched objects keep their bytes, a bad patch is one clear error and
changes nothing, and the decoding schema admits exactly the operations the document can take."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from mainspring.scenes import validate
from mainspring.scenes.patch import PatchError, apply_patch, diff, dumps, parse_patch, patch_schema
from tests.scenes.helpers import accepts, living_room, tiny_compiler


@pytest.fixture(scope="module")
def compiler():
    return tiny_compiler()


def test_untouched_objects_stay_byte_identical():
    room = living_room()
    target = 3
    patch = [{"op": "replace", "path": f"/objects/{target}/position/1", "value": 1.25},
             {"op": "add", "path": f"/objects/{target}/rotation_deg", "value": [0, 90, 0]}]
    revised = apply_patch(room, patch)
    before, after = dumps(room), dumps(revised)
    for i, obj in enumerate(room["objects"]):
        if i != target:
            assert dumps(revised["objects"][i]) == dumps(obj)
            assert dumps(obj) in after  # the very bytes, where the model read them before
    assert dumps(revised["camera"]) == dumps(room["camera"]) and revised["lights"] == room["lights"]
    changed = revised["objects"][target]
    assert changed["position"][1] == 1.25 and changed["rotation_deg"] == [0, 90, 0]
    assert list(changed)[:len(room["objects"][target])] == list(room["objects"][target])  # key order kept
    assert before == dumps(living_room()), "the input document is not modified"
    assert sorted(diff(room, revised), key=lambda op: op["path"]) == patch  # exactly what was asked
    assert validate(revised) == []


@pytest.mark.parametrize("patch, says", [
    ([{"op": "replace", "path": "/objects/99/position", "value": [0, 0, 0]}], "operation 0"),
    ([{"op": "replace", "path": "/objects/0/size/0", "value": 2},
      {"op": "remove", "path": "/objects/0/nothing"}], "operation 1"),
    ([{"op": "jump", "path": "/camera"}], "operation 0"),
    ([{"op": "replace", "value": 1}], "operation 0"),
    ([{"op": "test", "path": "/schema", "value": "scene/9"}], "operation 0"),
    ([{"op": "move", "from": "/objects/0", "path": "/objects/0/x"}], "operation 0"),
    ([], "no operations"),
    ({"ops": []}, "list of operations"),
    ("[{\"op\": ", "not JSON"),
])
def test_a_bad_patch_is_one_clear_error_and_changes_nothing(patch, says):
    room = living_room()
    with pytest.raises(PatchError) as info:
        apply_patch(room, patch)
    assert says in str(info.value)
    assert room == living_room()


def test_patch_text_forms():
    op = {"op": "replace", "path": "/camera/yfov_deg", "value": 40}
    assert parse_patch(json.dumps([op])) == parse_patch({"patch": [op]}) == parse_patch(json.dumps({"patch": [op]}))
    assert apply_patch(living_room(), json.dumps({"patch": [op]}))["camera"]["yfov_deg"] == 40


def test_the_patch_schema_admits_what_the_document_can_take(compiler):
    room = living_room()
    schema = patch_schema(room)
    jsonschema.Draft202012Validator.check_schema(schema)
    check = jsonschema.Draft202012Validator(schema)
    sofa = next(i for i, o in enumerate(room["objects"]) if "size" in o and "position" in o)
    good = {"patch": [{"op": "replace", "path": f"/objects/{sofa}/position", "value": [0.5, 0.4, -1]},
                      {"op": "replace", "path": f"/objects/{sofa}/size/2", "value": 0.9},
                      {"op": "replace", "path": "/camera/look_at", "value": [0, 0.5, 0]}]}
    assert list(check.iter_errors(good)) == []
    assert accepts(compiler, schema, dumps(good))
    apply_patch(room, good)  # whatever the schema admits applies
    for bad in ([{"op": "replace", "path": "/objects/99/position", "value": [0, 0, 0]}],  # no such object
                [{"op": "replace", "path": f"/objects/{sofa}/position", "value": [0, 0]}],  # wrong length
                [{"op": "replace", "path": f"/objects/{sofa}/position/1", "value": [0, 0, 0]}],  # a number there
                [{"op": "remove", "path": f"/objects/{sofa}"}],  # not in a layout revision
                []):
        assert list(check.iter_errors({"patch": bad})), bad
        assert not accepts(compiler, schema, dumps({"patch": bad})), bad
    assert not accepts(compiler, schema, json.dumps(good))  # compact JSON only: whitespace is spent tokens


def test_a_structural_patch_schema_adds_and_removes_objects(compiler):
    room = copy.deepcopy(living_room())
    lamp = {"id": "lamp", "shape": "sphere", "radius": 0.1, "position": [0, 2, 0]}
    schema = patch_schema(room, structural=True)
    ok = {"patch": [{"op": "add", "path": "/objects/-", "value": lamp}, {"op": "remove", "path": "/objects/1"}]}
    assert accepts(compiler, schema, dumps(ok))
    revised = apply_patch(room, ok)
    assert revised["objects"][-1] == lamp and len(revised["objects"]) == len(room["objects"])


def test_the_patch_schema_narrows_to_named_objects_in_order():
    room = living_room()
    ids = [o["id"] for o in room["objects"]]
    chosen = [ids[3], ids[1]]
    schema = patch_schema(room, objects=chosen, camera=False, rotations=False)
    paths = [p for branch in schema["properties"]["patch"]["items"]["anyOf"] for p in branch["properties"]["path"]
             .get("enum", [])]
    assert paths and {p.split("/")[2] for p in paths} == {"3", "1"}
    assert paths[0].startswith("/objects/3/")  # the first named comes first
    assert not any(p.startswith("/camera") for p in paths)
    assert {branch["properties"]["op"]["const"] for branch in schema["properties"]["patch"]["items"]["anyOf"]} == {
        "replace"}  # no rotation to add
    with pytest.raises(PatchError, match="nothing a patch could change"):
        patch_schema(room, objects=["nobody"], camera=False)
