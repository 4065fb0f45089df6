"""Measurements between placed objects, in world space (metres)."""

from __future__ import annotations

import numpy as np

from mainspring.scenes.world import Placed


def top_gap(a: Placed, b: Placed) -> float:
    """a's bottom minus b's top: 0 in contact, > 0 floating above, < 0 sunk into b."""
    return float(a.lo[1] - b.hi[1])


def footprint_overlap(a: Placed, b: Placed) -> float:
    """Area (m^2) where a's and b's bounding boxes overlap seen from above."""
    dx = min(a.hi[0], b.hi[0]) - max(a.lo[0], b.lo[0])
    dz = min(a.hi[2], b.hi[2]) - max(a.lo[2], b.lo[2])
    return float(max(dx, 0.0) * max(dz, 0.0))


def box_gap(a: Placed, b: Placed) -> float:
    """Distance between the bounding boxes (0 when they touch or overlap)."""
    apart = np.maximum(0.0, np.maximum(a.lo - b.hi, b.lo - a.hi))
    return float(np.linalg.norm(apart))


def box_penetration(a: Placed, b: Placed) -> float:
    """How deep the bounding boxes interpenetrate: the smallest per-axis overlap (<= 0 if apart)."""
    return float(np.min(np.minimum(a.hi, b.hi) - np.maximum(a.lo, b.lo)))


def separation(a: Placed, b: Placed, direction: np.ndarray) -> float:
    """How far a's extent lies beyond b's along `direction` (unit): > 0 apart, < 0 overlapping."""
    return float(np.min(a.vertices @ direction) - np.max(b.vertices @ direction))


def footprint_contains(b: Placed, x: float, z: float) -> bool:
    """True if the vertical line through (x, z) passes through b's triangles: exact for round,
    rotated and concave shapes, where the bounding box would overstate b's top."""
    tri = b.vertices[np.asarray(b.mesh.solid.faces)][:, :, [0, 2]]  # (n, 3, 2) seen from above
    p0, p1, p2 = tri[:, 0], tri[:, 1], tri[:, 2]
    e1, e2, rel = p1 - p0, p2 - p0, np.array([x, z]) - p0
    det = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
    ok = np.abs(det) > 1e-12  # triangles seen edge-on cover no area
    det = np.where(ok, det, 1.0)
    u = (rel[:, 0] * e2[:, 1] - rel[:, 1] * e2[:, 0]) / det
    v = (e1[:, 0] * rel[:, 1] - e1[:, 1] * rel[:, 0]) / det
    eps = 1e-9
    return bool(np.any(ok & (u >= -eps) & (v >= -eps) & (u + v <= 1 + eps)))


def distance_outside_footprint(b: Placed, x: float, z: float) -> float:
    """Horizontal distance from (x, z) to b's bounding box seen from above (0 inside it)."""
    dx = max(b.lo[0] - x, 0.0, x - b.hi[0])
    dz = max(b.lo[2] - z, 0.0, z - b.hi[2])
    return float(np.hypot(dx, dz))


def object_axes(p: Placed) -> np.ndarray:
    """3x3 with b's right (+X), up (+Y) and front (+Z) in world space as columns, unit length."""
    m = p.matrix[:3, :3]
    return m / np.linalg.norm(m, axis=0, keepdims=True)
