"""The `constraints` of a scene: the intent ("the cup is on the table"), stated in a small named
vocabulary that checks/ measures. One model per family of relations, discriminated by `type`.

`tolerance` is the contact tolerance in metres (1 cm unless given). Directions (`left_of` ...)
are taken in a `frame`: `world` (+X right, +Y up, +Z front, i.e. towards a viewer looking down -Z),
`camera` (the camera's right, up and the direction towards it) or `b` (b's own axes: what someone
standing in front of b, facing it, calls right/up/front; for an unrotated b that is `world`).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Id = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
Tolerance = Annotated[float, Field(ge=0, le=0.5)]
Distance = Annotated[float, Field(ge=0, le=1000)]
# "*" = every object of the scene (planes and ignore_collision objects excepted where noted)
ObjectSet = Union[Literal["*"], Annotated[list[Id], Field(min_length=1, max_length=500)]]

# each family's names once, as the Literal a type checker reads and the tuple code iterates
ContactType = Literal["on_top_of", "supported_by"]
GroundedType = Literal["on_floor", "inside_room"]
OrderingType = Literal["above", "below", "left_of", "right_of", "in_front_of", "behind"]
CONTACT: tuple[str, ...] = get_args(ContactType)
GROUNDED: tuple[str, ...] = get_args(GroundedType)
ORDERING: tuple[str, ...] = get_args(OrderingType)
CONSTRAINT_TYPES = (*CONTACT, *GROUNDED, *ORDERING, "near", "far", "facing", "aligned", "no_overlap",
                    "no_floating", "visible_in_camera", "in_frame")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Contact(_Strict):
    """on_top_of: a rests on b's top (gap within tolerance) with a's footprint centre over b.
    supported_by: the same contact with any footprint overlap (a top on its legs)."""

    type: ContactType
    a: Id
    b: Id
    tolerance: Tolerance = 0.01


class Grounded(_Strict):
    """on_floor: a's bottom on the floor (room min y, else y = 0). inside_room: a within the room."""

    type: GroundedType
    a: Id
    tolerance: Tolerance = 0.01


class Ordering(_Strict):
    """a lies beyond b along a direction of `frame`, their extents apart by at least `min` metres
    (touching counts, within tolerance)."""

    type: OrderingType
    a: Id
    b: Id
    frame: Literal["world", "camera", "b"] = "world"
    min: Distance = 0.0
    tolerance: Tolerance = 0.01


class Near(_Strict):
    """The gap between a's and b's bounding boxes is at most `max` metres."""

    type: Literal["near"]
    a: Id
    b: Id
    max: Distance = 1.5


class Far(_Strict):
    """The gap between a's and b's bounding boxes is at least `min` metres."""

    type: Literal["far"]
    a: Id
    b: Id
    min: Distance = 1.5


class Facing(_Strict):
    """a's front (+Z) points at b's centre within `max_deg`, measured in the horizontal plane."""

    type: Literal["facing"]
    a: Id
    b: Id
    max_deg: Annotated[float, Field(gt=0, le=180)] = 30.0


class Aligned(_Strict):
    """a's and b's bounding-box centres agree along `axis` (world) within tolerance."""

    type: Literal["aligned"]
    a: Id
    b: Id
    axis: Literal["x", "y", "z"] = "x"
    tolerance: Tolerance = 0.01


class NoOverlap(_Strict):
    """No two of `ids` interpenetrate by more than tolerance (boxes first, then exact meshes)."""

    type: Literal["no_overlap"]
    ids: ObjectSet = "*"
    tolerance: Tolerance = 0.01


class NoFloating(_Strict):
    """Each of `ids` is on the floor or supported by another object, unless hanging/wall_mounted."""

    type: Literal["no_floating"]
    ids: ObjectSet = "*"
    tolerance: Tolerance = 0.01


class VisibleInCamera(_Strict):
    """At least `min_pixels` of a's pixels are visible in the 512-wide ID-buffer render."""

    type: Literal["visible_in_camera"]
    a: Id
    min_pixels: Annotated[int, Field(ge=1, le=1_000_000)] = 50


class InFrame(_Strict):
    """a's projected bounding box lies inside the image, `margin_px` from its edges."""

    type: Literal["in_frame"]
    a: Id
    margin_px: Annotated[int, Field(ge=0, le=256)] = 0


Constraint = Annotated[
    Union[Contact, Grounded, Ordering, Near, Far, Facing, Aligned, NoOverlap, NoFloating, VisibleInCamera, InFrame],
    Field(discriminator="type"),
]
