"""Validation of a scene/0.1 document: every problem found, each with its JSON path and reason.

Three passes, each only on what the previous one accepted: JSON syntax; values (the pydantic
models: types, ranges, finite numbers, required fields, one rotation form); then the whole
document (unique ids, references that resolve, no parent cycles, assets that exist).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from mainspring.scenes.constraint_model import CONSTRAINT_TYPES
from mainspring.scenes.errors import SceneError, SceneInvalid, Violation
from mainspring.scenes.model import SHAPES, Scene, SceneObject

_TAGS = set(SHAPES) | set(CONSTRAINT_TYPES)  # discriminated-union tags pydantic puts into error paths
_MESSAGES = {
    "missing": "required field is missing",
    "extra_forbidden": "unknown field",
}


def parse_scene(source: str | bytes | dict[str, Any],
                base_dir: Path | None = None) -> tuple[Scene | None, list[Violation]]:
    """(the scene, []) if valid, else (None, every violation found). `base_dir` is where mesh
    assets are looked up (the scene file's folder); without it assets are not checked."""
    if isinstance(source, (str, bytes)):
        try:
            doc = json.loads(source)
        except ValueError as exc:
            where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            return None, [Violation("$", f"not valid JSON: {msg}{where}")]
    else:
        doc = source
    if not isinstance(doc, dict):
        return None, [Violation("$", f"a scene is a JSON object, got {type(doc).__name__}")]
    violations = list(_nulls(doc, "$"))
    if violations:
        return None, violations
    try:
        scene = Scene.model_validate(doc)
    except ValidationError as exc:
        return None, [_from_pydantic(err, doc) for err in exc.errors()]
    violations = document_violations(scene, base_dir)
    return (None, violations) if violations else (scene, [])


def validate(source: str | bytes | dict[str, Any], base_dir: Path | None = None) -> list[Violation]:
    """Every violation in the document; [] when it is a valid scene/0.1."""
    return parse_scene(source, base_dir)[1]


def load_scene(source: str | bytes | dict[str, Any] | Path, base_dir: Path | None = None) -> Scene:
    """The scene, or SceneInvalid listing every violation. A Path is read (assets next to it)."""
    if isinstance(source, Path):
        try:
            text = source.read_bytes()
        except OSError as exc:
            raise SceneError(f"cannot read {source}: {exc.strerror or exc}") from None
        base_dir = source.parent if base_dir is None else base_dir
        source = text
    scene, violations = parse_scene(source, base_dir)
    if scene is None:
        raise SceneInvalid(violations)
    return scene


def document_violations(scene: Scene, base_dir: Path | None = None) -> list[Violation]:
    """Checks across the document that no single value can fail on its own."""
    out: list[Violation] = []
    seen: dict[str, str] = {}
    for kind, items in (("objects", scene.objects), ("lights", scene.lights)):
        for i, item in enumerate(items):
            path = f"$.{kind}[{i}].id"
            if item.id in seen:
                out.append(Violation(path, f"duplicate id '{item.id}' (first used at {seen[item.id]})"))
            else:
                seen[item.id] = path
    objects = {o.id: o for o in scene.objects}
    for i, obj in enumerate(scene.objects):
        if obj.parent is not None and obj.parent not in objects:
            out.append(Violation(f"$.objects[{i}].parent", f"no object has id '{obj.parent}'"))
        if isinstance(obj.material, str) and obj.material not in scene.materials:
            out.append(Violation(f"$.objects[{i}].material", f"no material named '{obj.material}' in $.materials"))
        if obj.shape == "mesh" and base_dir is not None and not (base_dir / obj.asset).is_file():
            out.append(Violation(f"$.objects[{i}].asset", f"asset file not found: {base_dir / obj.asset}"))
    out += _cycles(scene, objects)
    for i, c in enumerate(scene.constraints):
        for field in ("a", "b"):
            ref = getattr(c, field, None)
            if ref is not None and ref not in objects:
                out.append(Violation(f"$.constraints[{i}].{field}", f"no object has id '{ref}'"))
        a, b = getattr(c, "a", None), getattr(c, "b", None)
        if b is not None and a == b:
            out.append(Violation(f"$.constraints[{i}].b", f"relates '{a}' to itself"))
        ids = getattr(c, "ids", "*")
        if ids != "*":
            for j, ref in enumerate(ids):
                if ref not in objects:
                    out.append(Violation(f"$.constraints[{i}].ids[{j}]", f"no object has id '{ref}'"))
        if c.type == "inside_room" and scene.room is None:
            out.append(Violation(f"$.constraints[{i}]", "inside_room needs a $.room"))
    return out


def _cycles(scene: Scene, objects: dict[str, SceneObject]) -> list[Violation]:
    index = {o.id: i for i, o in enumerate(scene.objects)}
    out: list[Violation] = []
    reported: set[str] = set()
    for obj in scene.objects:
        chain: list[str] = []
        node: SceneObject | None = obj
        while node is not None and node.parent is not None and node.id not in chain:
            chain.append(node.id)
            node = objects.get(node.parent)
        if node is not None and node.id in chain:
            loop = chain[chain.index(node.id):]
            if not reported.intersection(loop):
                reported.update(loop)
                out.append(Violation(f"$.objects[{index[loop[0]]}].parent",
                                     "parent cycle: " + " -> ".join([*loop, loop[0]])))
    return out


def _nulls(node: Any, path: str):
    # the schema has no nulls (optional fields are left out), so a null is always a mistake
    if node is None:
        yield Violation(path, "null is not allowed; leave the field out instead")
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _nulls(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _nulls(value, f"{path}[{i}]")


def _from_pydantic(err: ErrorDetails, doc: Any) -> Violation:
    path, node = "$", doc
    for part in err["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
        elif isinstance(node, dict) and part in node:
            path += f".{part}"
            node = node[part]
        elif part in _TAGS and isinstance(node, dict):
            continue  # the union member pydantic tried, not a key of the document
        else:
            path += f".{part}"
            node = None
    kind, msg = err["type"], err["msg"]
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        key = "shape" if "shape" in msg else "type"
        expected = ", ".join(SHAPES if key == "shape" else CONSTRAINT_TYPES)
        got = node.get(key) if isinstance(node, dict) else None
        what = f"unknown {key} {got!r}" if kind == "union_tag_invalid" else f"missing '{key}'"
        return Violation(f"{path}.{key}", f"{what}; expected one of: {expected}")
    msg = _MESSAGES.get(kind, msg)
    return Violation(path, msg.removeprefix("Value error, "))
