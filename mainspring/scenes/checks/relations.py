"""Relations between objects measured on their world-space geometry: contact, grounding,
direction, distance, facing and alignment. Each returns a ConstraintResult with the quantity."""

from __future__ import annotations

import math

import numpy as np

from mainspring.scenes.camera import camera_view
from mainspring.scenes.checks import geometry as g
from mainspring.scenes.checks.result import ConstraintResult, result
from mainspring.scenes.world import World

# ordering type -> (axis of the frame: 0 right, 1 up, 2 front; sign)
_DIRECTIONS = {"right_of": (0, 1), "left_of": (0, -1), "above": (1, 1), "below": (1, -1),
               "in_front_of": (2, 1), "behind": (2, -1)}


def contact(i: int, c, world: World) -> ConstraintResult:
    a, b = world.by_id[c.a], world.by_id[c.b]
    gap = g.top_gap(a, b)
    touching = abs(gap) <= c.tolerance
    if c.type == "on_top_of":
        cx, cz = float(a.centre[0]), float(a.centre[2])
        over = g.footprint_contains(b, cx, cz)
        where = (f"its centre is over {c.b}" if over else
                 f"its centre is not over {c.b} ({g.distance_outside_footprint(b, cx, cz):.3f} m outside b's box)")
        return result(i, c, touching and over, "gap", gap, "m", f"{c.a}'s bottom is {_gap_words(gap)} "
                      f"{c.b}'s top (|gap| <= {c.tolerance} needed); {where}")
    area = g.footprint_overlap(a, b)
    return result(i, c, touching and area > 0, "gap", gap, "m", f"{c.a}'s bottom is {_gap_words(gap)} {c.b}'s top "
                  f"(|gap| <= {c.tolerance} needed); footprints overlap by {area:.4f} m^2 (> 0 needed)")


def grounded(i: int, c, world: World) -> ConstraintResult:
    a = world.by_id[c.a]
    if c.type == "on_floor":
        gap = float(a.lo[1] - world.floor_y)
        return result(i, c, abs(gap) <= c.tolerance, "gap", gap, "m",
                      f"{c.a}'s bottom is {_gap_words(gap)} the floor at y = {world.floor_y:g} "
                      f"(|gap| <= {c.tolerance} needed)")
    room = world.scene.room
    if room is None:  # validation requires one for the scene's own constraints; a brief's may not
        return result(i, c, False, "outside", None, "m", "the scene has no room to be inside")
    lo, hi = np.asarray(room.min), np.asarray(room.max)
    outside = float(np.max(np.maximum(lo - a.lo, a.hi - hi)))
    outside = max(outside, 0.0)
    return result(i, c, outside <= c.tolerance, "outside", outside, "m",
                  f"{c.a} reaches {outside:.3f} m beyond the room's walls (<= {c.tolerance} allowed)")


def ordering(i: int, c, world: World) -> ConstraintResult:
    a, b = world.by_id[c.a], world.by_id[c.b]
    gap = g.separation(a, b, ordering_direction(c, world))
    needed = c.min - c.tolerance
    frame = {"world": "world axes", "camera": "the camera's view", "b": f"{c.b}'s own axes"}[c.frame]
    return result(i, c, gap >= needed, "gap", gap, "m",
                  f"{c.a} is {gap:+.3f} m beyond {c.b} {c.type.replace('_', ' ')} in {frame} "
                  f"(>= {c.min:g} needed, {c.tolerance:g} tolerance)")


def ordering_direction(c, world: World) -> np.ndarray:
    """The unit world vector along which a direction constraint measures `a` beyond `b`."""
    axis, sign = _DIRECTIONS[c.type]
    if c.frame == "world":
        axes = np.eye(3)
    elif c.frame == "camera":
        view = camera_view(world.scene.camera)
        axes = np.column_stack([view.right, view.up, view.backward])
    else:
        axes = g.object_axes(world.by_id[c.b])
    return sign * axes[:, axis]


def distance(i: int, c, world: World) -> ConstraintResult:
    a, b = world.by_id[c.a], world.by_id[c.b]
    d = g.box_gap(a, b)
    if c.type == "near":
        return result(i, c, d <= c.max, "distance", d, "m", f"bounding boxes {d:.3f} m apart (<= {c.max:g} needed)")
    return result(i, c, d >= c.min, "distance", d, "m", f"bounding boxes {d:.3f} m apart (>= {c.min:g} needed)")


def facing(i: int, c, world: World) -> ConstraintResult:
    a, b = world.by_id[c.a], world.by_id[c.b]
    front = g.object_axes(a)[:, 2]
    to_b = b.centre - a.centre
    flat_front, flat_to_b = front * [1, 0, 1], to_b * [1, 0, 1]
    if np.linalg.norm(flat_front) > 1e-6 and np.linalg.norm(flat_to_b) > 1e-6:
        front, to_b, plane = flat_front, flat_to_b, "seen from above"
    else:  # pointing straight up or down, or b straight above: only the 3D angle means anything
        plane = "in 3D"
    if np.linalg.norm(to_b) < 1e-9:
        return result(i, c, False, "angle", None, "deg", f"{c.a} and {c.b} share a centre: no direction to face")
    cos = float(np.dot(front, to_b) / (np.linalg.norm(front) * np.linalg.norm(to_b)))
    angle = math.degrees(math.acos(max(-1.0, min(1.0, cos))))
    return result(i, c, angle <= c.max_deg, "angle", angle, "deg",
                  f"{c.a}'s front (+Z) is {angle:.1f} deg off the direction to {c.b}, {plane} "
                  f"(<= {c.max_deg:g} needed)")


def aligned(i: int, c, world: World) -> ConstraintResult:
    a, b = world.by_id[c.a], world.by_id[c.b]
    k = "xyz".index(c.axis)
    offset = float(abs(a.centre[k] - b.centre[k]))
    return result(i, c, offset <= c.tolerance, "offset", offset, "m",
                  f"centres differ by {offset:.3f} m along {c.axis} (<= {c.tolerance:g} needed)")


def _gap_words(gap: float) -> str:
    if gap >= 0:
        return f"{gap:.3f} m above"
    return f"{-gap:.3f} m below"
