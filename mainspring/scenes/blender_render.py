"""The optional Blender backend: a scene/0.1 document built in Blender through `bpy` (the PyPI
wheel, `mainspring[blender]`), rendered with Cycles on the CPU, saved as .blend.

The scene reaches Blender as the .glb the glTF writer makes (the importer is Blender's own), with
light units taken raw: the importer's photometric conversion turns a 3-lux sun into
~0.004 W/m^2, near black (notes/scenes.md, pitfall 3), while raw 3 W/m^2 lights a scene as the
preview does. The preview's fixed ambient term becomes a grey world. The checks (ID buffer,
constraints) stay with the moderngl renderer: this backend makes the picture only.

bpy 5.0.x wheels exist for CPython 3.11 only (~820 MB installed); where `bpy` cannot be
imported, `blender_available()` says why and callers fall back to the moderngl preview.
"""

from __future__ import annotations

import importlib.util
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mainspring.scenes.errors import SceneError
from mainspring.scenes.model import Scene

AMBIENT = (0.25, 0.25, 0.27)  # linear RGB of the world shader: the preview's ambient term


@dataclass(frozen=True)
class BlenderRender:
    png: bytes
    blend_path: Path | None
    width: int
    height: int
    samples: int


def blender_unavailable_reason() -> str | None:
    """None when `bpy` can be imported here, else why not (and how to get it)."""
    if importlib.util.find_spec("bpy") is None:
        return "bpy is not installed (pip install 'mainspring[blender]'; wheels exist for Python 3.11 only)"
    return None


def render_blender(scene: Scene, base_dir: Path | None = None, width: int = 512, samples: int = 16,
                   blend_path: Path | None = None) -> BlenderRender:
    """Render `scene` from its camera with Cycles (CPU); optionally save the .blend."""
    reason = blender_unavailable_reason()
    if reason:
        raise SceneError(reason)
    import bpy

    from mainspring.scenes.gltf_export import to_glb

    height = max(16, round(width / scene.camera.aspect))
    with tempfile.TemporaryDirectory(prefix="scene-blender-") as tmp:
        glb, png = Path(tmp) / "scene.glb", Path(tmp) / "render.png"
        glb.write_bytes(to_glb(scene, base_dir))
        bpy.ops.wm.read_factory_settings(use_empty=True)
        bpy.ops.import_scene.gltf(filepath=str(glb), export_import_convert_lighting_mode="RAW")
        bscene = bpy.context.scene
        cameras = [o for o in bscene.objects if o.type == "CAMERA"]
        if not cameras:
            raise SceneError("Blender's glTF importer produced no camera")
        bscene.camera = cameras[0]
        world = bpy.data.worlds.new("ambient")
        world.use_nodes = True
        world.node_tree.nodes["Background"].inputs[0].default_value = (*AMBIENT, 1.0)
        bscene.world = world
        bscene.render.engine = "CYCLES"
        bscene.cycles.device = "CPU"
        bscene.cycles.samples = samples
        bscene.render.resolution_x, bscene.render.resolution_y = width, height
        bscene.render.resolution_percentage = 100
        bscene.render.image_settings.file_format = "PNG"
        bscene.render.filepath = str(png)
        bpy.ops.render.render(write_still=True)
        if blend_path is not None:
            bpy.ops.wm.save_as_mainfile(filepath=str(blend_path))
        return BlenderRender(png.read_bytes(), blend_path, width, height, samples)


__all__ = ["BlenderRender", "blender_unavailable_reason", "render_blender"]
