"""`mainspring scene ...`: results on stdout, problems on stderr with exit code 2, no tracebacks."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mainspring.scenes.cli import app
from tests.scenes.helpers import living_room

runner = CliRunner()


@pytest.fixture
def scene_file(tmp_path):
    path = tmp_path / "room.json"
    path.write_text(json.dumps(living_room()))
    return path


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_validate(scene_file, tmp_path):
    ok = run("validate", scene_file)
    assert ok.exit_code == 0 and "valid scene/0.1: 16 objects, 2 lights, 8 constraints" in ok.stdout
    broken = living_room()
    broken["objects"][2].pop("height")
    broken["objects"][7]["parent"] = "nobody"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    result = run("validate", bad)
    assert result.exit_code == 2 and result.stdout == ""
    assert "$.objects[2].height: required field is missing" in result.stderr
    missing = run("validate", tmp_path / "nope.json")
    assert missing.exit_code == 2 and "cannot read" in missing.stderr and "No such file" in missing.stderr


def test_check_exits_1_when_a_constraint_fails(scene_file, tmp_path):
    ok = run("check", scene_file)
    assert ok.exit_code == 0 and ok.stdout.strip().endswith("8/8 constraints pass")
    assert "PASS on_top_of(book, table_top): gap = 0 m" in ok.stdout
    lifted = living_room()
    lifted["objects"][7]["position"][1] += 0.1  # the cup hovers 10 cm over the table
    path = tmp_path / "lifted.json"
    path.write_text(json.dumps(lifted))
    result = run("check", path, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    failed = [(r["label"], r["value"]) for r in report["results"] if not r["passed"]]
    assert failed == [("on_top_of(cup, table_top)", pytest.approx(0.1)), ("no_floating(*)", pytest.approx(0.1))]


def test_render_export_and_import(scene_file, tmp_path):
    result = run("render", scene_file, "--ids", tmp_path / "ids.png", "--width", 128)
    assert result.exit_code == 0 and "(128x128, 16/16 objects visible, moderngl)" in result.stdout
    assert (tmp_path / "room.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "ids.png").is_file()
    result = run("export", scene_file, "-o", tmp_path / "room.glb")
    assert result.exit_code == 0 and "16 objects" in result.stdout
    result = run("import", tmp_path / "room.glb")
    assert result.exit_code == 0 and json.loads(result.stdout) == living_room()
    junk = tmp_path / "junk.glb"
    junk.write_bytes(b"not a glb file at all, not even close")
    result = run("import", junk)
    assert result.exit_code == 2 and "not a glTF 2.0 binary" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--renderer", "povray"], "--renderer must be one of moderngl, blender"),
    (["--blend", "x.blend"], "--blend needs --renderer blender"),
])
def test_render_refuses_a_bad_renderer_choice(scene_file, args, message):
    result = run("render", scene_file, *args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_render_with_blender_writes_cycles_pixels_and_the_blend_or_says_why_not(scene_file, tmp_path):
    from mainspring.scenes.blender_render import blender_unavailable_reason

    reason = blender_unavailable_reason()
    result = run("render", scene_file, "--renderer", "blender", "--samples", 2, "--width", 64,
                 "-o", tmp_path / "cycles.png", "--blend", tmp_path / "room.blend")
    if reason:
        assert result.exit_code == 2 and "bpy is not installed" in result.stderr
        return
    assert result.exit_code == 0 and "blender); saved" in result.stdout
    assert (tmp_path / "cycles.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "room.blend").is_file()


def test_schema_prints_both_schemas():
    full = json.loads(run("schema").stdout)
    narrow = json.loads(run("schema", "--decoding").stdout)
    assert full["title"] == narrow["title"] == "scene/0.1"
    assert "MeshAsset" in full["$defs"] and "MeshAsset" not in narrow["$defs"]
