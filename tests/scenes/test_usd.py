"""USD export: the stage read back with pxr has the scene's geometry where the checker places it,
metres and +Y up, the camera's field of view and the lights; and it gives the document back."""

from __future__ import annotations


import numpy as np
import pytest

from mainspring.scenes import SceneError, load_scene
from mainspring.scenes.world import build_world
from tests.scenes.helpers import living_room

pxr = pytest.importorskip("pxr", reason="usd-core is not installed (pip install usd-core, or mainspring[usd])")
from pxr import Usd, UsdGeom, UsdLux  # noqa: E402

from mainspring.scenes.usd_export import from_usd, to_usda, write_usd  # noqa: E402


def test_the_stage_read_back_matches_the_scene(tmp_path):
    scene = load_scene(living_room())
    world = build_world(scene)
    path = tmp_path / "room.usdc"
    write_usd(scene, path)
    stage = Usd.Stage.Open(str(path))
    assert UsdGeom.GetStageUpAxis(stage) == UsdGeom.Tokens.y and UsdGeom.GetStageMetersPerUnit(stage) == 1.0
    assert stage.GetDefaultPrim().GetPath() == "/scene"
    cache = UsdGeom.BBoxCache(Usd.TimeCode.Default(), [UsdGeom.Tokens.default_])
    meshes = [p for p in stage.Traverse() if p.IsA(UsdGeom.Mesh)]
    assert len(meshes) == len(scene.objects)
    for p in world.placed:
        [mesh] = [m for m in meshes if m.GetParent().GetName() == p.id]
        prim = mesh.GetParent()
        # the mesh's own points through USD's composed transform (children apart): the checker's box
        to_world = np.array(UsdGeom.Xformable(mesh).ComputeLocalToWorldTransform(Usd.TimeCode.Default()))
        points = np.array(UsdGeom.Mesh(mesh).GetPointsAttr().Get(), dtype=float)
        placed = np.c_[points, np.ones(len(points))] @ to_world  # USD: row vectors
        assert np.allclose(placed[:, :3].min(axis=0), p.lo, atol=1e-4), p.id
        assert np.allclose(placed[:, :3].max(axis=0), p.hi, atol=1e-4), p.id
        box = cache.ComputeWorldBound(mesh).ComputeAlignedRange()  # USD's own bound contains it
        assert np.all(np.array(box.GetMin()) <= p.lo + 1e-4) and np.all(np.array(box.GetMax()) >= p.hi - 1e-4)
        parent = p.obj.parent
        assert prim.GetParent().GetName() == (parent or "scene")  # the hierarchy is the document's
    camera = UsdGeom.Camera(stage.GetPrimAtPath("/scene/camera")).GetCamera(Usd.TimeCode.Default())
    assert camera.GetFieldOfView(camera.FOVVertical) == pytest.approx(scene.camera.yfov_deg, abs=1e-3)  # degrees
    eye = camera.transform.ExtractTranslation()
    assert np.allclose(list(eye), scene.camera.position)
    kinds = {p.GetName(): p for p in stage.Traverse() if p.HasAPI(UsdLux.LightAPI) or p.IsA(UsdLux.BoundableLightBase)
             or p.IsA(UsdLux.NonboundableLightBase)}
    assert set(kinds) == {light.id for light in scene.lights}


def test_scene_to_usd_to_scene_is_the_identity(tmp_path):
    doc = living_room()
    assert from_usd(to_usda(load_scene(doc))) == load_scene(doc).to_doc()
    write_usd(load_scene(doc), tmp_path / "room.usda")
    assert load_scene(from_usd(tmp_path / "room.usda")) == load_scene(doc)


def test_usd_errors_are_scene_errors(tmp_path):
    with pytest.raises(SceneError, match="ends in .usda"):
        write_usd(load_scene(living_room()), tmp_path / "room.glb")
    foreign = Usd.Stage.CreateInMemory()
    UsdGeom.Xform.Define(foreign, "/world")
    with pytest.raises(SceneError, match="no scene/0.1 source"):
        from_usd(foreign.GetRootLayer().ExportToString())  # `foreign` holds its layer alive
    with pytest.raises(SceneError, match="not USD text"):
        from_usd("this is not usd {")


def test_scene_export_writes_usd_by_the_suffix(tmp_path):
    import json

    from typer.testing import CliRunner

    from mainspring.scenes.cli import app

    src = tmp_path / "room.json"
    src.write_text(json.dumps(living_room()))
    result = CliRunner().invoke(app, ["export", str(src), "--out", str(tmp_path / "room.usda")])
    assert result.exit_code == 0 and "wrote" in result.stdout
    assert load_scene(from_usd(tmp_path / "room.usda")) == load_scene(living_room())
