"""Score any scene against a brief: the brief's constraints (not the scene's own, which a writer
could make easy) measured on the scene.

score = constraints passed / constraints in the brief, 0 for an invalid scene. A constraint that
names an object the scene lacks fails (value None, "missing object"), so leaving the hard parts
out never pays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from mainspring.scenarios.scene3d.briefs import Brief
from mainspring.scenes.checks import check_constraints
from mainspring.scenes.checks.result import ConstraintResult, result
from mainspring.scenes.errors import SceneError, Violation
from mainspring.scenes.preview.frame import Frame
from mainspring.scenes.validate import parse_scene
from mainspring.scenes.world import build_world


@dataclass
class BriefScore:
    brief_id: str
    valid: bool
    violations: list[Violation] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # brief ids absent from the scene
    results: list[ConstraintResult] = field(default_factory=list)

    @property
    def num_passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def score(self) -> float:
        return self.num_passed / len(self.results) if self.valid and self.results else 0.0

    def to_dict(self) -> dict:
        return {"brief": self.brief_id, "valid": self.valid, "score": round(self.score, 4),
                "num_passed": self.num_passed, "num_constraints": len(self.results), "missing": self.missing,
                "violations": [v.to_dict() for v in self.violations], "results": [r.to_dict() for r in self.results]}


def evaluate(scene_doc: dict[str, Any] | str | bytes, brief: Brief, base_dir: Path | None = None,
             frame: Frame | None = None) -> BriefScore:
    """Measure the brief's constraints on `scene_doc` (a frame already rendered may be passed)."""
    return score_constraints(scene_doc, brief.id, brief.objects, brief.constraints, base_dir, frame)


def score_constraints(scene_doc: dict[str, Any] | str | bytes, name: str, objects: Sequence[str],
                      constraints: Sequence[Any], base_dir: Path | None = None,
                      frame: Frame | None = None) -> BriefScore:
    """The same measure for any list of constraints and required ids (a design thread's pinned ones)."""
    scene, violations = parse_scene(scene_doc, base_dir)
    if scene is None:
        return BriefScore(name, False, violations, [], [])
    try:
        world = build_world(scene, base_dir)
    except SceneError as exc:
        return BriefScore(name, False, [Violation("$", str(exc))], [], [])
    present = set(world.by_id)
    missing = [oid for oid in objects if oid not in present]
    runnable, results = [], {}
    for i, c in enumerate(constraints):
        absent = [oid for oid in constraint_refs(c) if oid not in present]
        if absent:
            results[i] = result(i, c, False, "missing", None, "", f"missing object(s): {', '.join(absent)}")
        else:
            runnable.append((i, c))
    report = check_constraints(world, [c for _, c in runnable], frame=frame)
    for (i, _), r in zip(runnable, report.results):
        results[i] = ConstraintResult(i, r.type, r.label, r.passed, r.quantity, r.value, r.unit, r.detail)
    return BriefScore(name, True, [], missing, [results[i] for i in range(len(constraints))])


def constraint_refs(c: Any) -> list[str]:
    """The object ids a constraint names (none for one over every object)."""
    refs = [getattr(c, name) for name in ("a", "b") if getattr(c, name, None) is not None]
    ids = getattr(c, "ids", "*")
    return refs + ([] if ids == "*" else list(ids))
