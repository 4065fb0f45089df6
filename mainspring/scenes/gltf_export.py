"""scene/0.1 -> glTF 2.0 binary (.glb).

trimesh writes the geometry (buffers, accessors, one mesh per object, the node hierarchy); the
rest is written here into the glTF tree before it is packed, because trimesh would lose it:
materials with exact float factors (trimesh reads float colours as 0-255 values), node TRS, the
camera, KHR_lights_punctual lights, and the source document in `extras`: each object, light and
the camera verbatim on its node, the document's other fields on the scene. gltf_import reads
those back, so scene -> .glb -> scene is the identity.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import trimesh
from trimesh.exchange.gltf import export_glb

from mainspring.scenes.model import Scene
from mainspring.scenes.transforms import look_at_rotation, object_rotation, quat_from_rotation
from mainspring.scenes.world import DEFAULT_MATERIAL, World, build_world

EXTRAS_KEY = "scene_src"  # node.extras[EXTRAS_KEY] = the source object / light / camera
_ROOT = "__scene_root__"  # not a valid id, so it cannot collide with an object's name


def to_glb(scene: Scene, base_dir: Path | None = None, world: World | None = None) -> bytes:
    """The scene as a .glb: one node and mesh per object, materials, lights, the camera."""
    world = world or build_world(scene, base_dir)
    graph = trimesh.Scene(base_frame=_ROOT)
    for p in _parents_first(world):
        surface = p.mesh.surface
        mesh = trimesh.Trimesh(surface.vertices, surface.faces, vertex_normals=surface.vertex_normals, process=False)
        graph.add_geometry(mesh, node_name=p.id, geom_name=p.id, parent_node_name=p.obj.parent or _ROOT,
                           transform=np.eye(4))  # the real TRS is written below, exactly
    doc = scene.to_doc()
    return export_glb(graph, include_normals=True, tree_postprocessor=lambda tree: _complete(tree, scene, doc))


def _parents_first(world: World) -> list:
    order, done = [], set()

    def visit(p) -> None:
        if p.id in done:
            return
        if p.obj.parent is not None:
            visit(world.by_id[p.obj.parent])
        done.add(p.id)
        order.append(p)

    for p in world.placed:
        visit(p)
    return order


def _complete(tree: dict, scene: Scene, doc: dict) -> None:
    tree["asset"] = {"version": "2.0", "generator": "mainspring scene/0.1"}
    nodes = tree["nodes"]
    by_name = {n["name"]: i for i, n in enumerate(nodes)}
    materials: list[dict[str, Any]] = []
    material_index: dict[str, int] = {}
    planes = {o.material for o in scene.objects if o.shape == "plane" and isinstance(o.material, str)}
    for i, obj in enumerate(scene.objects):
        node = nodes[by_name[obj.id]]
        node.pop("matrix", None)
        node.update(_trs(obj.position, object_rotation(obj), obj.scale))
        node["extras"] = {EXTRAS_KEY: doc["objects"][i], "index": i}
        key = obj.material if isinstance(obj.material, str) else f"{obj.id}/material"
        if key not in material_index:
            source = (scene.materials[obj.material] if isinstance(obj.material, str)
                      else obj.material or DEFAULT_MATERIAL)
            name = obj.material if isinstance(obj.material, str) else f"{obj.id}_material"
            two_sided = obj.shape == "plane" or key in planes  # a plane is seen from both sides
            material_index[key] = len(materials)
            materials.append(_material(name, source, two_sided))
        for primitive in tree["meshes"][node["mesh"]]["primitives"]:
            primitive["material"] = material_index[key]
    tree["materials"] = materials
    roots = tree["scenes"][0]["nodes"]

    cam = scene.camera
    roots.append(len(nodes))
    nodes.append({"name": "camera", "camera": 0,
                  **_trs(cam.position, look_at_rotation(cam.position, cam.look_at, cam.up)),
                  "extras": {EXTRAS_KEY: doc["camera"]}})
    tree["cameras"] = [{"type": "perspective", "name": "camera", "perspective": {
        "yfov": math.radians(cam.yfov_deg), "aspectRatio": cam.aspect, "znear": cam.znear, "zfar": cam.zfar}}]

    if scene.lights:
        lights = []
        for i, light in enumerate(scene.lights):
            rotation = (np.eye(3) if light.type == "point"  # a point light shines everywhere
                        else look_at_rotation(light.position, light.target))
            roots.append(len(nodes))
            nodes.append({"name": light.id, **_trs(light.position, rotation),
                          "extensions": {"KHR_lights_punctual": {"light": i}},
                          "extras": {EXTRAS_KEY: doc["lights"][i], "index": i}})
            lights.append(_light(light))
        tree.setdefault("extensionsUsed", []).append("KHR_lights_punctual")
        tree.setdefault("extensions", {})["KHR_lights_punctual"] = {"lights": lights}

    _set_buffer_targets(tree)
    rest = {k: v for k, v in doc.items() if k not in ("objects", "lights", "camera")}
    tree["scenes"][0]["extras"] = {EXTRAS_KEY: rest, "key_order": list(doc)}
    tree["scenes"][0]["name"] = "scene"


def _set_buffer_targets(tree: dict) -> None:
    # glTF-Validator hints unless each vertex / index bufferView says which GPU buffer it feeds
    views = tree.get("bufferViews", [])
    for mesh in tree.get("meshes", []):
        for primitive in mesh["primitives"]:
            for accessor in primitive["attributes"].values():
                views[tree["accessors"][accessor]["bufferView"]]["target"] = 34962  # ARRAY_BUFFER
            if "indices" in primitive:
                views[tree["accessors"][primitive["indices"]]["bufferView"]]["target"] = 34963  # ELEMENT_ARRAY


def _trs(position, rotation: np.ndarray, scale=None) -> dict:
    out: dict = {}
    if any(position):
        out["translation"] = [float(v) for v in position]
    if not np.allclose(rotation, np.eye(3)):
        out["rotation"] = quat_from_rotation(rotation)
    if scale is not None and any(s != 1.0 for s in scale):
        out["scale"] = [float(s) for s in scale]
    return out


def _material(name: str, m, two_sided: bool) -> dict:
    out: dict[str, Any] = {"name": name, "pbrMetallicRoughness": {
        "baseColorFactor": [*map(float, m.color), float(m.opacity)],
        "metallicFactor": float(m.metallic), "roughnessFactor": float(m.roughness)}}
    if m.emissive is not None and any(m.emissive):
        out["emissiveFactor"] = [float(c) for c in m.emissive]
    if m.opacity < 1.0:
        out["alphaMode"] = "BLEND"
    if two_sided:
        out["doubleSided"] = True
    return out


def _light(light) -> dict:
    out = {"name": light.id, "type": light.type, "color": [float(c) for c in light.color],
           "intensity": float(light.intensity)}
    if light.range is not None and light.type != "directional":
        out["range"] = float(light.range)
    if light.type == "spot":
        out["spot"] = {"innerConeAngle": math.radians(light.inner_cone_deg or 0.0),
                       "outerConeAngle": math.radians(light.outer_cone_deg or 45.0)}
    return out
