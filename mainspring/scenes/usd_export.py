"""scene/0.1 <-> USD (through `usd-core`'s pxr), beside glTF.

The stage follows the document's conventions, stated rather than assumed (an unauthored
`metersPerUnit` means centimetres to USD): metres, +Y up. Each object is an Xform prim at
/scene/<parent path>/<id> with one `xformOp:transform` (the exact local matrix) and a `geom`
Mesh child holding the same tessellation the glTF writer and the preview use, coloured with
`displayColor`/`displayOpacity`. The camera is a UsdGeom.Camera aimed by its transform, lights
are UsdLux DistantLight/SphereLight (glTF units kept as authored: each renderer maps them).
Like the glTF extras, every prim keeps its source JSON in `mainspring:scene_src`, so
`from_usd(to_usd(doc))` gives the document back; anything else on the stage is ignored.

pxr is imported on first use: `pip install usd-core` (the `usd` extra).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from mainspring.scenes.errors import SceneError
from mainspring.scenes.model import Scene
from mainspring.scenes.transforms import local_matrix, look_at_rotation, trs_matrix
from mainspring.scenes.world import DEFAULT_MATERIAL, World, build_world

SRC_ATTR = "mainspring:scene_src"
KIND_ATTR = "mainspring:kind"  # "object" | "light" | "camera" | "scene"
INDEX_ATTR = "mainspring:index"
ROOT = "/scene"
_APERTURE_MM = 24.0  # vertical aperture; the focal length is derived from yfov


def _pxr():
    try:
        from pxr import Gf, Sdf, Usd, UsdGeom, UsdLux
    except ImportError as exc:
        raise SceneError("USD export needs usd-core: pip install usd-core (or mainspring[usd])") from exc
    return Gf, Sdf, Usd, UsdGeom, UsdLux


def _matrix(gf, m: np.ndarray):
    # ours act on column vectors (p' = M p); USD's on row vectors (p' = p M): the transpose
    return gf.Matrix4d(*[float(x) for x in np.asarray(m, dtype=float).T.reshape(-1)])


def _keep(prim, sdf, kind: str, source: Any, index: int | None = None) -> None:
    prim.CreateAttribute(KIND_ATTR, sdf.ValueTypeNames.String, custom=True).Set(kind)
    prim.CreateAttribute(SRC_ATTR, sdf.ValueTypeNames.String, custom=True).Set(json.dumps(source))
    if index is not None:
        prim.CreateAttribute(INDEX_ATTR, sdf.ValueTypeNames.Int, custom=True).Set(index)


def to_stage(scene: Scene, base_dir: Path | None = None, world: World | None = None):
    """The scene as an in-memory Usd.Stage."""
    Gf, Sdf, Usd, UsdGeom, UsdLux = _pxr()
    world = world or build_world(scene, base_dir)
    doc = scene.to_doc()
    stage = Usd.Stage.CreateInMemory()
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.y)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    root = UsdGeom.Xform.Define(stage, ROOT).GetPrim()
    stage.SetDefaultPrim(root)
    rest = {k: v for k, v in doc.items() if k not in ("objects", "lights", "camera")}
    _keep(root, Sdf, "scene", {"rest": rest, "key_order": list(doc)})

    paths: dict[str, str] = {}

    def path_of(obj) -> str:
        if obj.id not in paths:
            parent = ROOT if obj.parent is None else path_of(world.by_id[obj.parent].obj)
            paths[obj.id] = f"{parent}/{obj.id}"
        return paths[obj.id]

    for p in world.placed:
        xform = UsdGeom.Xform.Define(stage, path_of(p.obj))
        xform.AddTransformOp().Set(_matrix(Gf, local_matrix(p.obj)))
        _keep(xform.GetPrim(), Sdf, "object", doc["objects"][p.index], p.index)
        mesh = UsdGeom.Mesh.Define(stage, f"{paths[p.id]}/geom")
        surface = p.mesh.surface
        mesh.CreatePointsAttr([Gf.Vec3f(*map(float, v)) for v in surface.vertices])
        mesh.CreateFaceVertexCountsAttr([3] * len(surface.faces))
        mesh.CreateFaceVertexIndicesAttr([int(i) for i in np.asarray(surface.faces).reshape(-1)])
        mesh.CreateSubdivisionSchemeAttr(UsdGeom.Tokens.none)  # triangles as they are, not a subdivision cage
        mesh.CreateDoubleSidedAttr(p.obj.shape == "plane")
        material = p.material or DEFAULT_MATERIAL
        mesh.CreateDisplayColorAttr([Gf.Vec3f(*map(float, material.color))])
        mesh.CreateDisplayOpacityAttr([float(material.opacity)])

    cam = scene.camera
    camera = UsdGeom.Camera.Define(stage, f"{ROOT}/camera")
    camera.AddTransformOp().Set(_matrix(Gf, trs_matrix(cam.position, look_at_rotation(cam.position, cam.look_at,
                                                                                      cam.up), (1, 1, 1))))
    camera.CreateVerticalApertureAttr(_APERTURE_MM)
    camera.CreateHorizontalApertureAttr(_APERTURE_MM * cam.aspect)
    camera.CreateFocalLengthAttr(_APERTURE_MM / (2 * math.tan(math.radians(cam.yfov_deg) / 2)))
    camera.CreateClippingRangeAttr(Gf.Vec2f(float(cam.znear), float(cam.zfar)))
    _keep(camera.GetPrim(), Sdf, "camera", doc["camera"])

    for i, light in enumerate(scene.lights):
        path = f"{ROOT}/{light.id}"
        if light.type == "directional":
            lux = UsdLux.DistantLight.Define(stage, path)
        else:
            lux = UsdLux.SphereLight.Define(stage, path)
            lux.CreateTreatAsPointAttr(True)
        rotation = np.eye(3) if light.type == "point" else look_at_rotation(light.position, light.target)
        lux.AddTransformOp().Set(_matrix(Gf, trs_matrix(light.position, rotation, (1, 1, 1))))
        lux.CreateIntensityAttr(float(light.intensity))
        lux.CreateColorAttr(Gf.Vec3f(*map(float, light.color)))
        if light.type == "spot":
            shaping = UsdLux.ShapingAPI.Apply(lux.GetPrim())
            shaping.CreateShapingConeAngleAttr(float(light.outer_cone_deg or 45.0))
        _keep(lux.GetPrim(), Sdf, "light", doc["lights"][i], i)
    return stage


def to_usda(scene: Scene, base_dir: Path | None = None, world: World | None = None) -> str:
    """The scene as USD text (.usda)."""
    stage = to_stage(scene, base_dir, world)  # held: a layer lives only as long as its stage
    return stage.GetRootLayer().ExportToString()


def write_usd(scene: Scene, path: Path, base_dir: Path | None = None, world: World | None = None) -> None:
    """Write .usda (text) or .usdc/.usd (crate binary), by the file's suffix."""
    if path.suffix not in (".usda", ".usdc", ".usd"):
        raise SceneError(f"a USD file ends in .usda, .usdc or .usd, not {path.suffix or 'nothing'}")
    stage = to_stage(scene, base_dir, world)
    if not stage.GetRootLayer().Export(str(path)):
        raise SceneError(f"USD could not write {path}")


def from_usd(source: str | Path) -> dict[str, Any]:
    """The scene/0.1 document kept in a stage written by to_usd (a path, or .usda text)."""
    _, Sdf, Usd, _, _ = _pxr()
    if isinstance(source, Path):
        try:
            stage = Usd.Stage.Open(str(source))
        except Exception:  # pxr.Tf.ErrorException: missing or unreadable file
            stage = None
        if stage is None:
            raise SceneError(f"USD could not open {source}")
    else:
        layer = Sdf.Layer.CreateAnonymous(".usda")
        try:
            imported = layer.ImportFromString(source)
        except Exception as exc:  # pxr.Tf.ErrorException, with the parser's message
            raise SceneError(f"not USD text (.usda): {str(exc).strip().splitlines()[-1][:200]}") from None
        if not imported:
            raise SceneError("not USD text (.usda)")
        stage = Usd.Stage.Open(layer)
    rest: dict[str, Any] | None = None
    objects: list[tuple[int, Any]] = []
    lights: list[tuple[int, Any]] = []
    camera = None
    for prim in stage.Traverse():
        src = prim.GetAttribute(SRC_ATTR)
        if not src:
            continue
        kind = prim.GetAttribute(KIND_ATTR).Get()
        value = json.loads(src.Get())
        index_attr = prim.GetAttribute(INDEX_ATTR)
        index = index_attr.Get() if index_attr else 0
        if kind == "scene":
            rest = value
        elif kind == "object":
            objects.append((index, value))
        elif kind == "light":
            lights.append((index, value))
        elif kind == "camera":
            camera = value
    if rest is None:
        raise SceneError("this USD stage holds no scene/0.1 source (it was not written by mainspring)")
    doc = dict(rest["rest"])
    doc["objects"] = [v for _, v in sorted(objects, key=lambda item: item[0])]
    if lights:
        doc["lights"] = [v for _, v in sorted(lights, key=lambda item: item[0])]
    if camera is not None:
        doc["camera"] = camera
    order = rest.get("key_order") or list(doc)
    return {k: doc[k] for k in sorted(doc, key=lambda k: order.index(k) if k in order else len(order))}


__all__ = ["from_usd", "to_stage", "to_usda", "write_usd"]
