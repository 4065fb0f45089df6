"""Rotations, transforms and tessellation: the conventions every other part relies on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mainspring.scenes.tessellate import _primitive
from mainspring.scenes.transforms import (look_at_rotation, quat_from_rotation, rotation_from_degrees,
                                          rotation_from_quat)
from tests.scenes.helpers import box, doc, world


def test_degrees_rotate_about_x_then_y_then_z_in_world_axes():
    r = rotation_from_degrees([90, 90, 0])
    # x first: +Y -> +Z; then y: +Z -> +X
    assert r @ [0, 1, 0] == pytest.approx([1, 0, 0], abs=1e-12)
    assert rotation_from_degrees([0, 90, 0]) @ [0, 0, 1] == pytest.approx([1, 0, 0], abs=1e-12)
    assert rotation_from_degrees([0, 0, 90]) @ [1, 0, 0] == pytest.approx([0, 1, 0], abs=1e-12)


@pytest.mark.parametrize("deg", [[0, 0, 0], [0, 25, 0], [90, 90, 0], [180, 0, 0], [10, -170, 95], [0, 180, 0]])
def test_quaternions_round_trip(deg):
    r = rotation_from_degrees(deg)
    q = quat_from_rotation(r)
    assert math.isclose(np.linalg.norm(q), 1.0) and q[3] >= 0
    assert rotation_from_quat(q) == pytest.approx(r, abs=1e-9)


def test_look_at_points_minus_z_at_the_target():
    r = look_at_rotation([0, 2, 5], [0, 2, 0])
    assert r @ [0, 0, -1] == pytest.approx([0, 0, -1])
    r = look_at_rotation([1, 5, 0], [1, 0, 0])  # straight down: still a rotation
    assert r @ [0, 0, -1] == pytest.approx([0, -1, 0]) and np.linalg.det(r) == pytest.approx(1.0)


@pytest.mark.parametrize("shape, params, lo, hi", [
    ("box", (1.0, 2.0, 3.0), [-0.5, -1, -1.5], [0.5, 1, 1.5]),
    ("sphere", (0.5,), [-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]),
    ("cylinder", (0.2, 1.0), [-0.2, -0.5, -0.2], [0.2, 0.5, 0.2]),
    ("cone", (0.2, 1.0), [-0.2, -0.5, -0.2], [0.2, 0.5, 0.2]),
    ("capsule", (0.2, 1.0), [-0.2, -0.5, -0.2], [0.2, 0.5, 0.2]),  # height includes the caps
    ("torus", (0.5, 0.1), [-0.6, -0.1, -0.6], [0.6, 0.1, 0.6]),  # the ring lies flat (axis +Y)
    ("plane", (2.0, 3.0), [-1, 0, -1.5], [1, 0, 1.5]),
])
def test_primitives_are_centred_and_run_along_y(shape, params, lo, hi):
    mesh = _primitive(shape, *params)
    assert mesh.solid.bounds[0] == pytest.approx(lo, abs=1e-9)
    assert mesh.solid.bounds[1] == pytest.approx(hi, abs=1e-9)
    assert mesh.has_volume == (shape != "plane")


def test_cone_apex_is_up_and_plane_faces_up():
    cone = _primitive("cone", 0.2, 1.0).solid
    top = cone.vertices[np.argmax(cone.vertices[:, 1])]
    assert top == pytest.approx([0, 0.5, 0], abs=1e-9)
    assert _primitive("plane", 1.0, 1.0).solid.face_normals == pytest.approx(np.array([[0, 1, 0], [0, 1, 0]]))


def test_surfaces_split_at_hard_edges_and_stay_smooth_on_curves():
    cube = _primitive("box", 1.0, 1.0, 1.0).surface
    assert len(cube.vertices) == 24  # 4 per face: each corner once per face, with that face's normal
    normals = np.round(np.asarray(cube.vertex_normals), 9)
    assert {tuple(n) for n in normals} == {(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)}
    sphere = _primitive("sphere", 1.0)
    assert len(sphere.surface.vertices) == len(sphere.solid.vertices)  # no crease anywhere
    radial = sphere.surface.vertices / np.linalg.norm(sphere.surface.vertices, axis=1, keepdims=True)
    assert np.min(np.sum(radial * sphere.surface.vertex_normals, axis=1)) > 0.99


def test_children_are_placed_in_their_parent_frame():
    w = world(doc(box("table", [2, 1, 1], [1, 0.5, 0], rotation_deg=[0, 90, 0], scale=[1, 2, 1]),
                  box("lamp", [0.2, 0.2, 0.2], [0.5, 0.6, 0], parent="table")))
    lamp = w.by_id["lamp"]
    # the table turns +X into -Z and doubles local heights: (0.5, 0.6, 0) -> (0, 1.2, -0.5), then shifts by (1, 0.5, 0)
    assert lamp.centre == pytest.approx([1.0, 1.7, -0.5])
    assert lamp.hi - lamp.lo == pytest.approx([0.2, 0.4, 0.2])
