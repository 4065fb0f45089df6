"""The exported JSON Schema of `scene/0.1` (draft 2020-12), generated from the pydantic models so
the two cannot drift, and its decoding variant for constrained generation.

The generated schema is cleaned for two readers: people and tools that read plain JSON Schema
(no OpenAPI `discriminator`, no nulls, no auto titles) and llguidance, which generates properties
in schema order, so each object's `id` and `shape` come first and its shape parameters next.

`decoding_schema()` is the same schema narrowed for generation (fewer fields, short lists, inline
colours, compact JSON; optionally exactly a brief's object ids): every document it admits is
admitted by the full schema, and a small model finishes one within a few hundred tokens. Both
compile in llguidance, so the full schema can also constrain a tool call's arguments.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

from mainspring.scenes.model import OBJECT_KEY_ORDER, SCHEMA_VERSION, Scene

_OBJECT_DEFS = ("Box", "Sphere", "Cylinder", "Capsule", "Torus", "Plane", "MeshAsset")
# llguidance options: compact JSON, so the token budget goes to content, not indentation (an
# empty whitespace_pattern overrides the engine's default pattern, which allows newlines)
COMPACT_JSON = {"whitespace_flexible": False, "whitespace_pattern": "", "item_separator": ",", "key_separator": ":"}


def scene_json_schema() -> dict[str, Any]:
    """The scene/0.1 JSON Schema (a fresh copy: callers may modify it)."""
    return copy.deepcopy(_full_schema())


@lru_cache(maxsize=1)
def _full_schema() -> dict[str, Any]:
    raw = Scene.model_json_schema(by_alias=True, mode="validation")
    schema = _clean(raw)
    for name in _OBJECT_DEFS:
        d = schema["$defs"][name]
        d["properties"] = {k: d["properties"][k] for k in sorted(d["properties"], key=OBJECT_KEY_ORDER.index)}
        # one rotation form per object, said so that llguidance can compile it too (it has no `not`)
        d["anyOf"] = [{"properties": {"rotation_quat": False}}, {"properties": {"rotation_deg": False}}]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "urn:mainspring:scene:0.1",
            "title": SCHEMA_VERSION, **schema}


# what a generated scene may say: enough for layout, nothing a small model tends to fill with noise
# (every extra optional field is tokens it may spend, and numbers cost a token per digit)
_DECODED_OBJECT_FIELDS = ("id", "shape", "size", "radius", "height", "tube", "position", "rotation_deg", "material")
_DECODED_CAMERA_FIELDS = ("position", "look_at", "yfov_deg")
_DECODED_SCENE_FIELDS = ("schema", "room", "objects", "camera", "constraints")


def decoding_schema(object_ids: list[str] | None = None, max_objects: int = 8,
                    max_constraints: int = 4) -> dict[str, Any]:
    """The schema constrained decoding uses: the full schema narrowed so that a small model's
    output is short, bounded and consistent: compact JSON; objects with shape, placement and an
    inline colour (a material name could dangle); no mesh assets (a model cannot supply them),
    quaternions, lights (the preview adds a sun), camera optics beyond the field of view, or
    constraint tolerances.

    With `object_ids` (a brief's), the objects are exactly those, in that order, and constraints
    can name only them: ids are unique and every reference resolves by construction."""
    schema = scene_json_schema()
    defs, props = schema["$defs"], schema["properties"]
    del defs["MeshAsset"], defs["Light"]
    shapes = [name for name in _OBJECT_DEFS if name in defs]
    for name in shapes:
        d = defs[name]
        d.pop("anyOf")  # only quaternions could break the one-rotation rule, and they are gone
        d["properties"] = {k: v for k, v in d["properties"].items() if k in _DECODED_OBJECT_FIELDS}
        d["properties"]["material"] = {"type": "object",
                                       "properties": {"color": defs["Material"]["properties"]["color"]},
                                       "required": ["color"], "additionalProperties": False}
    cam = defs["Camera"]
    cam["properties"] = {k: v for k, v in cam["properties"].items() if k in _DECODED_CAMERA_FIELDS}
    schema["properties"] = props = {k: v for k, v in props.items() if k in _DECODED_SCENE_FIELDS}
    del defs["Material"]
    props["objects"]["maxItems"] = max_objects
    props["objects"]["items"] = {"anyOf": [{"$ref": f"#/$defs/{name}"} for name in shapes]}
    props["constraints"]["maxItems"] = max_constraints
    for d in defs.values():
        # a writer does not set the checker's leniency: its constraints use the 1 cm default
        d.get("properties", {}).pop("tolerance", None)
    if object_ids:
        ids = list(dict.fromkeys(object_ids))
        props["objects"].update(minItems=len(ids), maxItems=len(ids), items=False, prefixItems=[
            {"anyOf": [_with_id(defs[name], oid) for name in shapes]} for oid in ids])
        for d in defs.values():
            for key in ("a", "b"):
                if key in d.get("properties", {}):
                    d["properties"][key] = {"enum": ids}
            if "ids" in d.get("properties", {}):
                d["properties"]["ids"] = {"anyOf": [{"const": "*"}, {"type": "array", "items": {"enum": ids},
                                                                      "minItems": 1, "maxItems": len(ids)}]}
    schema["x-guidance"] = dict(COMPACT_JSON)
    return schema


def _with_id(definition: dict, object_id: str) -> dict:
    out = copy.deepcopy(definition)
    out["properties"]["id"] = {"const": object_id}
    return out


def _clean(node: Any) -> Any:
    """Pydantic's schema, minus what plain JSON Schema readers do not need or misread."""
    if isinstance(node, list):
        return [_clean(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title" and not isinstance(value, dict):
            continue  # pydantic's auto titles (a dict here would be a property named "title")
        if key == "discriminator":
            continue  # OpenAPI, not JSON Schema; each member's `shape`/`type` const says the same
        if key == "default" and value is None:
            continue
        out[key] = _clean(value)
    if "oneOf" in out:  # the shapes exclude each other by their `shape` const already
        out["anyOf"] = out.pop("oneOf")
    if "anyOf" in out:
        options = [o for o in out["anyOf"] if o != {"type": "null"}]
        if len(options) == 1:
            del out["anyOf"]
            out.update(options[0])
        else:
            out["anyOf"] = options
    return out
