"""Relations between objects: each constraint passes and fails, with the measured quantity."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from mainspring.scenes.checks import check_constraints
from mainspring.scenes.constraint_model import Constraint
from tests.scenes.helpers import box, doc, world

CONSTRAINT = TypeAdapter(Constraint)
TABLE = box("table", [1.0, 0.8, 1.0], [0, 0.4, 0])  # top at y = 0.8, x and z in [-0.5, 0.5]


def measure(document: dict, constraint: dict):
    [r] = check_constraints(world(document), [CONSTRAINT.validate_python(constraint)]).results
    return r


def cup(x=0.0, bottom=0.8, z=0.0, **extra):
    return box("cup", [0.1, 0.1, 0.1], [x, bottom + 0.05, z], **extra)


def test_on_top_of_measures_the_gap():
    r = measure(doc(TABLE, cup()), {"type": "on_top_of", "a": "cup", "b": "table"})
    assert r.passed and r.quantity == "gap" and r.unit == "m" and r.value == pytest.approx(0.0, abs=1e-12)
    r = measure(doc(TABLE, cup(bottom=0.9)), {"type": "on_top_of", "a": "cup", "b": "table"})
    assert not r.passed and r.value == pytest.approx(0.1)
    r = measure(doc(TABLE, cup(bottom=0.9)), {"type": "on_top_of", "a": "cup", "b": "table", "tolerance": 0.15})
    assert r.passed and r.value == pytest.approx(0.1)
    r = measure(doc(TABLE, cup(bottom=0.78)), {"type": "on_top_of", "a": "cup", "b": "table"})
    assert not r.passed and r.value == pytest.approx(-0.02)  # sunk 2 cm into the top


def test_on_top_of_needs_the_centre_over_b_exactly_not_its_box():
    off = measure(doc(TABLE, cup(x=0.7)), {"type": "on_top_of", "a": "cup", "b": "table"})
    assert not off.passed and off.value == pytest.approx(0.0, abs=1e-12)
    assert "0.200 m outside b's box" in off.detail
    round_table = {"id": "table", "shape": "cylinder", "radius": 0.5, "height": 0.8, "position": [0, 0.4, 0]}
    corner = measure(doc(round_table, cup(x=0.42, z=0.42)), {"type": "on_top_of", "a": "cup", "b": "table"})
    assert not corner.passed  # within the disc's bounding box, outside the disc
    near_rim = measure(doc(round_table, cup(x=0.3, z=0.3)), {"type": "on_top_of", "a": "cup", "b": "table"})
    assert near_rim.passed


def test_supported_by_needs_contact_and_overlap_only():
    top = box("top", [1.2, 0.05, 0.8], [0, 0.725, 0])
    leg = {"id": "leg", "shape": "cylinder", "radius": 0.03, "height": 0.7, "position": [0.55, 0.35, 0.35]}
    r = measure(doc(top, leg), {"type": "supported_by", "a": "top", "b": "leg"})
    assert r.passed and r.value == pytest.approx(0.0, abs=1e-12) and "0.0036 m^2" in r.detail
    on = measure(doc(top, leg), {"type": "on_top_of", "a": "top", "b": "leg"})
    assert not on.passed  # the top's centre is not over the leg
    away = {**leg, "position": [0.7, 0.35, 0.35]}  # the leg stands beside the top
    r = measure(doc(top, away), {"type": "supported_by", "a": "top", "b": "leg"})
    assert not r.passed and r.value == pytest.approx(0.0, abs=1e-12) and "0.0000 m^2" in r.detail


def test_on_floor_and_the_room_floor():
    r = measure(doc(box("crate", [0.5, 0.5, 0.5], [0, 0.3, 0])), {"type": "on_floor", "a": "crate"})
    assert not r.passed and r.value == pytest.approx(0.05)
    r = measure(doc(box("crate", [0.5, 0.5, 0.5], [0, 0.25, 0])), {"type": "on_floor", "a": "crate"})
    assert r.passed and r.value == pytest.approx(0.0, abs=1e-12)
    room = {"min": [-2, -1, -2], "max": [2, 2, 2]}
    r = measure(doc(box("crate", [0.5, 0.5, 0.5], [0, -0.75, 0]), room=room), {"type": "on_floor", "a": "crate"})
    assert r.passed and r.value == pytest.approx(0.0, abs=1e-12)


def test_inside_room_measures_how_far_out():
    room = {"min": [-2, 0, -2], "max": [2, 3, 2]}
    r = measure(doc(box("bed", [1, 0.5, 2], [0, 0.25, 0]), room=room), {"type": "inside_room", "a": "bed"})
    assert r.passed and r.quantity == "outside" and r.value == 0.0
    r = measure(doc(box("bed", [1, 0.5, 2], [0, 0.25, 1.3]), room=room), {"type": "inside_room", "a": "bed"})
    assert not r.passed and r.value == pytest.approx(0.3)


def test_above_and_below_measure_the_vertical_gap():
    lamp = box("lamp", [0.3, 0.2, 0.3], [0, 1.4, 0])  # bottom at 1.3: 0.5 above the table
    r = measure(doc(TABLE, lamp), {"type": "above", "a": "lamp", "b": "table"})
    assert r.passed and r.value == pytest.approx(0.5)
    r = measure(doc(TABLE, lamp), {"type": "above", "a": "lamp", "b": "table", "min": 0.6})
    assert not r.passed and r.value == pytest.approx(0.5)
    r = measure(doc(TABLE, lamp), {"type": "below", "a": "lamp", "b": "table"})
    assert not r.passed and r.value == pytest.approx(-1.5)  # table bottom 0 minus lamp top 1.5
    r = measure(doc(TABLE, lamp), {"type": "below", "a": "table", "b": "lamp"})
    assert r.passed and r.value == pytest.approx(0.5)


@pytest.mark.parametrize("kind, a_pos, passed, gap", [
    ("left_of", [-1, 0.25, 0], True, 0.5), ("right_of", [-1, 0.25, 0], False, -1.5),
    ("left_of", [1, 0.25, 0], False, -1.5), ("right_of", [1, 0.25, 0], True, 0.5),
    ("in_front_of", [0, 0.25, 1], True, 0.5), ("in_front_of", [0, 0.25, -1], False, -1.5),
    ("behind", [0, 0.25, 1], False, -1.5), ("behind", [0, 0.25, -0.6], True, 0.1),
    ("behind", [0, 0.25, -0.45], False, -0.05),
])
def test_world_directions(kind, a_pos, passed, gap):
    a, b = box("a", [0.5, 0.5, 0.5], a_pos), box("b", [0.5, 0.5, 0.5], [0, 0.25, 0])
    r = measure(doc(a, b), {"type": kind, "a": "a", "b": "b"})
    assert (r.passed, r.quantity) == (passed, "gap") and r.value == pytest.approx(gap)


def test_touching_counts_and_min_asks_for_a_margin():
    a, b = box("a", [0.5, 0.5, 0.5], [-0.5, 0.25, 0]), box("b", [0.5, 0.5, 0.5], [0, 0.25, 0])
    assert measure(doc(a, b), {"type": "left_of", "a": "a", "b": "b"}).passed
    r = measure(doc(a, b), {"type": "left_of", "a": "a", "b": "b", "min": 0.2})
    assert not r.passed and r.value == pytest.approx(0.0, abs=1e-12)


def test_camera_and_object_frames():
    camera = {"position": [4, 1, 0], "look_at": [0, 0.25, 0]}  # looking down -X: its right is world -Z
    a, b = box("a", [0.5, 0.5, 0.5], [0, 0.25, -1]), box("b", [0.5, 0.5, 0.5], [0, 0.25, 1])
    r = measure(doc(a, b, camera=camera), {"type": "right_of", "a": "a", "b": "b", "frame": "camera"})
    assert r.passed and r.value == pytest.approx(1.5)
    r = measure(doc(a, b, camera=camera), {"type": "behind", "a": "a", "b": "b"})  # in world axes, -Z is behind
    assert r.passed and r.value == pytest.approx(1.5)
    turned_b = box("b", [0.5, 0.5, 0.5], [0, 0.25, 1], rotation_deg=[0, 90, 0])  # b's +X is world -Z
    r = measure(doc(a, turned_b), {"type": "right_of", "a": "a", "b": "b", "frame": "b"})
    assert r.passed and r.value == pytest.approx(1.5)
    r = measure(doc(a, turned_b), {"type": "left_of", "a": "a", "b": "b", "frame": "b"})
    assert not r.passed and r.value == pytest.approx(-2.5)


def test_near_and_far_measure_the_gap_between_boxes():
    a, b = box("a", [1, 1, 1], [-1, 0.5, 0]), box("b", [1, 1, 1], [1, 0.5, 0])  # 1 m apart
    for kind, limit, passed in (("near", 1.5, True), ("near", 0.5, False), ("far", 0.5, True), ("far", 1.5, False)):
        key = "max" if kind == "near" else "min"
        r = measure(doc(a, b), {"type": kind, "a": "a", "b": "b", key: limit})
        assert (r.passed, r.quantity) == (passed, "distance") and r.value == pytest.approx(1.0)
    diagonal = box("b", [1, 1, 1], [1, 0.5, 2])
    assert measure(doc(a, diagonal), {"type": "near", "a": "a", "b": "b"}).value == pytest.approx(2 ** 0.5)


@pytest.mark.parametrize("yaw, angle", [(180, 0.0), (150, 30.0), (90, 90.0), (0, 180.0)])
def test_facing_measures_the_angle_seen_from_above(yaw, angle):
    chair = box("chair", [0.5, 0.9, 0.5], [0, 0.45, 2], rotation_deg=[0, yaw, 0])
    tv = box("tv", [1, 0.6, 0.1], [0, 1.2, 0])  # higher than the chair: the pitch does not count
    r = measure(doc(chair, tv), {"type": "facing", "a": "chair", "b": "tv", "max_deg": 30.5})
    assert r.quantity == "angle" and r.unit == "deg" and r.value == pytest.approx(angle, abs=1e-6)
    assert r.passed == (angle <= 30.5)


def test_aligned_measures_the_centre_offset():
    a, b = box("a", [0.5, 0.5, 0.5], [0.005, 0.25, 0]), box("b", [0.3, 0.3, 0.3], [0, 0.15, 2])
    r = measure(doc(a, b), {"type": "aligned", "a": "a", "b": "b", "axis": "x"})
    assert r.passed and r.value == pytest.approx(0.005)
    r = measure(doc(a, b), {"type": "aligned", "a": "a", "b": "b", "axis": "z"})
    assert not r.passed and r.value == pytest.approx(2.0)
