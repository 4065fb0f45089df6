"""What a model is told after a check: each failed constraint with its measured quantity (gap in
metres, overlap volume, angle, pixels) and the objects involved, named by id and by the JSON
pointer a patch would use, with their current placement.

A failed constraint the checker found a verified repair for (repair.py) comes with that patch,
and an invalid scene with the patch that makes it valid: a small model copies a number far
better than it works one out from a gap and a size.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from mainspring.scenarios.scene3d.evaluate import BriefScore, constraint_refs
from mainspring.scenarios.scene3d.repair import Suggestions
from mainspring.scenes.checks.result import ConstraintResult
from mainspring.scenes.patch import dumps

_PLACEMENT_FIELDS = ("shape", "size", "radius", "height", "tube", "position", "rotation_deg")


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


def _measured(result: ConstraintResult) -> str:
    if result.value is None:
        return result.detail
    return f"{result.quantity} = {result.value:.4g} {result.unit} ({result.detail})"


def check_feedback(doc: dict[str, Any], score: BriefScore, constraints: Sequence[Any],
                   suggestions: Suggestions | None = None) -> str:
    """The check of `doc` in words: its violations if it is invalid, else every failed constraint;
    with the checker's verified repairs where `suggestions` has them (repair.suggest)."""
    hints = suggestions or Suggestions()
    if not score.valid:
        lines = [f"The scene is invalid ({len(score.violations)} problem(s)):"]
        lines += [f"- {v.path}: {v.message}" for v in score.violations[:12]]
        if hints.validity:
            lines.append(f"The checker verified that this patch makes it valid: {_patch_text(hints.validity)}")
        return "\n".join(lines)
    failed = [r for r in score.results if not r.passed]
    lines = [f"Checks: {score.num_passed} of {len(score.results)} constraints pass."]
    if not failed:
        return lines[0]
    lines.append("Failed:")
    objects: list[str] = []
    for r in failed:
        c = constraints[r.index]
        repair = hints.each.get(r.index)
        fix = f" The checker verified that this patch fixes it: {_patch_text(repair.ops)}" if repair else ""
        lines.append(f"- {r.label}: {_measured(r)}.{fix}")
        objects += [oid for oid in involved_ids(r, c, doc) if oid not in objects]
    if objects:
        lines.append("Objects involved:")
        lines += [f"- {object_line(doc, oid)}" for oid in objects]
    if hints.together:
        fixed = ", ".join(score.results[i].label for i in hints.fixed_together)
        lines.append(f"This one patch fixes {fixed} together (verified): {_patch_text(hints.together)}")
    return "\n".join(lines)


def _patch_text(ops: list[dict[str, Any]]) -> str:
    return dumps({"patch": ops})


__all__ = ["check_feedback", "involved_ids", "object_line"]
