"""`scene`: write a small scene/0.1 document (mainspring/scenes) from a one-line brief.

A brief names 1-2 objects by id, each with a shape and a colour, and for two objects where one
lies relative to the other ("ball is above box": larger centre y; "left of": smaller centre x,
world axes). The system message shows one minimal valid document, so a small model knows the
keys; it gets partial credit long before it writes valid scenes.

Score parts, each in [0, 1]:
- `parses`: the reply contains a JSON object;
- `keys`: the fraction of the required top-level keys (schema, objects, camera) present;
- `valid`: 1 if `scenes.validate` finds no violation; otherwise half the fraction of the
  document's objects with no violation of their own;
- `brief`: the fraction of the brief's checks met, read off the document even when invalid: each
  object present with its shape, its colour (the nearest of the brief's palette), the relation.
total = 0.1 parses + 0.15 keys + 0.35 valid x present + 0.4 brief, where `present` is the fraction
of the brief's ids among the document's objects: a copy of the system message's example is valid
but earns only the 0.25 of a parsing document with the right keys.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from mainspring import scenes
from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.domains.extract import first_json_object
from mainspring.train.domains.generated import Item, generated_splits

NAME = "scene"
N_TRAIN, N_EVAL = 256, 64
REQUIRED_KEYS = ("schema", "objects", "camera")
_OBJECT_PATH = re.compile(r"^\$\.objects\[(\d+)\]")
COLOURS: dict[str, list[float]] = {
    "red": [1.0, 0.0, 0.0], "green": [0.0, 0.8, 0.0], "blue": [0.0, 0.0, 1.0], "yellow": [1.0, 1.0, 0.0],
    "white": [1.0, 1.0, 1.0], "black": [0.0, 0.0, 0.0], "orange": [1.0, 0.5, 0.0],
}
_THINGS = (("ball", "sphere"), ("box", "box"), ("crate", "box"), ("cone", "cone"), ("can", "cylinder"),
           ("pillar", "cylinder"), ("ring", "torus"), ("marble", "sphere"), ("block", "box"), ("post", "cylinder"))
EXAMPLE = {"schema": "scene/0.1",
           "objects": [{"id": "cube", "shape": "box", "size": [1, 1, 1], "position": [0, 0.5, 0],
                        "material": {"color": [0.5, 0.5, 0.5]}}],
           "camera": {"position": [0, 2, 5], "look_at": [0, 0, 0]}}
SYSTEM = ("You write 3D scenes as scene/0.1 JSON. Shapes: box (size), sphere (radius), cylinder and cone "
          "(radius, height), torus (radius, tube). Colours are RGB from 0 to 1. Example:\n"
          + json.dumps(EXAMPLE, separators=(",", ":")))


def make(rng: random.Random) -> Item:
    picked = rng.sample(_THINGS, 1 if rng.random() < 0.6 else 2)  # two objects barely fit max_tokens
    objects = [{"id": noun, "shape": shape, "colour": rng.choice(list(COLOURS))} for noun, shape in picked]
    parts = [f'{"an" if o["colour"][0] in "aeiou" else "a"} {o["colour"]} {o["shape"]} with id "{o["id"]}"'
             for o in objects]
    relation = None
    text = f"Write a scene with {' and '.join(parts)}."
    if len(objects) == 2:
        a, b = objects[0]["id"], objects[1]["id"]
        relation = {"a": a, "b": b, "kind": rng.choice(("above", "left_of"))}
        text += f" The {a} is {'above' if relation['kind'] == 'above' else 'to the left of'} the {b}."
    return f"{text} Reply with only the JSON.", {"objects": objects, "relation": relation}


def _colour(doc: dict[str, Any], obj: dict[str, Any]) -> list | None:
    material = obj.get("material")
    if isinstance(material, str) and isinstance(doc.get("materials"), dict):
        material = doc["materials"].get(material)
    color = material.get("color") if isinstance(material, dict) else None
    ok = isinstance(color, list) and len(color) == 3 and all(isinstance(c, (int, float)) for c in color)
    return color if ok else None


def _nearest(color: list) -> str:
    return min(COLOURS, key=lambda n: sum((a - b) ** 2 for a, b in zip(color, COLOURS[n])))


def _position(obj: dict[str, Any] | None, axis: int) -> float | None:
    pos = obj.get("position", [0, 0, 0]) if isinstance(obj, dict) else None
    if isinstance(pos, list) and len(pos) == 3 and isinstance(pos[axis], (int, float)):
        return float(pos[axis])
    return None


def brief_checks(doc: dict[str, Any], ref: dict[str, Any]) -> list[bool]:
    """One verdict per check of the brief: shape and colour of each object, then the relation."""
    found = doc.get("objects")
    by_id = {o.get("id"): o for o in found if isinstance(o, dict)} if isinstance(found, list) else {}
    checks = []
    for want in ref["objects"]:
        got = by_id.get(want["id"])
        checks.append(isinstance(got, dict) and got.get("shape") == want["shape"])
        color = _colour(doc, got) if isinstance(got, dict) else None
        checks.append(color is not None and _nearest(color) == want["colour"])
    rel = ref.get("relation")
    if rel:
        axis = 1 if rel["kind"] == "above" else 0
        pa, pb = _position(by_id.get(rel["a"]), axis), _position(by_id.get(rel["b"]), axis)
        ok = pa is not None and pb is not None and (pa > pb if rel["kind"] == "above" else pa < pb)
        checks.append(ok)
    return checks


def _present(doc: dict[str, Any], ref: dict[str, Any]) -> float:
    found = doc.get("objects")
    ids = {o.get("id") for o in found if isinstance(o, dict)} if isinstance(found, list) else set()
    return sum(o["id"] in ids for o in ref["objects"]) / len(ref["objects"])


def _validity(doc: dict[str, Any]) -> float:
    violations = scenes.validate(doc)
    if not violations:
        return 1.0
    objects = doc.get("objects")
    if not isinstance(objects, list) or not objects:
        return 0.0
    bad = {int(m.group(1)) for v in violations if (m := _OBJECT_PATH.match(v.path))}
    return 0.5 * (len(objects) - len(bad)) / len(objects)


class SceneScorer:
    def score(self, sample: Sample, completion: str) -> Score:
        doc = first_json_object(completion)
        if doc is None:
            return Score(0.0, {"parses": 0.0, "keys": 0.0, "valid": 0.0, "brief": 0.0})
        keys = sum(k in doc for k in REQUIRED_KEYS) / len(REQUIRED_KEYS)
        valid = _validity(doc)
        checks = brief_checks(doc, sample.reference)
        brief = sum(checks) / len(checks)
        present = _present(doc, sample.reference)
        total = 0.1 + 0.15 * keys + 0.35 * valid * present + 0.4 * brief
        return Score(total, {"parses": 1.0, "keys": keys, "valid": valid, "brief": brief})


_SHAPE_SIZES: dict[str, dict[str, Any]] = {
    "box": {"size": [1, 1, 1]}, "sphere": {"radius": 0.5}, "cylinder": {"radius": 0.5, "height": 1},
    "cone": {"radius": 0.5, "height": 1}, "torus": {"radius": 0.5, "tube": 0.2},
}


def reference_completion(sample: Sample) -> str:
    """A valid document meeting every check of the brief: the objects 2 apart on the relation's axis
    (the first above or left of the second), each in its colour's RGB."""
    ref = sample.reference
    rel = ref.get("relation") or {}
    axis = 1 if rel.get("kind") == "above" else 0
    objects = []
    for i, want in enumerate(ref["objects"]):
        position = [0.0, 0.5, 0.0]
        if i:  # the second object: below, or right of, the first
            position[axis] += -2.0 if axis == 1 else 2.0
        if axis == 1 and len(ref["objects"]) > 1:
            position[1] += 2.0  # keep both above the ground
        objects.append({"id": want["id"], "shape": want["shape"], **_SHAPE_SIZES[want["shape"]],
                        "position": position, "material": {"color": COLOURS[want["colour"]]}})
    doc = {"schema": EXAMPLE["schema"], "objects": objects, "camera": {"position": [0, 3, 8], "look_at": [0, 0.5, 0]}}
    return json.dumps(doc, separators=(",", ":"))


def build(seed: int = 0) -> Domain:
    train, eval_ = generated_splits(NAME, make, seed, N_TRAIN, N_EVAL, system=SYSTEM)
    return Domain(NAME, train, eval_, SceneScorer(), DomainSettings(max_tokens=128, temperature=0.7),
                  "scene/0.1 JSON documents from one-line briefs, validated and checked against the brief",
                  reference_completion)
