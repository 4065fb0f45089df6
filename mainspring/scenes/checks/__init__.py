"""The constraint checker: each constraint of a scene (or of a brief) measured on the placed scene.

Visibility constraints need a render; it is made once, only when one of them is present, unless
the caller passes the frame it already has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mainspring.scenes.checks import overlap, relations, visibility
from mainspring.scenes.checks.result import ConstraintResult
from mainspring.scenes.preview.frame import Frame
from mainspring.scenes.world import World

_GEOMETRIC: dict[str, Callable] = {
    "on_top_of": relations.contact, "supported_by": relations.contact,
    "on_floor": relations.grounded, "inside_room": relations.grounded,
    **{t: relations.ordering for t in ("above", "below", "left_of", "right_of", "in_front_of", "behind")},
    "near": relations.distance, "far": relations.distance,
    "facing": relations.facing, "aligned": relations.aligned,
    "no_overlap": overlap.no_overlap, "no_floating": overlap.no_floating,
    "in_frame": visibility.in_frame,
}


@dataclass
class CheckReport:
    results: list[ConstraintResult]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def num_passed(self) -> int:
        return sum(r.passed for r in self.results)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "num_passed": self.num_passed, "num_constraints": len(self.results),
                "results": [r.to_dict() for r in self.results]}


def check_constraints(world: World, constraints: list | None = None,
                      frame: Frame | Callable[[], Frame] | None = None) -> CheckReport:
    """Measure `constraints` (the scene's own when None) on `world`. `frame` is a rendered frame,
    or a function that renders one; by default the shared renderer is used when needed."""
    constraints = world.scene.constraints if constraints is None else constraints
    rendered: Frame | str | None = frame if isinstance(frame, Frame) else None
    render = None if isinstance(frame, Frame) else frame
    results = []
    for i, c in enumerate(constraints):
        if c.type == "visible_in_camera":
            if rendered is None:
                rendered = _render(world, render)
            results.append(visibility.visible_in_camera(i, c, world, rendered))
        else:
            results.append(_GEOMETRIC[c.type](i, c, world))
    return CheckReport(results)


def _render(world: World, frame: Callable[[], Frame] | None) -> Frame | str:
    from mainspring.scenes.preview import RenderUnavailable, shared_renderer

    try:
        return frame() if frame is not None else shared_renderer().render(world)
    except RenderUnavailable as exc:
        return str(exc)  # reported on each visibility constraint instead of failing the whole check


__all__ = ["CheckReport", "ConstraintResult", "check_constraints"]
