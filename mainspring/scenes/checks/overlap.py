"""Whole-scene physical plausibility: nothing interpenetrates (no_overlap) and nothing floats
(no_floating).

no_overlap compares bounding boxes first (cheap, all pairs at once); only pairs whose boxes
interpenetrate by more than the tolerance on every axis get an exact mesh intersection (manifold3d
boolean on the watertight solids), so a sphere in a box's corner or a cup on a table is not
reported. Planes have no volume and objects tagged ignore_collision are left out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mainspring.scenes.checks import geometry as g
from mainspring.scenes.checks.result import ConstraintResult, result
from mainspring.scenes.world import Placed, World

_UNSUPPORTED_OK = ("hanging", "wall_mounted")


def no_overlap(i: int, c, world: World) -> ConstraintResult:
    solids = [p for p in world.select(c.ids) if p.obj.shape != "plane" and not p.has_tag("ignore_collision")]
    limit = c.tolerance ** 3
    offenders: list[tuple[float, str, str]] = []
    approximate: set[str] = set()
    worst = 0.0
    if len(solids) > 1:
        lo = np.array([p.lo for p in solids])
        hi = np.array([p.hi for p in solids])
        depth = np.minimum(hi[:, None], hi[None]) - np.maximum(lo[:, None], lo[None])  # (n, n, 3)
        candidates = np.argwhere(np.triu(np.all(depth > c.tolerance, axis=2), k=1))
        manifolds: dict[int, Any] = {}  # manifold3d solids (untyped) or None, built only for candidate pairs
        for j, k in candidates:
            for n in (j, k):
                if n not in manifolds:
                    manifolds[n] = to_manifold(solids[n])
            if manifolds[j] is None or manifolds[k] is None:
                # a mesh asset that is not watertight has no inside to intersect: its box overlap
                # is the honest upper bound
                volume = float(np.prod(np.clip(depth[j, k], 0, None)))
                approximate.add(solids[j].id if manifolds[j] is None else solids[k].id)
            else:
                volume = max(float((manifolds[j] ^ manifolds[k]).volume()), 0.0)
            worst = max(worst, volume)
            if volume > limit:
                offenders.append((volume, solids[j].id, solids[k].id))
    offenders.sort(reverse=True)
    if offenders:
        listed = ", ".join(f"{a}~{b} {v:.6f} m^3" for v, a, b in offenders[:5])
        more = f" and {len(offenders) - 5} more" if len(offenders) > 5 else ""
        detail = f"{len(offenders)} overlapping pair(s): {listed}{more}"
    else:
        detail = f"{len(solids)} solid objects, none overlapping by more than {limit:.0e} m^3"
    if approximate:
        detail += f"; bounding boxes used for {', '.join(sorted(approximate))} (not watertight)"
    return result(i, c, not offenders, "overlap_volume", worst, "m^3", detail)


def to_manifold(p: Placed):
    """p's solid as a manifold3d solid, or None if its mesh does not close up."""
    import manifold3d

    mesh = manifold3d.Mesh(vert_properties=np.ascontiguousarray(p.vertices, dtype=np.float32),
                           tri_verts=np.ascontiguousarray(p.mesh.solid.faces, dtype=np.uint32))
    solid = manifold3d.Manifold(mesh) if p.has_volume else None
    return solid if solid is not None and solid.status() == manifold3d.Error.NoError else None


def no_floating(i: int, c, world: World) -> ConstraintResult:
    """Each object rests on the floor or on another object's top (contact within tolerance, boxes
    overlapping seen from above); an object with a parent is attached to it, and hanging or
    wall-mounted objects need no support."""
    checked, floating = unsupported(c.ids, c.tolerance, world)
    worst = max((gap for gap, _ in floating), key=abs, default=0.0)
    if floating:
        listed = ", ".join(f"{p.id} ({gap:+.3f} m)" for gap, p in floating[:8])
        detail = f"{len(floating)} of {checked} unsupported: {listed} (gap to the nearest surface below)"
    else:
        detail = f"all {checked} objects rest on the floor or on another object"
    return result(i, c, not floating, "gap", worst, "m", detail)


def unsupported(ids, tolerance: float, world: World) -> tuple[int, list[tuple[float, Placed]]]:
    """How many of `ids` need support, and those that have none, each with its gap to the surface under it."""
    floating: list[tuple[float, Placed]] = []
    checked = 0
    for p in world.select(ids):
        if p.obj.parent is not None or any(p.has_tag(t) for t in _UNSUPPORTED_OK):
            continue
        checked += 1
        if abs(p.lo[1] - world.floor_y) <= tolerance:
            continue
        if any(abs(g.top_gap(p, q)) <= tolerance and g.footprint_overlap(p, q) > 0
               for q in world.placed if q is not p):
            continue
        floating.append((_gap_to_support(p, world), p))
    return checked, floating


def _gap_to_support(p: Placed, world: World) -> float:
    """Signed gap from p's bottom to the highest surface under it (the floor if nothing else)."""
    tops = [q.hi[1] for q in world.placed if q is not p and g.footprint_overlap(p, q) > 0 and q.hi[1] <= p.lo[1] + 1e-9]
    return float(p.lo[1] - max([world.floor_y, *tops]))
