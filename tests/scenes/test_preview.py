"""The headless renderer: a real image, an ID buffer that shows exactly what the camera sees, the
visibility checks built on them, and the render job the sandbox runs."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mainspring.scenes.camera import camera_view
from mainspring.scenes.preview import shared_renderer
from mainspring.scenes.preview.renderer import SKY
from tests.scenes.helpers import box, doc, living_room, world
from tests.scenes.test_checks_relations import measure

CAMERA = {"position": [0, 1.5, 5], "look_at": [0, 0.5, 0], "yfov_deg": 50}
FLOOR = {"id": "floor", "shape": "plane", "size": [10, 10], "material": {"color": [0.6, 0.6, 0.55]}}
WALL = box("wall", [3, 2, 0.1], [0, 1, 0], material={"color": [0.7, 0.3, 0.2]})
FRONT = box("front_box", [0.5, 0.5, 0.5], [0.8, 0.25, 1.5], material={"color": [0.9, 0.8, 0.1]})
HIDDEN = box("hidden_box", [0.5, 0.5, 0.5], [0, 0.25, -1])
BEHIND_CAMERA = box("behind_camera", [0.5, 0.5, 0.5], [0, 0.25, 7])
OFF_TO_THE_SIDE = box("off_side", [0.5, 0.5, 0.5], [20, 0.25, 0])
INSIDE = box("inside", [0.1, 0.1, 0.1], [0.8, 0.25, 1.5], tags=["ignore_collision"])


@pytest.fixture(scope="module")
def occlusion():
    w = world(doc(FLOOR, WALL, FRONT, HIDDEN, BEHIND_CAMERA, OFF_TO_THE_SIDE, INSIDE, camera=CAMERA))
    return w, shared_renderer().render(w)


def test_the_id_buffer_shows_exactly_the_visible_objects(occlusion):
    w, frame = occlusion
    assert frame.ids.shape == (512, 512) and frame.color.shape == (512, 512, 3)
    assert frame.visible() == {"floor", "wall", "front_box"}
    counts = frame.pixel_counts()
    assert counts["hidden_box"] == counts["behind_camera"] == counts["off_side"] == counts["inside"] == 0
    assert set(np.unique(frame.ids)) == {0, 1, 2, 3}  # background, floor, wall, front_box
    # the front box is drawn where it projects: its centre pixel carries its id
    pixels, _ = camera_view(w.scene.camera).project(np.array([[0.8, 0.25, 1.5]]))
    px, py = pixels[0]
    assert frame.ids[int(py), int(px)] == 3


def test_the_preview_is_a_shaded_image_not_a_blank(occlusion):
    _, frame = occlusion
    gray = frame.color.astype(float).mean(axis=2)
    assert gray.std() > 20
    sky = frame.color[frame.ids == 0].astype(int)
    wall = frame.color[frame.ids == 2].astype(int)
    front = frame.color[frame.ids == 3].astype(int)
    assert wall[:, 0].mean() > wall[:, 2].mean() + 40  # the red brick wall is red
    assert front[:, 0].mean() > 150 and front[:, 2].mean() < 100  # the yellow box is yellow
    assert np.abs(sky.mean(axis=0) - np.asarray(SKY) * 255).max() <= 1  # the clear colour, untouched
    image = Image.open(io.BytesIO(frame.png()))
    assert image.size == (512, 512) and image.mode == "RGB"
    assert np.array_equal(np.asarray(image), frame.color)


def test_renders_are_repeatable_and_transparent_objects_keep_their_ids():
    glass = box("glass", [1, 1, 0.1], [0, 0.5, 2], material={"color": [0.6, 0.8, 0.9], "opacity": 0.3})
    w = world(doc(FLOOR, WALL, glass, camera=CAMERA))
    first, second = shared_renderer().render(w), shared_renderer().render(w)
    assert np.array_equal(first.ids, second.ids) and np.array_equal(first.color, second.color)
    assert first.pixel_counts()["glass"] > 1000
    behind_glass = first.ids == 3
    wall_colour = first.color[(first.ids == 2)].mean(axis=0)
    assert np.abs(first.color[behind_glass].mean(axis=0) - wall_colour).max() > 10  # tinted, not replaced


def test_a_worker_thread_renders_the_same_frame(occlusion):
    w, frame = occlusion
    done = {}
    worker = threading.Thread(target=lambda: done.update(frame=shared_renderer().render(w)))
    worker.start()
    worker.join(timeout=60)
    assert np.array_equal(done["frame"].ids, frame.ids) and np.array_equal(done["frame"].color, frame.color)


def test_image_size_follows_the_camera_aspect():
    w = world(doc(FLOOR, WALL, camera={**CAMERA, "aspect": 2.0}))
    frame = shared_renderer().render(w, width=256)
    assert frame.color.shape == (128, 256, 3) and frame.ids.shape == (128, 256)


def test_visible_in_camera_counts_pixels():
    scene = doc(FLOOR, WALL, FRONT, HIDDEN, camera=CAMERA)
    frame = shared_renderer().render(world(scene))
    r = measure({**scene, "constraints": []}, {"type": "visible_in_camera", "a": "front_box", "min_pixels": 50})
    assert r.passed and r.unit == "px" and r.value == frame.pixel_counts()["front_box"] > 50
    r = measure(scene, {"type": "visible_in_camera", "a": "hidden_box"})
    assert not r.passed and r.value == 0
    too_many = frame.pixel_counts()["front_box"] + 1
    r = measure(scene, {"type": "visible_in_camera", "a": "front_box", "min_pixels": too_many})
    assert not r.passed and r.value == too_many - 1


def test_in_frame_measures_pixels_past_the_edge():
    camera = {"position": [0, 0, 0], "look_at": [0, 0, -1], "yfov_deg": 90}  # 512 px span x/z in [-1, 1]
    inside = box("a", [0.2, 0.2, 0.2], [0, 0, -1])
    r = measure(doc(inside, camera=camera), {"type": "in_frame", "a": "a"})
    assert r.passed and r.value == 0.0
    right = box("a", [0.2, 0.2, 0.2], [1.5, 0, -1])  # nearest-face corner x = 1.6 at z = -0.9
    r = measure(doc(right, camera=camera), {"type": "in_frame", "a": "a"})
    expected = (1.6 / 0.9 + 1) / 2 * 512 - 512
    assert not r.passed and r.value == pytest.approx(expected, rel=1e-6)
    r = measure(doc(inside, camera=camera), {"type": "in_frame", "a": "a", "margin_px": 240})
    inner = (0.1 / 0.9 + 1) / 2 * 512  # the box's extent in px from the centre, at its near face
    assert not r.passed and r.value == pytest.approx(inner - (512 - 240), rel=1e-6)
    behind = box("a", [0.2, 0.2, 0.2], [0, 0, 1])
    r = measure(doc(behind, camera=camera), {"type": "in_frame", "a": "a"})
    assert not r.passed and r.value is None and "entirely behind" in r.detail


def _run_job(tmp_path: Path, scene: dict | str) -> tuple[int, dict]:
    (tmp_path / "scene.json").write_text(scene if isinstance(scene, str) else json.dumps(scene))
    proc = subprocess.run([sys.executable, "-m", "mainspring.scenes.render_job", "scene.json", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads((tmp_path / "out" / "report.json").read_text())


def test_render_job_writes_preview_ids_and_report(tmp_path):
    status, report = _run_job(tmp_path, living_room())
    assert status == 0 and report["valid"] and report["exit_status"] == 0
    out = tmp_path / "out"
    ids = np.load(out / "ids.npy")
    assert ids.shape == (512, 512) and ids.dtype == np.uint16
    assert report["pixels"] == {oid: int((ids == k + 1).sum()) for k, oid in enumerate(report["object_ids"])}
    assert report["constraints"]["passed"] and report["constraints"]["num_constraints"] == 8
    assert report["renderer"].strip()  # e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
    assert Image.open(out / "preview.png").size == (512, 512) and Image.open(out / "ids.png").size == (512, 512)


def test_render_job_reports_an_invalid_scene_and_exits_2(tmp_path):
    broken = living_room()
    broken["objects"][1]["size"] = [1.2, -0.05, 0.8]
    status, report = _run_job(tmp_path, broken)
    assert status == 2 and not report["valid"]
    assert report["violations"] == [{"path": "$.objects[1].size[1]",
                                     "message": "Input should be greater than or equal to 0.001"}]
    assert not (tmp_path / "out" / "preview.png").exists()
    status, report = _run_job(tmp_path, "{not json")
    assert status == 2 and report["violations"][0]["path"] == "$"


def test_the_package_functions_take_a_document_or_a_file():
    from mainspring import scenes
    from tests.scenes.helpers import DATA

    png = scenes.render(living_room(), width=64)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and Image.open(io.BytesIO(png)).size == (64, 64)
    report = scenes.check(DATA / "living_room.json")
    assert report.passed and report.num_passed == 8
    assert scenes.from_gltf(scenes.to_gltf(json.dumps(living_room()))) == living_room()
