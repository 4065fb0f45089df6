"""Small scenes built in tests: a floor-level box/sphere world with a camera looking at it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from mainspring.scenes.validate import load_scene
from mainspring.scenes.world import World, build_world

DATA = Path(__file__).parent / "data"
CAMERA = {"position": [0.0, 1.5, 4.0], "look_at": [0.0, 0.5, 0.0], "yfov_deg": 50.0}


def living_room() -> dict:
    return json.loads((DATA / "living_room.json").read_text())


def box(oid: str, size, position, **extra) -> dict:
    return {"id": oid, "shape": "box", "size": list(size), "position": list(position), **extra}


def sphere(oid: str, radius: float, position, **extra) -> dict:
    return {"id": oid, "shape": "sphere", "radius": radius, "position": list(position), **extra}


def doc(*objects: dict, constraints=(), camera=None, **top) -> dict:
    return {"schema": "scene/0.1", "objects": [copy.deepcopy(o) for o in objects],
            "camera": copy.deepcopy(camera or CAMERA), "constraints": list(constraints), **top}


def world(document: dict, base_dir: Path | None = None) -> World:
    return build_world(load_scene(document, base_dir), base_dir)
