"""`scene/0.1`: the document a model writes, as pydantic models (the edge where JSON comes in).

glTF conventions throughout, so export needs no conversion: metres, +Y up, right-handed, an
object's front faces +Z, linear float colours 0..1, lights in KHR_lights_punctual units (lux for
directional, candela for point and spot). Primitives are centred on their origin; axial shapes
(cylinder, cone, capsule, torus) run along local +Y. Rotation is `rotation_deg` (extrinsic X then
Y then Z, R = Rz·Ry·Rx) or `rotation_quat` [x, y, z, w], never both.

Checks that need the whole document (unique ids, references, parent cycles) live in validate.py;
these models check one value at a time, so every error carries the path of the value at fault.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from mainspring.scenes.constraint_model import Constraint, Id

SchemaVersion = Literal["scene/0.1"]
SCHEMA_VERSION: str = get_args(SchemaVersion)[0]
MAX_OBJECTS = 500
MAX_LIGHTS = 8
MAX_MATERIALS = 64
MAX_CONSTRAINTS = 200
SHAPES = ("box", "sphere", "cylinder", "cone", "capsule", "torus", "plane", "mesh")
Tag = Literal["hanging", "wall_mounted", "static", "ignore_collision"]
TAGS: tuple[str, ...] = get_args(Tag)
# an object's keys in the order a writer (or a model) should give them: what it is, then where
OBJECT_KEY_ORDER = ("id", "shape", "size", "radius", "height", "tube", "asset", "position", "rotation_deg",
                    "rotation_quat", "scale", "parent", "material", "category", "tags")

# A length is 1 mm to 1 km; a coordinate lies within 1 km of the origin. Sizes outside that are
# almost always a unit mistake (centimetres written as metres), which is worth an error.
Length = Annotated[float, Field(ge=0.001, le=1000)]
Coordinate = Annotated[float, Field(ge=-1000, le=1000)]
Unit = Annotated[float, Field(ge=0, le=1)]
Vec3 = Annotated[list[Coordinate], Field(min_length=3, max_length=3)]
Size3 = Annotated[list[Length], Field(min_length=3, max_length=3)]
Size2 = Annotated[list[Length], Field(min_length=2, max_length=2)]
Rgb = Annotated[list[Unit], Field(min_length=3, max_length=3)]
Angle = Annotated[float, Field(ge=-360, le=360)]
Quat = Annotated[list[Annotated[float, Field(ge=-1, le=1)]], Field(min_length=4, max_length=4)]
AssetPath = Annotated[str, StringConstraints(pattern=r"^assets/[A-Za-z0-9_./-]{1,120}\.glb$")]


class _Strict(BaseModel):
    # strict: "0.5" is not a number and true is not 1; no NaN or infinity anywhere
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Material(_Strict):
    """glTF metallic-roughness: color + opacity -> baseColorFactor, alphaMode BLEND below 1."""

    color: Rgb
    opacity: Unit = 1.0
    metallic: Unit = 0.0
    roughness: Unit = 0.5
    emissive: Rgb | None = None


class _Object(_Strict):
    id: Id
    position: Vec3 = Field(default_factory=lambda: [0.0, 0.0, 0.0])
    rotation_deg: Annotated[list[Angle], Field(min_length=3, max_length=3)] | None = None
    rotation_quat: Quat | None = None
    scale: Size3 | None = None
    parent: Id | None = None
    material: Id | Material | None = None  # a name in `materials`, or inline
    category: Annotated[str, StringConstraints(min_length=1, max_length=32)] | None = None
    tags: Annotated[list[Tag], Field(max_length=4)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_rotation_form(self):
        if self.rotation_deg is not None and self.rotation_quat is not None:
            raise ValueError("give rotation_deg or rotation_quat, not both")
        if self.rotation_quat is not None:
            norm = math.sqrt(sum(c * c for c in self.rotation_quat))
            if abs(norm - 1.0) > 1e-3:
                raise ValueError(f"rotation_quat must be a unit quaternion, its length is {norm:.4f}")
        return self


class Box(_Object):
    shape: Literal["box"]
    size: Size3  # full extents along x, y, z


class Sphere(_Object):
    shape: Literal["sphere"]
    radius: Length


class Cylinder(_Object):
    shape: Literal["cylinder", "cone"]
    radius: Length
    height: Length


class Capsule(_Object):
    shape: Literal["capsule"]
    radius: Length
    height: Length  # the whole height, caps included (so layout reads it like a box's)

    @model_validator(mode="after")
    def _caps_fit(self):
        if self.height <= 2 * self.radius:
            raise ValueError(f"capsule height {self.height:g} must exceed twice its radius ({2 * self.radius:g})")
        return self


class Torus(_Object):
    shape: Literal["torus"]
    radius: Length  # centre of the ring to the centre of the tube, in the local XZ plane
    tube: Length

    @model_validator(mode="after")
    def _tube_fits(self):
        if self.tube >= self.radius:
            raise ValueError(f"torus tube {self.tube:g} must be smaller than its radius {self.radius:g}")
        return self


class Plane(_Object):
    shape: Literal["plane"]
    size: Size2  # extents along local x and z; faces +Y


class MeshAsset(_Object):
    shape: Literal["mesh"]
    asset: AssetPath  # a .glb relative to the scene file, used as it is (metres, +Y up)


SceneObject = Annotated[
    Union[Box, Sphere, Cylinder, Capsule, Torus, Plane, MeshAsset], Field(discriminator="shape")
]


class Light(_Strict):
    """KHR_lights_punctual: directional in lux, point and spot in candela. A directional or spot
    light shines from `position` towards `target`."""

    id: Id
    type: Literal["directional", "point", "spot"]
    intensity: Annotated[float, Field(ge=0, le=200000)]
    color: Rgb = Field(default_factory=lambda: [1.0, 1.0, 1.0])
    position: Vec3 = Field(default_factory=lambda: [0.0, 10.0, 0.0])
    target: Vec3 = Field(default_factory=lambda: [0.0, 0.0, 0.0])
    range: Length | None = None
    inner_cone_deg: Annotated[float, Field(ge=0, le=90)] | None = None
    outer_cone_deg: Annotated[float, Field(gt=0, le=90)] | None = None

    @model_validator(mode="after")
    def _geometry(self):
        if self.type != "point" and self.position == self.target:
            raise ValueError("position and target must differ (they give the light's direction)")
        if self.type != "spot" and (self.inner_cone_deg is not None or self.outer_cone_deg is not None):
            raise ValueError("cone angles apply to spot lights only")
        inner, outer = self.inner_cone_deg or 0.0, self.outer_cone_deg or 45.0
        if self.type == "spot" and inner >= outer:
            raise ValueError(f"inner_cone_deg {inner:g} must be smaller than outer_cone_deg {outer:g}")
        return self


class Camera(_Strict):
    """The one camera: a perspective view from `position` towards `look_at`."""

    position: Vec3
    look_at: Vec3
    up: Vec3 = Field(default_factory=lambda: [0.0, 1.0, 0.0])
    yfov_deg: Annotated[float, Field(gt=0, lt=180)] = 50.0
    aspect: Annotated[float, Field(ge=0.25, le=4)] = 1.0
    znear: Annotated[float, Field(gt=0, le=100)] = 0.05
    zfar: Annotated[float, Field(gt=0, le=10000)] = 200.0

    @model_validator(mode="after")
    def _geometry(self):
        view = [b - a for a, b in zip(self.position, self.look_at)]
        if math.sqrt(sum(v * v for v in view)) < 1e-6:
            raise ValueError("position and look_at must differ")
        cross = [view[1] * self.up[2] - view[2] * self.up[1], view[2] * self.up[0] - view[0] * self.up[2],
                 view[0] * self.up[1] - view[1] * self.up[0]]
        if math.sqrt(sum(c * c for c in cross)) < 1e-6:
            raise ValueError("up must not be parallel to the viewing direction (or zero)")
        if self.znear >= self.zfar:
            raise ValueError(f"znear {self.znear:g} must be smaller than zfar {self.zfar:g}")
        return self


class Room(_Strict):
    """An axis-aligned room; its floor (min y) is the ground for on_floor and no_floating."""

    min: Vec3
    max: Vec3

    @model_validator(mode="after")
    def _ordered(self):
        for axis, lo, hi in zip("xyz", self.min, self.max):
            if hi - lo < 0.001:
                raise ValueError(f"room max {axis} ({hi:g}) must exceed min {axis} ({lo:g})")
        return self


class Scene(BaseModel):
    # `schema` is the version tag; model attributes cannot be named so (BaseModel has .schema)
    version: SchemaVersion = Field(alias="schema")
    units: Literal["m"] = "m"
    up: Literal["+Y"] = "+Y"
    room: Room | None = None
    materials: Annotated[dict[Id, Material], Field(max_length=MAX_MATERIALS)] = Field(default_factory=dict)
    objects: Annotated[list[SceneObject], Field(min_length=1, max_length=MAX_OBJECTS)]
    lights: Annotated[list[Light], Field(max_length=MAX_LIGHTS)] = Field(default_factory=list)
    camera: Camera
    constraints: Annotated[list[Constraint], Field(max_length=MAX_CONSTRAINTS)] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, populate_by_name=True)

    def to_doc(self) -> dict:
        """The JSON document, with only the fields that were written (defaults stay implicit) and
        each object's keys in OBJECT_KEY_ORDER."""
        doc = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        doc["objects"] = [{k: o[k] for k in OBJECT_KEY_ORDER if k in o} for o in doc["objects"]]
        return doc

    def object(self, object_id: str):
        for obj in self.objects:
            if obj.id == object_id:
                return obj
        raise KeyError(object_id)
