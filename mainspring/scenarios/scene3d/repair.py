"""Repairs the checker can vouch for: for each failed constraint, a few candidate moves (an
object's position, or its yaw for `facing`), each applied to a copy of the scene and measured
again. A move is kept only if that constraint then passes and nothing that passed breaks; the
feedback quotes it as a patch, and the model still writes the patch it sends. An invalid scene
gets the patch that makes it valid, where one of a few known faults is the cause (the camera
looking at its own position, a constraint relating an object to itself).

Why: the measurement already says how far an object is from where it must be, but a 135M model
cannot turn "0.231 m beyond, >= 0.3 needed" and a size into a coordinate; it copies a number
well. A suggestion that was not measured would teach it to trust wrong numbers, so none is given
unless the check passed on the moved scene. Moves are in world space, turned into the object's
own position through its parent's transform.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from mainspring.scenarios.scene3d.evaluate import BriefScore
from mainspring.scenes.checks import geometry as g
from mainspring.scenes.checks.overlap import unsupported
from mainspring.scenes.checks.relations import ordering_direction
from mainspring.scenes.errors import SceneError
from mainspring.scenes.patch import PatchError, apply_patch
from mainspring.scenes.validate import parse_scene
from mainspring.scenes.world import World, build_world

MARGIN = 0.02  # metres past the bound, so a rounded coordinate still passes
_ORDERINGS = ("above", "below", "left_of", "right_of", "in_front_of", "behind")

Move = dict[str, np.ndarray]  # object id -> world-space translation
Ops = list[dict[str, Any]]


@dataclass(frozen=True)
class Repair:
    """A patch that makes constraint `index` pass without breaking any that passed."""

    index: int
    label: str
    ops: Ops


@dataclass(frozen=True)
class Suggestions:
    """What the feedback quotes: a repair per failed constraint, one patch chaining several of
    them and the constraints it fixes, or, for an invalid scene, a patch that makes it valid."""

    each: dict[int, Repair] = field(default_factory=dict)
    together: Ops = field(default_factory=list)
    fixed_together: list[int] = field(default_factory=list)
    validity: Ops = field(default_factory=list)


def suggest(doc: dict[str, Any], score: BriefScore, target: Any, max_ops: int = 6) -> Suggestions:
    if not score.valid:
        return Suggestions(validity=repair_violations(doc, score, target))
    each = suggest_repairs(doc, score, target, max_ops)
    if len(each) < 2:
        return Suggestions(each)
    together, fixed = combine_repairs(doc, score, target, max_ops, first=each)
    return Suggestions(each, together, fixed) if len(fixed) > 1 else Suggestions(each)


def repair_violations(doc: dict[str, Any], score: BriefScore, target: Any, steps: int = 3) -> Ops:
    """A patch that makes an invalid scene valid, or [] if these do not: drop the scene's own
    constraints that are at fault (the brief's are what is measured) and, when the camera is, aim
    it at the objects from the view that lets the most constraints pass. Validation reports one
    level at a time (the camera before the constraints), so fixes are found in steps."""
    ops: Ops = []
    current, now = doc, score
    for _ in range(steps):
        best: tuple[int, Ops, Any, BriefScore] | None = None
        for trial in _validity_trials(current, now):
            try:
                revised = apply_patch(current, trial)
            except PatchError:
                continue
            after = target.score(revised)
            rank = after.num_passed if after.valid else -1
            if best is None or rank > best[0]:
                best = (rank, trial, revised, after)
        if best is None:
            return []
        ops, current, now = ops + best[1], best[2], best[3]
        if now.valid:
            return ops
    return []


def _validity_trials(doc: dict[str, Any], score: BriefScore) -> list[Ops]:
    dropped = sorted({int(m.group(1)) for v in score.violations
                      if (m := re.match(r"\$\.constraints\[(\d+)\]", v.path))}, reverse=True)
    ops: Ops = [{"op": "remove", "path": f"/constraints/{i}"} for i in dropped]
    if any(v.path.startswith("$.camera") for v in score.violations):
        return [ops + view for view in _camera_views(doc)]
    return [ops] if ops else []


def _camera_views(doc: dict[str, Any]) -> Iterator[Ops]:
    """The camera moved back from the objects' centre, looking at it, from the front, front right
    and front left."""
    camera = doc.get("camera")
    if not isinstance(camera, dict) or not all(isinstance(camera.get(k), list) for k in ("position", "look_at")):
        return
    points = [o["position"] for o in doc.get("objects") or [] if isinstance(o, dict)
              and isinstance(o.get("position"), list) and len(o["position"]) == 3]
    centre = np.mean(points, axis=0) if points else np.zeros(3)
    spread = max((float(np.linalg.norm(np.subtract(p, centre))) for p in points), default=0.0)
    distance = 2.5 + 2.0 * spread
    for way in ((0.0, 0.45, 1.0), (0.7, 0.5, 1.0), (-0.7, 0.5, 1.0)):
        unit = np.asarray(way) / np.linalg.norm(way)
        yield [{"op": "replace", "path": "/camera/position", "value": _rounded(centre + unit * distance)},
               {"op": "replace", "path": "/camera/look_at", "value": _rounded(centre)}]


def _rounded(v: np.ndarray) -> list[float]:
    return [round(float(x), 3) for x in v]


def suggest_repairs(doc: dict[str, Any], score: BriefScore, target: Any, max_ops: int = 6) -> dict[int, Repair]:
    """Constraint index -> a verified repair, for the failed constraints that have one. `target`
    scores a document (refine.Target); nothing is suggested for an invalid scene."""
    if not score.valid:
        return {}
    scene, _ = parse_scene(doc)
    if scene is None:
        return {}
    try:
        world = build_world(scene)
    except SceneError:
        return {}
    passed = {r.index for r in score.results if r.passed}
    found: dict[int, Repair] = {}
    for r in score.results:
        if r.passed or r.quantity == "missing":
            continue
        for ops in _candidate_ops(doc, world, target.constraints[r.index], max_ops):
            if _works(doc, ops, target, r.index, passed):
                found[r.index] = Repair(r.index, r.label, ops)
                break
    return found


def combine_repairs(doc: dict[str, Any], score: BriefScore, target: Any, max_ops: int = 6,
                    steps: int = 6, first: dict[int, Repair] | None = None) -> tuple[Ops, list[int]]:
    """One patch that fixes several constraints: repairs taken one at a time, each found on the
    scene as the ones before left it (a box goes on the shelf where the shelf now is), kept only
    while the scene passes more and nothing that passed breaks; and the constraints it fixes.
    `first`: suggest_repairs(doc, ...) when the caller has it already."""
    ops: Ops = []
    current, now = doc, score
    kept = {r.index for r in score.results if r.passed}
    for step in range(steps):
        found = first if step == 0 and first is not None else suggest_repairs(current, now, target, max_ops)
        for repair in found.values():
            trial = _merge(ops, repair.ops)
            if len(trial) > max_ops:
                continue
            revised = apply_patch(doc, trial)
            after = target.score(revised)
            if after.valid and after.num_passed > now.num_passed and all(after.results[i].passed for i in kept):
                ops, current, now = trial, revised, after
                break
        else:
            break
    return ops, [r.index for r in now.results if r.passed and r.index not in kept]


def _merge(ops: Ops, more: Ops) -> Ops:
    """`ops` then `more`, an operation on a path already set replacing the earlier one."""
    paths = {op["path"] for op in more}
    return [op for op in ops if op["path"] not in paths] + list(more)


def _works(doc: dict[str, Any], ops: Ops, target: Any, index: int, passed: set[int]) -> bool:
    try:
        revised = apply_patch(doc, ops)
    except PatchError:
        return False
    after = target.score(revised)
    return after.valid and after.results[index].passed and all(after.results[i].passed for i in passed)


def _candidate_ops(doc: dict[str, Any], world: World, c: Any, max_ops: int) -> Iterator[Ops]:
    for move in _moves(world, c):
        ops = _move_ops(doc, world, move) if isinstance(move, dict) else move
        if ops and len(ops) <= max_ops:
            yield ops


def _moves(world: World, c: Any) -> Iterator[Move | Ops]:
    """Candidate fixes of `c`, the likeliest first: moves of `a` before moves of `b`."""
    t = c.type
    if t in ("on_top_of", "supported_by"):
        a, b = world.by_id[c.a], world.by_id[c.b]
        lift = np.array([0.0, -g.top_gap(a, b), 0.0])
        yield {c.a: lift}
        over = b.centre - a.centre
        yield {c.a: lift + np.array([over[0], 0.0, over[2]])}
    elif t == "on_floor":
        a = world.by_id[c.a]
        yield {c.a: np.array([0.0, world.floor_y - a.lo[1], 0.0])}
    elif t == "inside_room" and world.scene.room is not None:
        a = world.by_id[c.a]
        lo, hi = np.asarray(world.scene.room.min), np.asarray(world.scene.room.max)
        yield {c.a: np.maximum(lo - a.lo + MARGIN, 0) * (a.lo < lo) - np.maximum(a.hi - hi + MARGIN, 0) * (a.hi > hi)}
    elif t in _ORDERINGS:
        a, b = world.by_id[c.a], world.by_id[c.b]
        direction = ordering_direction(c, world)
        short = c.min + MARGIN - g.separation(a, b, direction)
        yield {c.a: direction * short}
        yield {c.b: -direction * short}
    elif t in ("near", "far"):
        yield from _distance_moves(world, c)
    elif t == "aligned":
        k = "xyz".index(c.axis)
        a, b = world.by_id[c.a], world.by_id[c.b]
        shift = np.zeros(3)
        shift[k] = b.centre[k] - a.centre[k]
        yield {c.a: shift}
        yield {c.b: -shift}
    elif t == "facing":
        yield from _facing_ops(world, c)
    elif t == "no_floating":
        yield {p.id: np.array([0.0, -gap, 0.0]) for gap, p in unsupported(c.ids, c.tolerance, world)[1]}
    elif t == "no_overlap":
        yield from _apart_moves(world, c)


def _distance_moves(world: World, c: Any) -> Iterator[Move]:
    a, b = world.by_id[c.a], world.by_id[c.b]
    d = g.box_gap(a, b)
    towards = (b.centre - a.centre) * [1.0, 0.0, 1.0]  # along the floor first: heights usually matter
    for way in (towards, b.centre - a.centre):
        n = float(np.linalg.norm(way))
        if n < 1e-9:
            continue
        unit = way / n
        if c.type == "near":
            for step in (d - c.max / 2, d):
                yield {c.a: unit * step}
        else:
            for step in (c.min - d + MARGIN, 1.5 * (c.min - d) + MARGIN):
                yield {c.a: -unit * step}


def _facing_ops(world: World, c: Any) -> Iterator[Ops]:
    a, b = world.by_id[c.a], world.by_id[c.b]
    to_b = b.centre - a.centre
    yaw = round(math.degrees(math.atan2(to_b[0], to_b[2])), 1)  # +Z turned about +Y by yaw points at b
    index, obj = a.index, a.obj
    rotation = getattr(obj, "rotation_deg", None)
    for angle in (yaw, -yaw):
        if rotation is not None:
            yield [{"op": "replace", "path": f"/objects/{index}/rotation_deg/1", "value": angle}]
        else:
            yield [{"op": "add", "path": f"/objects/{index}/rotation_deg", "value": [0, angle, 0]}]


def _apart_moves(world: World, c: Any) -> Iterator[Move]:
    """Push each overlapping pair apart along the floor axis where they overlap least."""
    solids = [p for p in world.select(c.ids) if p.obj.shape != "plane" and not p.has_tag("ignore_collision")]
    moves_a: Move = {}
    moves_b: Move = {}
    for j, p in enumerate(solids):
        for q in solids[j + 1:]:
            depth = np.minimum(p.hi, q.hi) - np.maximum(p.lo, q.lo)
            if not np.all(depth > c.tolerance):
                continue
            k = 0 if depth[0] <= depth[2] else 2
            sign = 1.0 if p.centre[k] >= q.centre[k] else -1.0
            push = np.zeros(3)
            push[k] = sign * (depth[k] + MARGIN)
            moves_a[p.id] = moves_a.get(p.id, 0) + push
            moves_b[q.id] = moves_b.get(q.id, 0) - push
    if moves_a:
        yield moves_a
        yield moves_b


def _move_ops(doc: dict[str, Any], world: World, move: Move) -> Ops:
    """replace operations on each moved object's position (in its parent's frame)."""
    ops: Ops = []
    for oid, shift in move.items():
        p = world.by_id.get(oid)
        position = None if p is None else doc["objects"][p.index].get("position")
        if p is None or not isinstance(position, list) or len(position) != 3:
            return []
        local = np.asarray(shift, dtype=float)
        if p.obj.parent is not None:
            local = np.linalg.solve(world.by_id[p.obj.parent].matrix[:3, :3], local)
        for k in range(3):
            if abs(local[k]) > 1e-6:
                ops.append({"op": "replace", "path": f"/objects/{p.index}/position/{k}",
                            "value": round(float(position[k]) + float(local[k]), 3)})
    return ops


__all__ = ["MARGIN", "Repair", "Suggestions", "combine_repairs", "repair_violations", "suggest", "suggest_repairs"]
