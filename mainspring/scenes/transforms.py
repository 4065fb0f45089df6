"""Rotations and 4x4 transforms, as glTF composes them: local = T · R · S, world = parent · local."""

from __future__ import annotations

import math

import numpy as np


def rotation_from_degrees(deg: list[float]) -> np.ndarray:
    """3x3 R = Rz · Ry · Rx: extrinsic rotations about world X, then Y, then Z."""
    x, y, z = (math.radians(d) for d in deg)
    cx, sx, cy, sy, cz, sz = math.cos(x), math.sin(x), math.cos(y), math.sin(y), math.cos(z), math.sin(z)
    rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return rz @ ry @ rx


def rotation_from_quat(q: list[float]) -> np.ndarray:
    """3x3 rotation of the quaternion [x, y, z, w] (normalised first)."""
    x, y, z, w = np.asarray(q, dtype=float) / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def quat_from_rotation(r: np.ndarray) -> list[float]:
    """[x, y, z, w] of a 3x3 rotation, w >= 0 (Shepperd's method: stable for every rotation)."""
    t = np.trace(r)
    if t > 0:
        s = 2 * math.sqrt(t + 1)
        q = [(r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s, s / 4]
    else:
        i = int(np.argmax(np.diag(r)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2 * math.sqrt(max(1 + r[i, i] - r[j, j] - r[k, k], 1e-300))
        q = [0.0, 0.0, 0.0, (r[k, j] - r[j, k]) / s]
        q[i], q[j], q[k] = s / 4, (r[j, i] + r[i, j]) / s, (r[k, i] + r[i, k]) / s
    unit = np.asarray(q, dtype=float)
    unit /= np.linalg.norm(unit)
    return (-unit if unit[3] < 0 else unit).tolist()


def object_rotation(obj) -> np.ndarray:
    if obj.rotation_quat is not None:
        return rotation_from_quat(obj.rotation_quat)
    if obj.rotation_deg is not None:
        return rotation_from_degrees(obj.rotation_deg)
    return np.eye(3)


def trs_matrix(translation, rotation: np.ndarray, scale) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = rotation * np.asarray(scale, dtype=float)  # R · diag(S): columns scaled
    m[:3, 3] = translation
    return m


def local_matrix(obj) -> np.ndarray:
    """The object's transform relative to its parent (or the world)."""
    return trs_matrix(obj.position, object_rotation(obj), obj.scale or (1.0, 1.0, 1.0))


def world_matrices(objects) -> dict[str, np.ndarray]:
    """id -> world matrix for every object; parents must resolve and be acyclic (validated)."""
    by_id = {o.id: o for o in objects}
    out: dict[str, np.ndarray] = {}

    def world(obj) -> np.ndarray:
        if obj.id not in out:
            local = local_matrix(obj)
            out[obj.id] = local if obj.parent is None else world(by_id[obj.parent]) @ local
        return out[obj.id]

    for obj in objects:
        world(obj)
    return out


def look_at_rotation(eye, target, up=(0.0, 1.0, 0.0)) -> np.ndarray:
    """3x3 rotation whose -Z axis points from eye to target and whose +Y is as close to `up` as
    possible: how glTF cameras and lights are aimed."""
    forward = np.asarray(target, dtype=float) - np.asarray(eye, dtype=float)
    forward /= np.linalg.norm(forward)
    up = np.asarray(up, dtype=float)
    if np.linalg.norm(np.cross(forward, up)) < 1e-6:  # looking straight along `up`: any side works
        up = np.array([0.0, 0.0, -1.0]) if abs(forward[1]) > 0.9 else np.array([0.0, 1.0, 0.0])
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    true_up = np.cross(right, forward)
    return np.column_stack([right, true_up, -forward])
