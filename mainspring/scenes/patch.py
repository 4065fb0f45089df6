"""Revisions of a scene document as JSON Patch (RFC 6902) edits, through the `jsonpatch` library.

A revision touches only what it names: applying a patch copies the document and changes the
addressed values in place, so dict key order is kept and every untouched object serializes to
the same bytes as before (`dumps` is the one serialization the loop shows a model). A patch is
applied whole or not at all; a bad one is a `PatchError` whose message says which operation
failed and why, worded to be handed back to the model that wrote it.

`patch_schema(doc)` is the JSON Schema constrained decoding uses for a revision of `doc`: only
operations that address values the document has (or may add: a rotation), each value typed as
the addressed field is (a number, or a vector of its length), so a small model cannot write a
pointer that resolves nowhere.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Sequence

import jsonpatch
import jsonpointer

from mainspring.scenes.schema import COMPACT_JSON

Patch = list[dict[str, Any]]

# the fields of an object a layout revision may change, by the kind of value they hold
_OBJECT_SCALARS = ("radius", "height", "tube")
_OBJECT_VECTORS = ("size", "position", "rotation_deg")
_CAMERA_VECTORS = ("position", "look_at")


class PatchError(ValueError):
    """A patch that cannot be read or applied; `op_index` is the failing operation (None: the whole patch)."""

    def __init__(self, message: str, op_index: int | None = None) -> None:
        super().__init__(message)
        self.op_index = op_index


def dumps(doc: Any) -> str:
    """Compact JSON in the document's own key order: what a model reads and what byte-identity means."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def parse_patch(source: str | bytes | list | dict) -> Patch:
    """The operations of a patch given as JSON text or value: a list of operations, or an object
    whose "patch" member is one (the form a JSON-schema answer takes)."""
    value: Any = source
    if isinstance(source, (str, bytes)):
        try:
            value = json.loads(source)
        except ValueError as exc:
            raise PatchError(f"the patch is not JSON: {exc}") from None
    if isinstance(value, dict) and "patch" in value:
        value = value["patch"]
    if not isinstance(value, list) or not all(isinstance(op, dict) for op in value):
        raise PatchError('a JSON Patch is a list of operations like {"op": "replace", "path": ..., "value": ...}')
    return value


def apply_patch(doc: dict[str, Any], patch: str | bytes | list | dict) -> dict[str, Any]:
    """A new document: `doc` with every operation of `patch` applied, in order; `doc` is untouched.
    Raises PatchError naming the first operation that fails (nothing is applied then)."""
    ops = parse_patch(patch)
    if not ops:
        raise PatchError("the patch has no operations")
    out = copy.deepcopy(doc)
    for i, op in enumerate(ops):
        try:
            # one operation at a time, so the error can name it; in place on our private copy
            out = jsonpatch.JsonPatch([op]).apply(out, in_place=True)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise PatchError(f"operation {i} {_short(op)}: {exc}", i) from None
        except (KeyError, IndexError, TypeError, ValueError) as exc:  # malformed members jsonpatch does not wrap
            raise PatchError(f"operation {i} {_short(op)}: {type(exc).__name__}: {exc}", i) from None
    return out


def _short(op: dict[str, Any]) -> str:
    text = dumps({k: op[k] for k in ("op", "path", "from", "value") if k in op})
    return text if len(text) <= 120 else text[:117] + "..."


def diff(before: dict[str, Any], after: dict[str, Any]) -> Patch:
    """The patch from `before` to `after` (for records: what a turn changed)."""
    return list(jsonpatch.make_patch(before, after))


def patch_schema(doc: dict[str, Any], max_ops: int = 6, structural: bool = False,
                 object_schema: dict[str, Any] | None = None, rotations: bool = True,
                 objects: Sequence[str] | None = None, camera: bool = True,
                 remove_constraints: bool = False) -> dict[str, Any]:
    """The decoding schema of a revision of `doc`: {"patch": [operation, ...]} with 1..max_ops
    operations that replace a number or a vector `doc` has (a whole vector or one component), or
    add a rotation an object lacks. `structural` also allows removing an object and appending
    one (`object_schema`, e.g. a decoding schema's object union; its $refs must resolve in the
    schema this one is merged into). Without `rotations`, no rotation may be added (a small model
    reaches for the first operation it is allowed, useful or not). `objects` narrows the pointers
    to those objects' (in that order: a model tends to take the first one offered), `camera`
    says whether the camera may change; `remove_constraints` lets it drop the scene's own
    constraints (one that relates an object to itself makes a scene invalid)."""
    scalars, vectors, additions = _pointers(doc, objects, camera)
    if not rotations:
        additions = [p for p in additions if not p.endswith("/rotation_deg")]
    branches: list[dict[str, Any]] = []
    if scalars:
        branches.append(_op("replace", {"enum": scalars}, {"type": "number"}))
    for length, paths in sorted(vectors.items()):
        branches.append(_op("replace", {"enum": paths}, _vector(length)))
    if additions:
        branches.append(_op("add", {"enum": additions}, _vector(3)))
    own = doc.get("constraints")
    if remove_constraints and isinstance(own, list) and own:
        branches.append(_remove([f"/constraints/{i}" for i in range(len(own))]))
    if structural:
        n = len(doc.get("objects") or [])
        if n:
            branches.append(_remove([f"/objects/{i}" for i in range(n)]))
        branches.append(_op("add", {"const": "/objects/-"}, object_schema or {"type": "object"}))
    if not branches:
        raise PatchError("the document has nothing a patch could change")
    return {"type": "object", "properties": {"patch": {"type": "array", "items": {"anyOf": branches},
                                                       "minItems": 1, "maxItems": max_ops}},
            "required": ["patch"], "additionalProperties": False, "x-guidance": dict(COMPACT_JSON)}


def _op(name: str, path: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    # op, path, value in that order: llguidance writes properties in schema order, as RFC 6902 shows them
    return {"type": "object", "properties": {"op": {"const": name}, "path": path, "value": value},
            "required": ["op", "path", "value"], "additionalProperties": False}


def _remove(paths: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": {"op": {"const": "remove"}, "path": {"enum": paths}},
            "required": ["op", "path"], "additionalProperties": False}


def _vector(length: int) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "number"}, "minItems": length, "maxItems": length}


def _pointers(doc: dict[str, Any], only: Sequence[str] | None = None,
              camera_too: bool = True) -> tuple[list[str], dict[int, list[str]], list[str]]:
    """JSON pointers of `doc`'s numbers, of its vectors by length, and of rotations it may add."""
    scalars: list[str] = []
    vectors: dict[int, list[str]] = {}
    additions: list[str] = []

    def vector(base: str, value: Any) -> None:
        if isinstance(value, list) and value and all(_is_number(x) for x in value):
            vectors.setdefault(len(value), []).append(base)
            scalars.extend(f"{base}/{k}" for k in range(len(value)))

    listed = [(i, o) for i, o in enumerate(doc.get("objects") or []) if isinstance(o, dict)]
    if only is not None:
        rank = {oid: n for n, oid in enumerate(only)}
        listed = sorted((item for item in listed if item[1].get("id") in rank), key=lambda item: rank[item[1]["id"]])
    for i, obj in listed:
        base = f"/objects/{i}"
        for key in _OBJECT_SCALARS:
            if _is_number(obj.get(key)):
                scalars.append(f"{base}/{key}")
        for key in _OBJECT_VECTORS:
            if key in obj:
                vector(f"{base}/{key}", obj[key])
            elif key == "rotation_deg" and "rotation_quat" not in obj:
                additions.append(f"{base}/{key}")
            elif key == "position":
                additions.append(f"{base}/{key}")  # an unplaced object sits at the origin until given one
    camera = doc.get("camera")
    if isinstance(camera, dict) and camera_too:
        for key in _CAMERA_VECTORS:
            vector(f"/camera/{key}", camera.get(key))
        if _is_number(camera.get("yfov_deg")):
            scalars.append("/camera/yfov_deg")
    return scalars, vectors, additions


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["Patch", "PatchError", "apply_patch", "diff", "dumps", "parse_patch", "patch_schema"]
