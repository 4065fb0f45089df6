"""3D scenes: the `scene/0.1` language a model writes, its validator and constraint checker, glTF
export/import and headless previews. See ../shared/notes/scenes.md for the design.

    from mainspring import scenes
    scenes.validate(doc)                 # [] or [Violation(path, message), ...]
    scene = scenes.load_scene(doc)       # or SceneInvalid
    scenes.check(scene).to_dict()        # every constraint: passed, measured quantity
    scenes.render(scene)                 # PNG bytes (moderngl on EGL)
    scenes.to_gltf(scene)                # .glb bytes; scenes.from_gltf(data) gives the document back

Validation needs only pydantic; trimesh, manifold3d and moderngl are imported on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mainspring.scenes.errors import SceneError, SceneInvalid, Violation
from mainspring.scenes.model import SCHEMA_VERSION, Scene
from mainspring.scenes.schema import decoding_schema, scene_json_schema
from mainspring.scenes.validate import load_scene, parse_scene, validate

SceneSource = Scene | dict[str, Any] | str | bytes | Path


def _scene(source: SceneSource, base_dir: Path | None) -> tuple[Scene, Path | None]:
    if isinstance(source, Scene):
        return source, base_dir
    if isinstance(source, Path) and base_dir is None:
        base_dir = source.parent
    return load_scene(source, base_dir), base_dir


def check(source: SceneSource, base_dir: Path | None = None, constraints: list | None = None):
    """A CheckReport of the scene's constraints (or of `constraints`, e.g. a brief's)."""
    from mainspring.scenes.checks import check_constraints
    from mainspring.scenes.world import build_world

    scene, base_dir = _scene(source, base_dir)
    return check_constraints(build_world(scene, base_dir), constraints)


def render_frame(source: SceneSource, base_dir: Path | None = None, width: int = 512):
    """The rendered Frame: shaded colour and object-ID buffer."""
    from mainspring.scenes.preview import shared_renderer
    from mainspring.scenes.world import build_world

    scene, base_dir = _scene(source, base_dir)
    return shared_renderer().render(build_world(scene, base_dir), width)


def render(source: SceneSource, base_dir: Path | None = None, width: int = 512) -> bytes:
    """The shaded preview as PNG bytes."""
    return render_frame(source, base_dir, width).png()


def to_gltf(source: SceneSource, base_dir: Path | None = None) -> bytes:
    """The scene as a glTF 2.0 binary (.glb)."""
    from mainspring.scenes.gltf_export import to_glb

    scene, base_dir = _scene(source, base_dir)
    return to_glb(scene, base_dir)


def from_gltf(data: bytes) -> dict[str, Any]:
    """The scene/0.1 document inside a .glb written by to_gltf."""
    from mainspring.scenes.gltf_import import from_glb

    return from_glb(data)


__all__ = [
    "SCHEMA_VERSION", "Scene", "SceneError", "SceneInvalid", "Violation", "check", "decoding_schema", "from_gltf",
    "load_scene", "parse_scene", "render", "render_frame", "scene_json_schema", "to_gltf", "validate",
]
