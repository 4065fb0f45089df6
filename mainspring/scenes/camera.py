"""The scene camera as matrices (OpenGL clip conventions) and as a pixel projection, shared by the
renderer and the in_frame check so both see exactly the same image."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mainspring.scenes.model import Camera
from mainspring.scenes.transforms import look_at_rotation

PREVIEW_WIDTH = 512


@dataclass(frozen=True)
class View:
    view: np.ndarray  # 4x4 world -> camera (camera looks down its -Z)
    projection: np.ndarray  # 4x4 camera -> clip
    width: int
    height: int
    position: np.ndarray

    @property
    def view_projection(self) -> np.ndarray:
        return self.projection @ self.view

    @property
    def right(self) -> np.ndarray:
        return self.view[0, :3]

    @property
    def up(self) -> np.ndarray:
        return self.view[1, :3]

    @property
    def backward(self) -> np.ndarray:
        """From the scene towards the camera (the camera's +Z)."""
        return self.view[2, :3]

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pixel x/y of each world point, mask of points in front of the near plane). Pixel (0, 0)
        is the top-left corner of the image, y grows downwards."""
        homo = np.c_[points, np.ones(len(points))] @ self.view_projection.T
        in_front = homo[:, 3] > 1e-9
        w = np.where(in_front, homo[:, 3], 1.0)
        ndc = homo[:, :2] / w[:, None]
        px = (ndc[:, 0] + 1) / 2 * self.width
        py = (1 - ndc[:, 1]) / 2 * self.height
        return np.c_[px, py], in_front & (-homo[:, 2] <= homo[:, 3])


def image_size(camera: Camera, width: int = PREVIEW_WIDTH) -> tuple[int, int]:
    return width, max(1, round(width / camera.aspect))


def camera_view(camera: Camera, width: int = PREVIEW_WIDTH) -> View:
    w, h = image_size(camera, width)
    rot = look_at_rotation(camera.position, camera.look_at, camera.up)
    view = np.eye(4)
    view[:3, :3] = rot.T
    view[:3, 3] = -rot.T @ np.asarray(camera.position, dtype=float)
    f = 1 / math.tan(math.radians(camera.yfov_deg) / 2)
    n, far = camera.znear, camera.zfar
    projection = np.array([
        [f * h / w, 0, 0, 0],  # x scaled by the image's own aspect, so pixels stay square
        [0, f, 0, 0],
        [0, 0, (far + n) / (n - far), 2 * far * n / (n - far)],
        [0, 0, -1, 0],
    ])
    return View(view, projection, w, h, np.asarray(camera.position, dtype=float))
