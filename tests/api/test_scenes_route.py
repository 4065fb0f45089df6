"""POST /v1/scenes/gltf on a real server: a valid scene comes back as a .glb holding the same document; an invalid
one, one naming an asset file, and a body that is not a scene are 400s in the OpenAI error shape."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from mainspring import scenes
from tests.scenes.helpers import box, doc, living_room

from .test_agent_routes import agent_server


@pytest.fixture(scope="module")
def http(tmp_path_factory) -> Iterator[httpx.Client]:
    with agent_server(tmp_path_factory.mktemp("scenes-route")) as s:
        yield s.http


def error(r: httpx.Response, code: str) -> str:
    assert r.status_code == 400, r.text
    body = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["code"] == code
    return body["message"]


def test_a_scene_as_a_glb(http):
    r = http.post("/v1/scenes/gltf", json={"scene": living_room()})
    assert r.status_code == 200 and r.headers["content-type"] == "model/gltf-binary"
    assert r.content[:4] == b"glTF"
    assert scenes.from_gltf(r.content)["objects"] == living_room()["objects"]


def test_an_invalid_scene_names_its_violations(http):
    bad = doc(box("a", [1, -1, 1], [0, 0.5, 0]))
    assert "$.objects[0].size" in error(http.post("/v1/scenes/gltf", json={"scene": bad}), "invalid_scene")


def test_a_scene_cannot_name_a_file_on_the_server(http):
    mesh = {"id": "m", "shape": "mesh", "asset": "assets/../../../etc/x.glb", "position": [0, 0, 0]}
    error(http.post("/v1/scenes/gltf", json={"scene": doc(mesh)}), "invalid_scene")
    mesh["asset"] = "assets/chair.glb"  # valid as a path, but there is no base directory to find it in
    error(http.post("/v1/scenes/gltf", json={"scene": doc(mesh)}), "invalid_scene")


@pytest.mark.parametrize("body, code", [({"scene": 3}, "invalid_value"), ({"scene": "{}"}, "invalid_value"),
                                       ({}, "missing_required_parameter"), ({"scene": {}, "extra": 1}, "invalid_value"),
                                       ([1], "invalid_value"), ({"scene": {}}, "invalid_scene")])
def test_a_body_that_is_not_a_scene(http, body, code):
    error(http.post("/v1/scenes/gltf", json=body), code)
