"""POST /v1/scenes/gltf: a scene/0.1 document as a glTF binary, for the console's 3D viewer.

The scene tools hand the model a rendered preview and a constraint report; the document itself is in the tool
call's arguments. The console sends it here to look at it from every side. Only the document is read: no
base directory is given, so a scene cannot name a file on the server.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from mainspring import scenes
from mainspring.api.errors import APIError

router = APIRouter()
MAX_VIOLATIONS_SHOWN = 5


class SceneBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scene: dict[str, Any] = Field(..., description="a scene/0.1 document")


def invalid(message: str) -> APIError:
    return APIError(400, message, param="scene", code="invalid_scene")


@router.post("/v1/scenes/gltf", response_class=Response,
             responses={200: {"content": {"model/gltf-binary": {}}, "description": "the scene as a .glb"}})
async def scene_gltf(body: SceneBody) -> Response:
    violations = scenes.validate(body.scene)
    if violations:
        shown = "; ".join(f"{v.path}: {v.message}" for v in violations[:MAX_VIOLATIONS_SHOWN])
        more = len(violations) - MAX_VIOLATIONS_SHOWN
        raise invalid(f"the scene is not valid scene/0.1: {shown}" + (f" (and {more} more)" if more > 0 else ""))
    try:
        glb = await asyncio.to_thread(scenes.to_gltf, body.scene)
    except (scenes.SceneError, ValueError) as exc:  # valid as a document, but not buildable (a mesh file it names)
        raise invalid(f"the scene cannot be exported: {exc}") from None
    return Response(glb, media_type="model/gltf-binary")
