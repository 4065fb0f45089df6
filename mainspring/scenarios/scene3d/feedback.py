"""What a model is told after a check: each failed constraint with its measured quantity (gap in
metres, overlap volume, angle, pixels) and the objects involved, named by id and by the JSON
pointer a patch would use, with their current placement.

Where the measurement itself says how far to move (a resting contact's vertical gap), the
message gives the target value: a small model copies a number far better than it subtracts one.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from mainspring.scenarios.scene3d.evaluate import BriefScore, constraint_refs
from mainspring.scenes.checks.result import ConstraintResult
from mainspring.scenes.patch import dumps

_PLACEMENT_FIELDS = ("shape", "size", "radius", "height", "tube", "position", "rotation_deg")
_RESTING = ("on_top_of", "supported_by", "on_floor")  # a vertical gap that moving `a` by -gap closes


def involved_ids(result: ConstraintResult, constraint: Any, doc: dict[str, Any]) -> list[str]:
    """The ids a failed check is about: those it names, else those its detail names (a
    no_overlap or no_floating over every object names its offenders there)."""
    named = constraint_refs(constraint)
    if named:
        return named
    ids = [o.get("id") for o in doc.get("objects") or [] if isinstance(o, dict)]
    return [oid for oid in ids if isinstance(oid, str) and re.search(rf"\b{re.escape(oid)}\b", result.detail)]


def object_line(doc: dict[str, Any], oid: str) -> str:
    for i, obj in enumerate(doc.get("objects") or []):
        if isinstance(obj, dict) and obj.get("id") == oid:
            fields = {k: obj[k] for k in _PLACEMENT_FIELDS if k in obj}
            return f"{oid} is /objects/{i}: {dumps(fields)}"
    return f"{oid} is not in the scene"


def _hint(result: ConstraintResult, constraint: Any, doc: dict[str, Any]) -> str:
    if result.type not in _RESTING or result.quantity != "gap" or result.value is None:
        return ""
    for i, obj in enumerate(doc.get("objects") or []):
        if isinstance(obj, dict) and obj.get("id") == constraint.a and isinstance(obj.get("position"), list):
            y = round(float(obj["position"][1]) - result.value, 3)
            return f" To close it, set /objects/{i}/position/1 to {y:g}."
    return ""


def _measured(result: ConstraintResult) -> str:
    if result.value is None:
        return result.detail
    return f"{result.quantity} = {result.value:.4g} {result.unit} ({result.detail})"


def check_feedback(doc: dict[str, Any], score: BriefScore, constraints: Sequence[Any]) -> str:
    """The check of `doc` in words: its violations if it is invalid, else every failed constraint."""
    if not score.valid:
        lines = [f"The scene is invalid ({len(score.violations)} problem(s)):"]
        lines += [f"- {v.path}: {v.message}" for v in score.violations[:12]]
        return "\n".join(lines)
    failed = [r for r in score.results if not r.passed]
    lines = [f"Checks: {score.num_passed} of {len(score.results)} constraints pass."]
    if not failed:
        return lines[0]
    lines.append("Failed:")
    objects: list[str] = []
    for r in failed:
        c = constraints[r.index]
        lines.append(f"- {r.label}: {_measured(r)}.{_hint(r, c, doc)}")
        objects += [oid for oid in involved_ids(r, c, doc) if oid not in objects]
    if objects:
        lines.append("Objects involved:")
        lines += [f"- {object_line(doc, oid)}" for oid in objects]
    return "\n".join(lines)


__all__ = ["check_feedback", "involved_ids", "object_line"]
