"""`mainspring scene validate|check|render|export|import|schema`, wired in by mainspring/cli.py as

    app.add_typer(scene_app, name="scene")

Exit status: 0 fine; 1 the scene is valid but some constraint fails (check); 2 the input cannot be
used (unreadable, invalid: every violation is printed with its JSON path), never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from mainspring.console import fail
from mainspring.scenes.errors import SceneError, SceneInvalid

app = typer.Typer(help="3D scenes (scene/0.1): validate, check constraints, render previews, export glTF.",
                  no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)  # long paths and messages stay on one line
SceneFile = typer.Argument(..., help="a scene/0.1 JSON file (mesh assets are looked up next to it)")




def _load(path: Path):
    from mainspring.scenes.validate import load_scene

    try:
        return load_scene(path)
    except SceneInvalid as exc:
        err.print(f"[red]error:[/red] {path}: {len(exc.violations)} problem(s)", highlight=False)
        for v in exc.violations:
            err.print(f"  {v.path}: {v.message}", highlight=False, markup=False)
        raise typer.Exit(2)
    except SceneError as exc:
        fail(str(exc))


def _world(path: Path):
    from mainspring.scenes.world import build_world

    scene = _load(path)
    try:
        return build_world(scene, path.parent)
    except SceneError as exc:
        fail(str(exc))


@app.command("validate")
def validate_cmd(path: Path = SceneFile) -> None:
    """Check the document: schema, ranges, unique ids, references, parent cycles."""
    scene = _load(path)
    typer.echo(f"{path}: valid {scene.version}: {len(scene.objects)} objects, {len(scene.lights)} lights, "
               f"{len(scene.constraints)} constraints")


@app.command("check")
def check_cmd(path: Path = SceneFile,
              as_json: bool = typer.Option(False, "--json", help="print the report as JSON")) -> None:
    """Measure every constraint of the scene; exit 1 if any fails."""
    from mainspring.scenes.checks import check_constraints

    report = check_constraints(_world(path))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=1))
    else:
        for r in report.results:
            typer.echo(str(r))
        typer.echo(f"{report.num_passed}/{len(report.results)} constraints pass")
    if not report.passed:
        raise typer.Exit(1)


@app.command("render")
def render_cmd(path: Path = SceneFile,
               out: Optional[Path] = typer.Option(None, "--out", "-o", help="PNG to write (default: FILE.png)"),
               ids: Optional[Path] = typer.Option(None, "--ids", help="also write the ID buffer in false colour"),
               width: int = typer.Option(512, min=16, max=4096, help="image width in pixels"),
               renderer: str = typer.Option("moderngl", "--renderer",
                                            help="moderngl (EGL, llvmpipe: a fraction of a second) or blender "
                                                 "(Cycles on the CPU, needs bpy: tens of seconds)"),
               samples: int = typer.Option(16, min=1, max=4096, help="Cycles samples per pixel (blender)"),
               blend: Optional[Path] = typer.Option(None, "--blend", help="blender: also save the .blend")) -> None:
    """Render the shaded preview from the scene's camera (headless: EGL, Mesa llvmpipe; or Cycles)."""
    from mainspring.scenes.preview import RenderUnavailable, shared_renderer
    from mainspring.scenes.render_settings import RENDERERS

    if renderer not in RENDERERS:
        fail(f"--renderer must be one of {', '.join(RENDERERS)}, not {renderer!r}")
    if blend is not None and renderer != "blender":
        fail("--blend needs --renderer blender")
    world = _world(path)
    out = out or path.with_suffix(".png")
    try:
        frame = shared_renderer().render(world, width)
    except RenderUnavailable as exc:
        fail(str(exc))
    if renderer == "blender":
        from mainspring.scenes.blender_render import blender_unavailable_reason, render_blender

        reason = blender_unavailable_reason()
        if reason:
            fail(reason)
        with err.status(f"Cycles: {width} px, {samples} samples"):
            done = render_blender(world.scene, path.parent, width, samples, blend)
        _write(out, done.png)
    else:
        _write(out, frame.png())
    if ids is not None:
        _write(ids, frame.ids_png())
    visible = sum(1 for n in frame.pixel_counts().values() if n > 0)
    saved = f"; saved {blend}" if blend is not None else ""
    typer.echo(f"wrote {out} ({frame.ids.shape[1]}x{frame.ids.shape[0]}, "
               f"{visible}/{len(frame.object_ids)} objects visible, {renderer}){saved}")


@app.command("export")
def export_cmd(path: Path = SceneFile,
               out: Optional[Path] = typer.Option(None, "--out", "-o",
                                                  help=".glb to write (default: FILE.glb); .usda/.usdc/.usd "
                                                       "writes USD (needs usd-core)")) -> None:
    """Export to glTF 2.0 binary (.glb) with lights, camera and the source in node extras, or to USD."""
    from mainspring.scenes.gltf_export import to_glb

    world = _world(path)
    out = out or path.with_suffix(".glb")
    if out.suffix in (".usda", ".usdc", ".usd"):
        from mainspring.scenes.usd_export import write_usd

        try:
            write_usd(world.scene, out, path.parent, world)
        except SceneError as exc:
            fail(str(exc))
        typer.echo(f"wrote {out} ({out.stat().st_size:,} bytes, {len(world.placed)} objects)")
        return
    data = to_glb(world.scene, path.parent, world)
    _write(out, data)
    typer.echo(f"wrote {out} ({len(data):,} bytes, {len(world.placed)} objects)")


@app.command("import")
def import_cmd(path: Path = typer.Argument(..., help="a .glb written by `mainspring scene export`"),
               out: Optional[Path] = typer.Option(None, "--out", "-o", help="JSON to write (default: stdout)")) -> None:
    """Recover the scene/0.1 document from an exported .glb."""
    from mainspring.scenes.gltf_import import from_glb

    try:
        doc = from_glb(path.read_bytes())
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}")
    except SceneError as exc:
        fail(f"{path}: {exc}")
    text = json.dumps(doc, indent=1) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        _write(out, text.encode("utf-8"))


@app.command("schema")
def schema_cmd(decoding: bool = typer.Option(False, "--decoding",
                                             help="the narrowed schema used for generation")) -> None:
    """Print the scene/0.1 JSON Schema (draft 2020-12)."""
    from mainspring.scenes.schema import decoding_schema, scene_json_schema

    typer.echo(json.dumps(decoding_schema() if decoding else scene_json_schema(), indent=1))


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
