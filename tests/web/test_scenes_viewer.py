"""The console's scene viewer in chromium: a run's rendered scene in three.js (WebGL on SwiftShader) beside its
constraint report and preview, a local .glb, and the message shown when three.js was not vendored.

Needs three.js under .cache/npm-web (the Makefile's npm install); without it only the last test runs.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from mainspring.api.routes import console as console_routes
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, ToolCall
from tests.api.test_agent_routes import TERMINAL, AgentServer, agent_server, make_agent, start_run, test_tools, \
    wait_status
from tests.scenes.helpers import living_room

three_installed = pytest.mark.skipif(not (console_routes.VENDOR_DIR / "three" / "build").is_dir(),
                                     reason="three.js is not vendored (npm install --no-save --prefix .cache/npm-web "
                                            "three@0.187.0, as the Makefile does)")


class ScenePolicy(ChatModel):
    """TEST-ONLY: renders the living-room scene once, then answers."""

    model = "policy"

    async def chat(self, messages: list[dict], *, tools: list[dict] | None = None, **kwargs: Any) -> Completion:
        usage = Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=10)
        if not any(m["role"] == "tool" for m in messages):
            call = ToolCall("c1", "scene_render", json.dumps({"scene": living_room()}))
            return Completion("rendering", [call], "tool_calls", usage, self.model)
        return Completion("rendered", [], "stop", usage, self.model)

    def stream(self, messages, **kwargs):  # pragma: no cover - the runtime only calls chat()
        raise NotImplementedError


@pytest.fixture
def srv(tmp_path) -> Iterator[AgentServer]:
    from mainspring.scenarios.scene3d.tools import scene_render_tool

    policy = ScenePolicy()
    with agent_server(tmp_path / "data", models=lambda name, project=None: policy,
                      tools={**test_tools(), "scene_render": scene_render_tool()}) as s:
        yield s


def real_errors(errors: list[str]) -> list[str]:
    # SwiftShader's notice that WebGL runs on the CPU (chromium logs it as a warning or an error, by version)
    return [e for e in errors if "swiftshader" not in e.lower() and "GPU stall" not in e]


@three_installed
def test_a_runs_scene_in_the_viewer_beside_its_report_and_preview(srv, console):
    make_agent(srv, "designer", ["scene_render"])
    run = start_run(srv, "designer", "a living room")
    done = wait_status(srv, run["id"], TERMINAL, timeout=60)
    assert done["status"] == "succeeded", done
    c = console(srv.url)
    page = c.open(f"#/runs/{run['id']}")
    page.locator("#scene-link").click()
    viewer = page.locator(".viewer[data-meshes]")
    viewer.wait_for()
    assert int(viewer.get_attribute("data-meshes")) >= len(living_room()["objects"])
    assert viewer.locator("canvas[role=img]").count() == 1
    page.locator(".preview img").wait_for()
    assert "constraints pass" in page.locator(".report").inner_text()
    canvas = viewer.locator("canvas")
    canvas.focus()
    page.keyboard.press("ArrowLeft")  # orbit by keyboard: still drawn, no error
    c.shot("scenes")
    assert real_errors(c.errors) == [], c.errors


@three_installed
def test_a_local_glb_file_loads_without_errors(srv, console, tmp_path):
    from mainspring import scenes

    glb = tmp_path / "room.glb"
    glb.write_bytes(scenes.to_gltf(living_room()))
    c = console(srv.url)
    page = c.open("#/scenes")
    page.get_by_label("or open a .glb").set_input_files(str(glb))
    viewer = page.locator(".viewer[data-meshes]")
    viewer.wait_for()
    assert int(viewer.get_attribute("data-meshes")) > 0
    assert real_errors(c.errors) == [], c.errors


def test_without_three_the_viewer_says_it_is_not_installed(srv, console, monkeypatch, tmp_path):
    from mainspring import scenes

    monkeypatch.setattr(console_routes, "VENDOR_DIR", tmp_path / "no-npm")
    glb = tmp_path / "room.glb"
    glb.write_bytes(scenes.to_gltf(living_room()))
    c = console(srv.url)
    page = c.open("#/scenes")
    page.get_by_label("or open a .glb").set_input_files(str(glb))
    page.locator(".viewer", has_text="The 3D viewer is not installed").wait_for()
    # the browser logs the refused module loads (404); nothing else
    assert all("404" in e or "Failed to fetch dynamically imported module" in e for e in c.errors), c.errors
