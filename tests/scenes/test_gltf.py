"""glTF export: valid by Khronos' validator, faithful in its native data, and lossless: importing
the .glb gives back the identical scene."""

from __future__ import annotations

import math

import numpy as np
import pytest
import trimesh

from mainspring.scenes import SceneError, from_gltf, load_scene, to_gltf
from mainspring.scenes.gltf_import import glb_json
from mainspring.scenes.transforms import rotation_from_quat, trs_matrix
from tests.scenes.helpers import living_room, world
from tests.scenes.khronos import validate_glb


@pytest.fixture
def rich(tmp_path):
    """The living room plus what it lacks: a spot light, a quaternion, a scale and a mesh asset."""
    (tmp_path / "assets").mkdir()
    statue = trimesh.creation.icosphere(subdivisions=1, radius=0.2)
    statue.export(tmp_path / "assets" / "statue.glb")
    source = living_room()
    source["objects"].append({"id": "statue", "shape": "mesh", "asset": "assets/statue.glb",
                              "position": [-1.6, 0.7, -0.6], "scale": [1, 1.5, 1]})
    source["objects"].append({"id": "tilted", "shape": "cone", "radius": 0.1, "height": 0.3, "position": [1, 0.15, 1],
                              "rotation_quat": [0, 0.3826834, 0, 0.9238795], "material": {"color": [0.2, 0.9, 0.3]}})
    source["lights"].append({"id": "spot", "type": "spot", "intensity": 40, "position": [0, 2.5, 0],
                             "target": [0, 0.7, 0], "inner_cone_deg": 20, "outer_cone_deg": 35, "range": 6})
    return source, tmp_path


def test_export_import_round_trip_is_identical(rich):
    source, folder = rich
    scene = load_scene(source, folder)
    back = from_gltf(to_gltf(scene, folder))
    assert back == scene.to_doc() == source
    assert list(back) == list(source)  # same key order too: the same JSON text
    assert load_scene(back, folder) == scene


def test_the_glb_passes_the_khronos_validator(rich, tmp_path):
    source, folder = rich
    path = tmp_path / "rich.glb"
    path.write_bytes(to_gltf(load_scene(source, folder), folder))
    report = validate_glb(path)
    issues = report["issues"]
    assert issues["numErrors"] == 0, issues["messages"]
    assert issues["numWarnings"] == 0, issues["messages"]
    info = report["info"]
    assert info["drawCallCount"] == len(source["objects"]) and info["totalTriangleCount"] > 5000
    assert "KHR_lights_punctual" in info["extensionsUsed"]


def _node_world(tree: dict, index: int, parents: dict[int, int]) -> np.ndarray:
    node = tree["nodes"][index]
    rotation = rotation_from_quat(node["rotation"]) if "rotation" in node else np.eye(3)
    local = trs_matrix(node.get("translation", [0, 0, 0]), rotation, node.get("scale", [1, 1, 1]))
    return local if index not in parents else _node_world(tree, parents[index], parents) @ local


def test_the_native_gltf_data_matches_the_scene(rich):
    source, folder = rich
    scene = load_scene(source, folder)
    w = world(source, folder)
    tree = glb_json(to_gltf(scene, folder))
    parents = {child: i for i, n in enumerate(tree["nodes"]) for child in n.get("children", [])}
    names = {n["name"]: i for i, n in enumerate(tree["nodes"])}
    for placed in w.placed:
        i = names[placed.id]
        assert _node_world(tree, i, parents) == pytest.approx(placed.matrix, abs=1e-9), placed.id
        mesh = tree["meshes"][tree["nodes"][i]["mesh"]]["primitives"][0]
        position = tree["accessors"][mesh["attributes"]["POSITION"]]
        assert position["min"] == pytest.approx(placed.mesh.surface.bounds[0].tolist(), abs=1e-6)
        material = tree["materials"][mesh["material"]]["pbrMetallicRoughness"]
        assert material["baseColorFactor"] == [*placed.material.color, placed.material.opacity]
        assert material["metallicFactor"] == placed.material.metallic
    glass = next(m for m in tree["materials"] if m["name"] == "glass")
    assert glass["alphaMode"] == "BLEND" and tree["materials"][0]["doubleSided"] is True  # the floor plane's

    lights = tree["extensions"]["KHR_lights_punctual"]["lights"]
    assert [(li["type"], li["intensity"]) for li in lights] == [("directional", 3.0), ("point", 2.0), ("spot", 40.0)]
    assert lights[2]["spot"] == {"innerConeAngle": pytest.approx(math.radians(20)),
                                 "outerConeAngle": pytest.approx(math.radians(35))}
    spot = _node_world(tree, names["spot"], parents)
    assert -spot[:3, 2] == pytest.approx([0, -1, 0], abs=1e-9)  # -Z from the light towards its target

    camera = tree["cameras"][0]["perspective"]
    assert camera["yfov"] == pytest.approx(math.radians(50)) and camera["znear"] == 0.05
    cam = _node_world(tree, names["camera"], parents)
    towards = np.subtract(scene.camera.look_at, scene.camera.position)
    assert -cam[:3, 2] == pytest.approx(towards / np.linalg.norm(towards))


def test_import_refuses_what_it_did_not_write(tmp_path):
    foreign = trimesh.Scene(trimesh.creation.box()).export(file_type="glb")
    with pytest.raises(SceneError, match="holds no scene/0.1 source"):
        from_gltf(foreign)
    with pytest.raises(SceneError, match="not a glTF 2.0 binary"):
        from_gltf(b"PK\x03\x04" + bytes(40))
    with pytest.raises(SceneError, match="too short"):
        from_gltf(b"glTF")
