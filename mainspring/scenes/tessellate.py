"""Primitives to triangle meshes, once, with fixed segment counts: the preview, the constraint
checks and the .glb all use these same triangles, so they cannot disagree.

trimesh builds axial shapes along +Z; scene/0.1 (like three.js) runs them along +Y, so they are
turned by -90° about X. Cones are also moved down by half their height to be centred.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import trimesh

from mainspring.scenes.errors import SceneError

SPHERE_SUBDIVISIONS = 3  # icosphere: 1,280 triangles, no degenerate pole triangles
SECTIONS = 32  # around cylinders, cones and capsules
TORUS_SECTIONS = (48, 16)
_Z_TO_Y = trimesh.transformations.rotation_matrix(-math.pi / 2, [1, 0, 0])


@dataclass(frozen=True)
class Tessellation:
    """One object's triangles in its own frame. `solid` is watertight where the shape has a volume
    (exact overlap volumes need that); `surface` has vertices split at hard edges, so flat faces
    keep flat normals when shaded (a shared box corner would otherwise average three normals)."""

    solid: trimesh.Trimesh
    surface: trimesh.Trimesh

    @property
    def has_volume(self) -> bool:
        return self.solid.is_volume


def tessellate(obj, base_dir: Path | None = None) -> Tessellation:
    """The object's local meshes (before its transform)."""
    if obj.shape == "mesh":
        if base_dir is None:
            raise SceneError(f"object '{obj.id}': a mesh asset needs the scene file's folder to be found")
        path = (base_dir / obj.asset).resolve()
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            raise SceneError(f"object '{obj.id}': asset file not found: {path}") from None
        return _asset(str(path), stamp)
    return _primitive(obj.shape, *_parameters(obj))


def _parameters(obj) -> tuple:
    if obj.shape in ("box", "plane"):
        return tuple(obj.size)
    if obj.shape == "sphere":
        return (obj.radius,)
    if obj.shape == "torus":
        return (obj.radius, obj.tube)
    return (obj.radius, obj.height)


@lru_cache(maxsize=1024)
def _primitive(shape: str, *p: float) -> Tessellation:
    if shape == "box":
        solid = trimesh.creation.box(extents=p)
    elif shape == "sphere":
        solid = trimesh.creation.icosphere(subdivisions=SPHERE_SUBDIVISIONS, radius=p[0])
    elif shape == "cylinder":
        solid = trimesh.creation.cylinder(radius=p[0], height=p[1], sections=SECTIONS, transform=_Z_TO_Y)
    elif shape == "cone":
        lower = trimesh.transformations.translation_matrix([0, 0, -p[1] / 2])
        solid = trimesh.creation.cone(radius=p[0], height=p[1], sections=SECTIONS, transform=_Z_TO_Y @ lower)
    elif shape == "capsule":
        solid = trimesh.creation.capsule(height=p[1] - 2 * p[0], radius=p[0], count=[SECTIONS, SECTIONS // 2],
                                         transform=_Z_TO_Y)
    elif shape == "torus":
        solid = trimesh.creation.torus(p[0], p[1], major_sections=TORUS_SECTIONS[0],
                                       minor_sections=TORUS_SECTIONS[1], transform=_Z_TO_Y)
    elif shape == "plane":
        x, z = p[0] / 2, p[1] / 2
        # counter-clockwise seen from +Y, so the face (and its normal) points up
        solid = trimesh.Trimesh([[-x, 0, -z], [-x, 0, z], [x, 0, z], [x, 0, -z]], [[0, 1, 2], [0, 2, 3]],
                                process=False)
    else:
        raise SceneError(f"unknown shape {shape!r}")
    return Tessellation(solid, _surface(solid))


@lru_cache(maxsize=64)
def _asset(path: str, stamp: int) -> Tessellation:
    try:
        mesh = trimesh.load(path, force="mesh", process=True)
    except Exception as exc:  # trimesh raises many kinds for a broken file; all mean "unreadable"
        raise SceneError(f"cannot read mesh asset {path}: {exc}") from None
    if not isinstance(mesh, trimesh.Trimesh) or len(mesh.faces) == 0:
        raise SceneError(f"mesh asset {path} has no triangles")
    mesh = trimesh.Trimesh(mesh.vertices, mesh.faces, process=True)  # geometry only; materials are ours
    return Tessellation(mesh, _surface(mesh))


def _surface(solid: trimesh.Trimesh, crease_deg: float = 30.0) -> trimesh.Trimesh:
    """A copy whose vertices are split where faces meet at more than `crease_deg`, each with the
    area-weighted normal of the faces around it on its side of the crease (smooth across gentle
    bends, flat across box edges and cylinder rims)."""
    faces = np.asarray(solid.faces)
    unit = np.asarray(solid.face_normals, dtype=float)
    weighted = unit * np.asarray(solid.area_faces, dtype=float)[:, None]
    corner_vertex = faces.ravel()
    corner_face = np.repeat(np.arange(len(faces)), 3)
    order = np.argsort(corner_vertex, kind="stable")
    bounds = np.flatnonzero(np.diff(corner_vertex[order])) + 1
    normals = np.zeros((len(corner_vertex), 3))
    cos_crease = math.cos(math.radians(crease_deg))
    for group in np.split(order, bounds):  # the corners around one vertex
        f = corner_face[group]
        same_side = unit[f] @ unit[f].T >= cos_crease
        normals[group] = same_side @ weighted[f]
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-12)
    key = np.column_stack([corner_vertex, np.round(normals * 1e4)])
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return trimesh.Trimesh(solid.vertices[corner_vertex[first]], inverse.reshape(-1, 3),
                           vertex_normals=normals[first], process=False)
