"""The agent tools scene_validate and scene_render, in process and in the real sandbox."""

from __future__ import annotations

import asyncio
import copy
import io
import json

import numpy as np
from PIL import Image

from mainspring.agents.tools.base import Tool, ToolContext
from mainspring.agents.tools.registry import ToolRegistry
from mainspring.scenarios.scene3d import load_briefs
from mainspring.scenarios.scene3d.tools import RENDER_JOB_COMMAND, scene_render_tool, scene_tools, scene_validate_tool

SNOWMAN = next(b for b in load_briefs() if b.id == "snowman").reference


def call(tool, args, tmp_path, sandbox=None):
    ctx = ToolContext(run_id="run", call_id="call", idempotency_key="key", workspace=tmp_path, sandbox=sandbox)
    return asyncio.run(tool.call(args, ctx))


def test_the_tools_register_with_the_run_loop():
    registry = ToolRegistry(scene_tools())
    assert registry.names() == ["scene_validate", "scene_render"]
    for tool in scene_tools():
        assert isinstance(tool, Tool) and tool.idempotent and not tool.requires_approval
        assert tool.parameters["required"] == ["scene"]
        assert tool.parameters["properties"]["scene"]["title"] == "scene/0.1"
    json.dumps(registry.schemas())  # plain JSON, ready for a model's tools list


def test_scene_validate_returns_violations_with_paths(tmp_path):
    result = call(scene_validate_tool(), {"scene": SNOWMAN}, tmp_path)
    assert not result.is_error and result.data == {"valid": True, "violations": []}
    bad = copy.deepcopy(SNOWMAN)
    bad["objects"][2]["radius"] = -1
    result = call(scene_validate_tool(), {"scene": json.dumps(bad)}, tmp_path)  # JSON text works too
    assert json.loads(result.content) == result.data == {"valid": False, "violations": [
        {"path": "$.objects[2].radius", "message": "Input should be greater than or equal to 0.001"}]}
    assert call(scene_validate_tool(), {}, tmp_path).data["violations"][0]["path"] == "$"


def test_scene_render_returns_a_png_and_the_constraint_report(tmp_path):
    result = call(scene_render_tool(), {"scene": SNOWMAN}, tmp_path)
    assert not result.is_error and result.data["valid"] and result.data["rendered"]
    assert result.data["constraints"]["passed"] and result.data["constraints"]["num_constraints"] == 6
    assert result.data["pixels"]["nose"] >= 20 and result.data["pixels"]["floor"] > 0
    [artifact] = result.artifacts
    assert (artifact.name, artifact.mime) == ("preview.png", "image/png")
    image = np.asarray(Image.open(io.BytesIO(artifact.data)))
    assert image.shape == (512, 512, 3) and image.std() > 10


def test_scene_render_refuses_an_invalid_scene_without_rendering(tmp_path):
    class NoSandboxCalls:
        def run(self, *args, **kwargs):
            raise AssertionError("an invalid scene must not reach the sandbox")

    bad = copy.deepcopy(SNOWMAN)
    bad["camera"]["look_at"] = bad["camera"]["position"]
    result = call(scene_render_tool(), {"scene": bad}, tmp_path, sandbox=NoSandboxCalls())
    assert result.is_error and result.artifacts == []
    assert result.data == {"valid": False, "violations": [{"path": "$.camera",
                                                           "message": "position and look_at must differ"}]}




def test_scene_render_runs_in_the_runs_sandbox(tmp_path, sandbox):
    seen = []

    class Watched:
        def run(self, command, files, profile, **kwargs):
            seen.append((command, sorted(files), profile))
            return sandbox.run(command, files, profile, **kwargs)

    result = call(scene_render_tool(), {"scene": SNOWMAN}, tmp_path, sandbox=Watched())
    assert seen == [(RENDER_JOB_COMMAND, ["scene.json"], "render")]
    assert not result.is_error and result.data["constraints"]["passed"]
    in_process = call(scene_render_tool(), {"scene": SNOWMAN}, tmp_path)
    assert result.data["pixels"] == in_process.data["pixels"]  # the same renderer, inside or out


def test_a_blender_render_runs_under_the_cycles_profile_and_a_stopped_one_says_which_limit(tmp_path, sandbox):
    from mainspring.sandbox.profiles import BUILTIN
    from mainspring.sandbox.result import Result
    from mainspring.scenes.render_settings import RenderSettings

    assert BUILTIN["render_cycles"].cpu_s > BUILTIN["render"].cpu_s and BUILTIN["render_cycles"].egl
    seen = []

    class Watched:
        def run(self, command, files, profile, **kwargs):
            seen.append(profile)
            return sandbox.run(command, files, profile, **kwargs)

    blender = RenderSettings("blender", 64, 2)
    result = call(scene_render_tool(blender), {"scene": SNOWMAN}, tmp_path, sandbox=Watched())
    assert seen == ["render_cycles"] and not result.is_error  # Cycles where bpy is installed, else the fallback

    class Stopped:
        def run(self, command, files, profile, **kwargs):
            return Result(exit_code=-24, stdout="", stderr="", killed_by="cpu_time", profile=profile)

    from mainspring.scenarios.scene3d.tools import render_in_sandbox

    job = render_in_sandbox(Stopped(), SNOWMAN, settings=blender)
    assert "cpu_time limit of the sandbox's render_cycles profile" in job.report["error"]
    assert "fewer --samples" in job.report["error"]
