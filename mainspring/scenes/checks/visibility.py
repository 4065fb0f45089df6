"""What the camera sees: visible pixels from the ID-buffer render, and whether an object's
projection lies inside the image."""

from __future__ import annotations

import numpy as np

from mainspring.scenes.camera import camera_view
from mainspring.scenes.checks.result import ConstraintResult, result
from mainspring.scenes.preview.frame import Frame
from mainspring.scenes.world import World


def visible_in_camera(i: int, c, world: World, frame: Frame | str) -> ConstraintResult:
    """`frame` is the rendered frame, or the reason there is none."""
    if isinstance(frame, str):
        return result(i, c, False, "pixels", None, "px", f"not measured: {frame}")
    pixels = frame.pixel_counts()[c.a]
    h, w = frame.ids.shape
    return result(i, c, pixels >= c.min_pixels, "pixels", pixels, "px",
                  f"{pixels} of {c.a}'s pixels visible in the {w}x{h} ID buffer (>= {c.min_pixels} needed)")


def in_frame(i: int, c, world: World) -> ConstraintResult:
    view = camera_view(world.scene.camera)
    p = world.by_id[c.a]
    pixels, in_front = view.project(p.vertices)
    if not in_front.all():
        where = "entirely" if not in_front.any() else "partly"
        return result(i, c, False, "outside_px", None, "px", f"{c.a} is {where} behind the camera's near plane")
    m = c.margin_px
    outside = np.stack([m - pixels[:, 0], pixels[:, 0] - (view.width - m),
                        m - pixels[:, 1], pixels[:, 1] - (view.height - m)]).max(axis=0)
    worst = max(float(outside.max()), 0.0)
    edge = f"the image's {m} px margin" if m else "the image's edges"
    where = "lies within" if worst <= 0.0 else f"reaches {worst:.1f} px past"
    return result(i, c, worst <= 0.0, "outside_px", worst, "px",
                  f"{c.a}'s projection {where} {edge} ({view.width}x{view.height})")
