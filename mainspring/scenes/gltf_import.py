"""A .glb written by gltf_export back to the scene/0.1 document it came from.

The exporter keeps every source object, light and the camera verbatim in its node's extras and
the document's other fields in the scene's extras; this reads them back in their original order.
A .glb from anywhere else has none of that and is refused with a clear error.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from mainspring.scenes.errors import SceneError
from mainspring.scenes.gltf_export import EXTRAS_KEY

_GLB_MAGIC = 0x46546C67  # "glTF"
_JSON_CHUNK = 0x4E4F534A  # "JSON"


def glb_json(data: bytes) -> dict[str, Any]:
    """The JSON chunk of a .glb file."""
    if len(data) < 20:
        raise SceneError("not a .glb file: too short")
    magic, version, length = struct.unpack_from("<III", data, 0)
    if magic != _GLB_MAGIC or version != 2:
        raise SceneError("not a glTF 2.0 binary (.glb) file")
    chunk_length, chunk_type = struct.unpack_from("<II", data, 12)
    if chunk_type != _JSON_CHUNK or 20 + chunk_length > min(length, len(data)):
        raise SceneError("malformed .glb: the first chunk must be JSON")
    try:
        return json.loads(data[20:20 + chunk_length].decode("utf-8"))
    except ValueError as exc:
        raise SceneError(f"malformed .glb JSON chunk: {exc}") from None


def from_glb(data: bytes) -> dict[str, Any]:
    """The scene/0.1 document stored in a .glb written by `to_glb` (validate it to use it)."""
    tree = glb_json(data)
    scenes = tree.get("scenes") or [{}]
    scene_extras = scenes[0].get("extras") or {}
    rest = scene_extras.get(EXTRAS_KEY)
    if not isinstance(rest, dict):
        raise SceneError("this .glb holds no scene/0.1 source (it was not written by mainspring scene export)")
    objects: list[tuple[int, dict]] = []
    lights: list[tuple[int, dict]] = []
    camera = None
    for node in tree.get("nodes", []):
        extras = node.get("extras") or {}
        if EXTRAS_KEY not in extras:
            continue
        if "camera" in node:
            camera = extras[EXTRAS_KEY]
        elif "KHR_lights_punctual" in (node.get("extensions") or {}):
            lights.append((extras.get("index", len(lights)), extras[EXTRAS_KEY]))
        else:
            objects.append((extras.get("index", len(objects)), extras[EXTRAS_KEY]))
    doc = dict(rest)
    doc["objects"] = [src for _, src in sorted(objects, key=lambda item: item[0])]
    if lights:
        doc["lights"] = [src for _, src in sorted(lights, key=lambda item: item[0])]
    if camera is not None:
        doc["camera"] = camera
    order = scene_extras.get("key_order") or list(doc)  # the source's key order, for identical JSON
    return {k: doc[k] for k in sorted(doc, key=lambda k: order.index(k) if k in order else len(order))}
