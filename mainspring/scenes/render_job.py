"""A render as a job: a scene file in, a folder of results out. This is what runs inside the
sandbox's `render` profile (no network, no display, the workspace as cwd):

    python3 -m mainspring.scenes.render_job scene.json out/ [--width 512] [--renderer blender --samples 16]

writes into out/:
    report.json   validity (violations with paths), every constraint's result, visible pixels per
                  object, the GL renderer and timings; always written, even for an invalid scene
    preview.png   the shaded preview (moderngl's, or Cycles' with --renderer blender where bpy is installed)
    scene.blend   with --renderer blender: the scene as Blender built it
    ids.png       the object-ID buffer in false colour (for people)
    ids.npy       the object-ID buffer (uint16; 0 = background, k = scene.objects[k-1])

Exit status: 0 rendered (whatever the constraints say), 2 the scene is unreadable or invalid,
1 no rendering was possible (EGL/Mesa missing). Mesh assets are looked up next to scene.json.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

from mainspring.scenes.errors import SceneError
from mainspring.scenes.render_settings import RENDERERS, RenderSettings
from mainspring.scenes.validate import parse_scene

EXIT_OK, EXIT_RENDER_FAILED, EXIT_INVALID = 0, 1, 2


def run(scene_path: Path, out_dir: Path, width: int = 512, settings: RenderSettings | None = None) -> int:
    """Render `scene_path` into `out_dir` (created); the exit status as above."""
    settings = settings or RenderSettings(width=width)
    width = settings.width
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"scene": scene_path.name, "valid": False, "violations": []}
    started = time.perf_counter()
    try:
        source = scene_path.read_bytes()
    except OSError as exc:
        report["error"] = f"cannot read {scene_path}: {exc.strerror or exc}"
        return _finish(out_dir, report, EXIT_INVALID)
    scene, violations = parse_scene(source, scene_path.parent)
    report["violations"] = [v.to_dict() for v in violations]
    if scene is None:
        report["error"] = f"invalid scene: {len(violations)} problem(s)"
        return _finish(out_dir, report, EXIT_INVALID)
    report["valid"] = True
    from mainspring.scenes.checks import check_constraints
    from mainspring.scenes.preview import RenderUnavailable, renderer_name, shared_renderer
    from mainspring.scenes.world import build_world

    try:
        world = build_world(scene, scene_path.parent)
        built = time.perf_counter()
        frame = shared_renderer().render(world, width)
    except RenderUnavailable as exc:
        report["error"] = str(exc)
        return _finish(out_dir, report, EXIT_RENDER_FAILED)
    except SceneError as exc:  # an unreadable mesh asset
        report["error"] = str(exc)
        return _finish(out_dir, report, EXIT_INVALID)
    rendered = time.perf_counter()
    (out_dir / "preview.png").write_bytes(frame.png())
    report["preview_renderer"] = "moderngl"
    if settings.renderer == "blender":
        _blender_preview(scene, scene_path.parent, out_dir, settings, report)
    (out_dir / "ids.png").write_bytes(frame.ids_png())
    buf = io.BytesIO()
    np.save(buf, frame.ids.astype(np.uint16))  # at most 500 objects: 16 bits hold every id
    (out_dir / "ids.npy").write_bytes(buf.getvalue())
    checks = check_constraints(world, frame=frame)
    report.update({
        "renderer": renderer_name(), "width": int(frame.ids.shape[1]), "height": int(frame.ids.shape[0]),
        "object_ids": frame.object_ids, "pixels": frame.pixel_counts(), "constraints": checks.to_dict(),
        "timings_s": {"build": round(built - started, 4), "render": round(rendered - built, 4),
                      "total": round(time.perf_counter() - started, 4)},
    })
    return _finish(out_dir, report, EXIT_OK)


def _blender_preview(scene, base_dir: Path, out_dir: Path, settings: RenderSettings, report: dict) -> None:
    """Cycles draws preview.png (and scene.blend) when bpy is here; else the moderngl one stays, and the
    report says why."""
    from mainspring.scenes.blender_render import render_blender

    try:
        done = render_blender(scene, base_dir, settings.width, settings.samples, out_dir / "scene.blend")
    except SceneError as exc:
        report["renderer_fallback"] = f"blender: {exc}; the preview is moderngl's"
        return
    (out_dir / "preview.png").write_bytes(done.png)
    report["preview_renderer"] = f"blender (Cycles CPU, {done.samples} samples)"


def _finish(out_dir: Path, report: dict, status: int) -> int:
    report["exit_status"] = status
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mainspring.scenes.render_job",
                                     description="Render a scene/0.1 file into a folder of results.")
    parser.add_argument("scene", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--width", type=int, default=512, help="image width in pixels (16-4096)")
    parser.add_argument("--renderer", choices=RENDERERS, default="moderngl", help="what draws preview.png")
    parser.add_argument("--samples", type=int, default=16, help="Cycles samples per pixel (blender)")
    args = parser.parse_args(argv)
    try:
        settings = RenderSettings(args.renderer, args.width, args.samples)
    except ValueError as exc:
        parser.error(str(exc))
    status = run(args.scene, args.out_dir, settings=settings)
    if status != EXIT_OK:
        report = json.loads((args.out_dir / "report.json").read_text(encoding="utf-8"))
        print(f"error: {report.get('error')}", file=sys.stderr)
        for v in report["violations"][:20]:
            print(f"  {v['path']}: {v['message']}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
