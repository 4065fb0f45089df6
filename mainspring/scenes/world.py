"""A validated scene placed in the world: every object's world transform, triangles and bounds.

Built once per scene and shared by the constraint checks, the renderer and the exporter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import trimesh

from mainspring.scenes.model import Material, Scene, SceneObject
from mainspring.scenes.tessellate import Tessellation, tessellate
from mainspring.scenes.transforms import world_matrices

DEFAULT_MATERIAL = Material(color=[0.8, 0.8, 0.8])


@dataclass
class Placed:
    """One object in world space."""

    index: int  # position in scene.objects; the ID buffer stores index + 1
    obj: SceneObject  # the pydantic object (Box, Sphere, ...)
    matrix: np.ndarray  # 4x4 local -> world
    mesh: Tessellation  # in the object's own frame
    material: Material

    @property
    def id(self) -> str:
        return self.obj.id

    @cached_property
    def vertices(self) -> np.ndarray:
        """World positions of the solid's vertices (bounds and projections use these)."""
        v = np.asarray(self.mesh.solid.vertices, dtype=float)
        return v @ self.matrix[:3, :3].T + self.matrix[:3, 3]

    @cached_property
    def world_solid(self) -> trimesh.Trimesh:
        return trimesh.Trimesh(self.vertices, self.mesh.solid.faces, process=False)

    @cached_property
    def lo(self) -> np.ndarray:
        return self.vertices.min(axis=0)

    @cached_property
    def hi(self) -> np.ndarray:
        return self.vertices.max(axis=0)

    @cached_property
    def centre(self) -> np.ndarray:
        return (self.lo + self.hi) / 2

    @property
    def has_volume(self) -> bool:
        return self.obj.shape != "plane" and self.mesh.has_volume

    def has_tag(self, tag: str) -> bool:
        return tag in self.obj.tags


@dataclass
class World:
    scene: Scene
    placed: list[Placed]
    by_id: dict[str, Placed] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {p.id: p for p in self.placed}

    @property
    def floor_y(self) -> float:
        """The ground: the room's floor, else y = 0."""
        return self.scene.room.min[1] if self.scene.room is not None else 0.0

    def select(self, ids) -> list[Placed]:
        return list(self.placed) if ids == "*" else [self.by_id[i] for i in ids]


def build_world(scene: Scene, base_dir: Path | None = None) -> World:
    """Place a validated scene (references resolved, no cycles) in world space."""
    matrices = world_matrices(scene.objects)
    placed = []
    for i, obj in enumerate(scene.objects):
        material = obj.material
        if isinstance(material, str):
            material = scene.materials[material]
        placed.append(Placed(i, obj, matrices[obj.id], tessellate(obj, base_dir), material or DEFAULT_MATERIAL))
    return World(scene, placed)
