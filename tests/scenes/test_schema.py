"""The exported JSON Schema agrees with the pydantic models, and both it and the decoding schema
compile in llguidance (what constrained decoding and forced tool calls run on)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from mainspring.engine.grammar import GrammarCompiler
from mainspring.scenes import decoding_schema, scene_json_schema, validate
from tests.scenes.helpers import accepts, box, doc, living_room, tiny_compiler

FULL = jsonschema.Draft202012Validator(scene_json_schema())


def schema_errors(validator, document) -> list[str]:
    return sorted(e.json_path for e in validator.iter_errors(document))


def test_the_exported_schema_is_draft_2020_12_and_accepts_the_living_room():
    schema = scene_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["title"] == "scene/0.1"
    assert schema_errors(FULL, living_room()) == []
    text = json.dumps(schema)
    assert '"title": "Box"' not in text and "discriminator" not in text and '{"type": "null"}' not in text


def test_object_properties_come_in_writing_order():
    box_def = scene_json_schema()["$defs"]["Box"]
    assert list(box_def["properties"])[:4] == ["id", "shape", "size", "position"]
    assert box_def["required"] == ["id", "shape", "size"]


@pytest.mark.parametrize("edit, path", [
    (lambda d: d["objects"][1]["size"].__setitem__(1, -0.05), "$.objects[1]"),
    (lambda d: d["objects"][2].pop("height"), "$.objects[2]"),
    (lambda d: d["objects"][6].update(rotation_quat=[0, 0, 0, 1]), "$.objects[6]"),
    (lambda d: d["objects"][3].update(colour="red"), "$.objects[3]"),
    (lambda d: d["objects"][1].update(shape="cube"), "$.objects[1]"),
    (lambda d: d["materials"]["red"].update(color=[1, 0, 0, 1]), "$.materials.red.color"),
    (lambda d: d["constraints"][0].update(tolerance=2), "$.constraints[0]"),
    (lambda d: d["camera"].pop("look_at"), "$.camera"),
])
def test_schema_and_models_reject_the_same_documents(edit, path):
    source = living_room()
    edit(source)
    assert validate(source), "the models accept it"
    errors = list(FULL.iter_errors(source))
    assert errors, "the schema accepts it"
    # an error inside a union (which shape, which constraint) is reported at the union's value
    assert any(e.json_path == path or e.json_path.startswith(path + ".") or e.json_path.startswith(path + "[")
               for e in errors), [e.json_path for e in errors]


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return tiny_compiler()


def compact(document) -> str:
    return json.dumps(document, separators=(",", ":"))


def test_llguidance_enforces_the_full_schema(compiler):
    ok = doc(box("crate", [0.5, 0.5, 0.5], [0, 0.25, 0], rotation_deg=[0, 30, 0]))
    assert accepts(compiler, scene_json_schema(), compact(ok))
    both = doc(box("crate", [0.5, 0.5, 0.5], [0, 0.25, 0], rotation_deg=[0, 30, 0], rotation_quat=[0, 0, 0, 1]))
    assert not accepts(compiler, scene_json_schema(), compact(both))  # one rotation form, in llguidance too
    negative = doc(box("crate", [0.5, -0.5, 0.5], [0, 0.25, 0]))
    assert not accepts(compiler, scene_json_schema(), compact(negative))


def test_the_decoding_schema_is_a_narrower_form_of_the_full_one(compiler):
    narrow = decoding_schema(["crate", "ball"])
    jsonschema.Draft202012Validator.check_schema(narrow)
    good = doc(box("crate", [0.5, 0.5, 0.5], [0, 0.25, 0], material={"color": [0.4, 0.3, 0.1]}),
               {"id": "ball", "shape": "sphere", "radius": 0.1, "position": [0, 0.6, 0]},
               constraints=[{"type": "on_top_of", "a": "ball", "b": "crate"}])
    assert accepts(compiler, narrow, compact(good))
    assert schema_errors(FULL, good) == [] and validate(good) == []
    wrong = {
        "other ids": doc(box("table", [1, 1, 1], [0, 0.5, 0]), box("ball", [1, 1, 1], [0, 0.5, 0])),
        "ids out of order": doc(box("ball", [1, 1, 1], [0, 0.5, 0]), box("crate", [1, 1, 1], [0, 0.5, 0])),
        "an extra object": doc(*good["objects"], box("extra", [1, 1, 1], [0, 0.5, 0])),
        "a material by name": {**good, "objects": [{**good["objects"][0], "material": "wood"}, good["objects"][1]]},
        "a quaternion": {**good, "objects": [{**good["objects"][0], "rotation_quat": [0, 0, 0, 1]},
                                             good["objects"][1]]},
        "a light": {**good, "lights": [{"id": "sun", "type": "directional", "intensity": 3}]},
        "a constraint on a stranger": {**good, "constraints": [{"type": "on_floor", "a": "table"}]},
    }
    for why, document in wrong.items():
        assert not accepts(compiler, narrow, compact(document)), why
    free = decoding_schema()
    assert accepts(compiler, free, compact(wrong["other ids"]))
    assert not accepts(compiler, free, compact(doc({"id": "m", "shape": "mesh", "asset": "assets/m.glb"})))
    # bounded lists, so a model cannot run on
    assert free["properties"]["objects"]["maxItems"] == 8 and free["properties"]["constraints"]["maxItems"] == 4


def test_the_decoding_schema_allows_no_whitespace(compiler):
    good = doc(box("crate", [0.5, 0.5, 0.5], [0, 0.25, 0]))
    assert accepts(compiler, decoding_schema(), compact(good))
    assert not accepts(compiler, decoding_schema(), json.dumps(good))  # ", " and ": " are spent tokens
    assert accepts(compiler, scene_json_schema(), json.dumps(good, indent=1))  # the full schema allows them
