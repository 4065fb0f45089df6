"""The renderer setting and the optional Blender backend: a typed choice; without bpy the render
job keeps the moderngl preview and says why; with bpy, Cycles renders and the .blend reopens with
every object (skipped where bpy is absent)."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from PIL import Image

from mainspring.scenes import load_scene, render_job
from mainspring.scenes.blender_render import blender_unavailable_reason, render_blender
from mainspring.scenes.render_settings import RenderSettings
from tests.scenes.helpers import living_room

NO_BPY = blender_unavailable_reason()


def test_the_renderer_is_a_typed_setting():
    assert RenderSettings().renderer == "moderngl" and RenderSettings().job_args() == []
    assert RenderSettings("blender", 256, 8).job_args() == ["--width", "256", "--renderer", "blender", "--samples", "8"]
    for bad in ({"renderer": "povray"}, {"width": 8}, {"samples": 0}):
        with pytest.raises(ValueError):
            RenderSettings(**bad)


@pytest.mark.skipif(NO_BPY is None, reason="bpy is installed: the fallback does not happen")
def test_without_bpy_the_job_keeps_the_moderngl_preview_and_says_why(tmp_path):
    (tmp_path / "scene.json").write_text(json.dumps(living_room()))
    status = render_job.run(tmp_path / "scene.json", tmp_path / "out", settings=RenderSettings("blender", 128))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert status == 0 and report["preview_renderer"] == "moderngl"
    assert "bpy is not installed" in report["renderer_fallback"]
    assert Image.open(tmp_path / "out" / "preview.png").size == (128, 128)
    with pytest.raises(SystemExit):
        render_job.main([str(tmp_path / "scene.json"), str(tmp_path / "o2"), "--renderer", "povray"])

    from mainspring.agents.tools.base import ToolContext
    from mainspring.scenarios.scene3d.tools import scene_render_tool

    tool = scene_render_tool(RenderSettings("blender", 128))
    ctx = ToolContext(run_id="run", call_id="call", idempotency_key="key", workspace=tmp_path)
    result = asyncio.run(tool.call({"scene": living_room()}, ctx))
    assert not result.is_error and "bpy is not installed" in result.data["renderer_fallback"]


@pytest.mark.skipif(NO_BPY is not None, reason=NO_BPY or "")
def test_blender_renders_with_cycles_and_the_blend_reopens(tmp_path):
    import bpy

    scene = load_scene(living_room())
    done = render_blender(scene, width=96, samples=4, blend_path=tmp_path / "room.blend")
    image = Image.open(io.BytesIO(done.png))
    assert image.size == (96, done.height) and done.blend_path.exists()
    bpy.ops.wm.open_mainfile(filepath=str(done.blend_path))
    names = {o.name for o in bpy.data.objects}
    assert {o.id for o in scene.objects} <= names
