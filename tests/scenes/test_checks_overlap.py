"""no_overlap (boxes, then exact meshes) and no_floating, with the measured volume and gap."""

from __future__ import annotations

import pytest
import trimesh

from mainspring.scenes.checks import check_constraints, geometry
from tests.scenes.helpers import box, doc, sphere, world
from tests.scenes.test_checks_relations import CONSTRAINT, measure

TABLE = box("table", [1.0, 0.8, 1.0], [0, 0.4, 0])


def test_overlap_volume_is_exact():
    a, b = box("a", [1, 1, 1], [0, 0.5, 0]), box("b", [1, 1, 1], [0.5, 0.5, 0])
    r = measure(doc(a, b), {"type": "no_overlap"})
    assert not r.passed and r.quantity == "overlap_volume" and r.unit == "m^3"
    assert r.value == pytest.approx(0.5, rel=1e-5) and "a~b 0.500000 m^3" in r.detail
    ball = sphere("ball", 0.5, [0, 1.5, 0])
    sunk = sphere("ball", 0.5, [0, 1.3, 0])  # sunk 0.2 m into a's top: a spherical cap of height 0.2
    r = measure(doc(a, sunk), {"type": "no_overlap"})
    cap = 3.14159265 * 0.2 ** 2 * (3 * 0.5 - 0.2) / 3
    assert not r.passed and r.value == pytest.approx(cap, rel=0.03)  # tessellated sphere vs the true one
    assert measure(doc(a, ball), {"type": "no_overlap"}).passed  # resting on top: contact, no volume


def test_boxes_that_overlap_are_not_enough_the_meshes_decide():
    a = box("a", [1, 1, 1], [0, 0.5, 0])
    ball = sphere("ball", 0.5, [0.85, 1.35, 0.85])  # in the air beyond a's corner
    w = world(doc(a, ball))
    assert geometry.box_penetration(w.by_id["a"], w.by_id["ball"]) == pytest.approx(0.15)
    r = measure(doc(a, ball), {"type": "no_overlap"})
    assert r.passed and r.value == 0.0


def test_tolerance_ignored_collisions_planes_and_subsets():
    a = box("a", [1, 1, 1], [0, 0.5, 0])
    touching = box("b", [0.5, 0.5, 0.5], [0, 1.245, 0])  # 5 mm into a's top
    assert measure(doc(a, touching), {"type": "no_overlap"}).passed
    r = measure(doc(a, touching), {"type": "no_overlap", "tolerance": 0.001})
    assert not r.passed and r.value == pytest.approx(0.25 * 0.005)
    inside = box("b", [0.2, 0.2, 0.2], [0, 0.5, 0], tags=["ignore_collision"])
    assert measure(doc(a, inside), {"type": "no_overlap"}).passed
    floor = {"id": "floor", "shape": "plane", "size": [5, 5], "position": [0, 0.5, 0]}  # through the middle of a
    assert measure(doc(a, floor), {"type": "no_overlap"}).passed
    c = box("c", [1, 1, 1], [0.5, 0.5, 0])
    far = box("d", [1, 1, 1], [5, 0.5, 0])
    assert measure(doc(a, c, far), {"type": "no_overlap", "ids": ["a", "d"]}).passed
    assert not measure(doc(a, c, far), {"type": "no_overlap", "ids": ["a", "c"]}).passed


def test_no_floating_reports_the_gap_to_the_surface_below():
    cup = box("cup", [0.1, 0.1, 0.1], [0, 0.95, 0])  # 0.1 above the table
    r = measure(doc(TABLE, cup), {"type": "no_floating"})
    assert not r.passed and r.quantity == "gap" and r.value == pytest.approx(0.1)
    assert "1 of 2 unsupported: cup (+0.100 m)" in r.detail
    resting = box("cup", [0.1, 0.1, 0.1], [0, 0.85, 0])
    r = measure(doc(TABLE, resting), {"type": "no_floating"})
    assert r.passed and r.value == 0.0 and "all 2 objects" in r.detail
    sunk = box("crate", [0.5, 0.5, 0.5], [3, 0.2, 0])  # 5 cm into the floor
    r = measure(doc(TABLE, sunk), {"type": "no_floating"})
    assert not r.passed and r.value == pytest.approx(-0.05)


def test_hanging_wall_mounted_and_attached_objects_need_no_support():
    lamp = box("lamp", [0.3, 0.2, 0.3], [0, 2.0, 0], tags=["hanging"])
    shelf = box("shelf", [1, 0.03, 0.3], [2, 1.2, 0], tags=["wall_mounted"])
    handle = box("handle", [0.02, 0.05, 0.02], [0.6, 0.2, 0], parent="table")  # attached to the table's side
    assert measure(doc(TABLE, lamp, shelf, handle), {"type": "no_floating"}).passed
    r = measure(doc(TABLE, {**lamp, "tags": []}), {"type": "no_floating", "ids": ["lamp"]})
    assert not r.passed and r.value == pytest.approx(1.1)  # above the table's top at 0.8


def test_an_open_mesh_asset_falls_back_to_its_bounding_box(tmp_path):
    (tmp_path / "assets").mkdir()
    cup = trimesh.creation.box(extents=[0.4, 0.4, 0.4])
    open_cup = trimesh.Trimesh(cup.vertices, cup.faces[:-2])  # its top is missing: no inside to intersect
    open_cup.export(tmp_path / "assets" / "open.glb")
    a = box("a", [1, 1, 1], [0, 0.5, 0])
    asset = {"id": "bowl", "shape": "mesh", "asset": "assets/open.glb", "position": [0.5, 0.5, 0]}
    [r] = check_constraints(world(doc(a, asset), tmp_path),
                            [CONSTRAINT.validate_python({"type": "no_overlap"})]).results
    assert not r.passed and r.value == pytest.approx(0.2 * 0.4 * 0.4)  # x 0.3..0.5, y and z full
    assert "bounding boxes used for bowl (not watertight)" in r.detail
