"""Agent tools of the 3D scenario, as the run loop's `Tool`s: `scene_validate` and `scene_render`
(a 512 px preview PNG as an artifact, plus the constraint report).

A render runs in the run's sandbox when it has one (the `render` profile: no network, software
EGL; `render_cycles`, with minutes of CPU, for the Blender renderer), as `RENDER_JOB_COMMAND` with
scene.json as its only file; without a sandbox it runs in this process. Either way the job writes
the same files and they are read the same way.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mainspring.agents.tools.base import Artifact, ToolContext, ToolError, ToolResult
from mainspring.config import Settings
from mainspring.scenes.render_settings import RenderSettings
from mainspring.scenes.schema import scene_json_schema
from mainspring.scenes.validate import validate

RENDER_JOB_COMMAND = ["python3", "-m", "mainspring.scenes.render_job", "scene.json", "out"]


@dataclass
class RenderJobResult:
    exit_status: int
    report: dict[str, Any]
    preview_png: bytes | None


def job_result_from_files(exit_status: int, files: dict[str, bytes], out_dir: str = "out") -> RenderJobResult:
    """A render job's result from the files it wrote (paths relative to its working directory)."""
    raw = files.get(f"{out_dir}/report.json")
    try:
        report = json.loads(raw) if raw is not None else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        report = {"valid": False, "violations": [], "error": f"the render job wrote no report (exit {exit_status})"}
    return RenderJobResult(exit_status, report, files.get(f"{out_dir}/preview.png"))


def render_in_process(doc: dict[str, Any], settings: RenderSettings | None = None) -> RenderJobResult:
    """Run the render job in this process, in a temporary folder."""
    from mainspring.scenes import render_job

    with tempfile.TemporaryDirectory(prefix="scene-render-") as tmp:
        work = Path(tmp)
        (work / "scene.json").write_text(json.dumps(doc), encoding="utf-8")
        status = render_job.run(work / "scene.json", work / "out", settings=settings)
        files = {f"out/{p.name}": p.read_bytes() for p in (work / "out").iterdir()}
    return job_result_from_files(status, files)


def render_in_sandbox(sandbox, doc: dict[str, Any], cancel=None,
                      settings: RenderSettings | None = None) -> RenderJobResult:
    """Run the render job in `sandbox` (a mainspring.sandbox.Sandbox) under the render profile."""
    from mainspring.sandbox import SandboxError

    settings = settings or RenderSettings()
    command = RENDER_JOB_COMMAND + settings.job_args()
    profile = settings.sandbox_profile
    try:
        result = sandbox.run(command, {"scene.json": json.dumps(doc).encode()}, profile, cancel=cancel)
    except SandboxError as exc:
        raise ToolError(f"the sandbox could not render: {exc}") from exc
    job = job_result_from_files(result.exit_code, result.files)
    if result.killed_by:
        fewer = " (fewer --samples or a smaller --width)" if settings.renderer == "blender" else ""
        # the limit is the cause: it says more than "wrote no report"
        job.report["error"] = (f"the render job was stopped: {result.killed_by} limit of the sandbox's {profile} "
                               f"profile; render less{fewer} or raise the limit in a profiles file "
                               "(MAINSPRING_SANDBOX_PROFILES_FILE)")
    return job


@dataclass
class SceneTool:
    """A `mainspring.agents.tools.base.Tool`: the work is synchronous and runs in a worker thread."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any], ToolContext | None], ToolResult]
    idempotent: bool = True  # same scene, same answer: safe to re-run after a crash
    requires_approval: bool = False
    timeout_s: float = 120.0
    retries: int = 0

    async def call(self, args: dict, ctx: ToolContext) -> ToolResult:
        return await asyncio.to_thread(self.run, args if isinstance(args, dict) else {}, ctx)


def _scene_argument() -> dict[str, Any]:
    schema = scene_json_schema()
    del schema["$schema"], schema["$id"]
    return {"type": "object", "properties": {"scene": schema}, "required": ["scene"], "additionalProperties": False}


def _scene(args: dict[str, Any]) -> Any:
    scene = args.get("scene")
    if isinstance(scene, str):  # some models send an object argument as JSON text
        try:
            return json.loads(scene)
        except ValueError:
            return scene  # validation reports it, with where the JSON breaks
    return scene


def _validate(args: dict[str, Any], ctx: ToolContext | None) -> ToolResult:
    violations = [v.to_dict() for v in validate(_scene(args))]
    report = {"valid": not violations, "violations": violations}
    return ToolResult(json.dumps(report), data=report)


def _render(args: dict[str, Any], ctx: ToolContext | None, settings: RenderSettings | None = None) -> ToolResult:
    scene = _scene(args)
    violations = [v.to_dict() for v in validate(scene)]
    if violations:  # nothing to render: the violations are the answer
        report = {"valid": False, "violations": violations}
        return ToolResult(json.dumps(report), data=report, is_error=True)
    sandbox = getattr(ctx, "sandbox", None)
    job = (render_in_sandbox(sandbox, scene, getattr(ctx, "cancel", None), settings) if sandbox is not None
           else render_in_process(scene, settings))
    report = {"valid": job.report.get("valid", False), "violations": job.report.get("violations", []),
              "rendered": job.preview_png is not None}
    for key in ("error", "pixels", "constraints", "preview_renderer", "renderer_fallback"):
        if key in job.report:
            report[key] = job.report[key]
    artifacts = [Artifact("preview.png", job.preview_png, "image/png")] if job.preview_png else []
    return ToolResult(json.dumps(report), data=report, is_error=job.preview_png is None, artifacts=artifacts)


def scene_validate_tool() -> SceneTool:
    return SceneTool(
        name="scene_validate",
        description="Check a scene/0.1 document: schema, value ranges, unique ids, references, parent cycles. "
                    "Returns every problem with its JSON path.",
        parameters=_scene_argument(), run=_validate, timeout_s=10.0)


def scene_render_tool(settings: RenderSettings | None = None) -> SceneTool:
    """The render tool; `settings` picks the renderer of its preview (moderngl unless told)."""
    settings = settings or RenderSettings()
    return SceneTool(
        name="scene_render",
        description="Render a scene/0.1 document from its camera (512 px preview PNG) and check its constraints: "
                    "each passes or fails with the measured quantity (gap, overlap volume, pixels...), and "
                    "every object's visible pixels.",
        parameters=_scene_argument(), run=lambda args, ctx: _render(args, ctx, settings),
        timeout_s=120.0 if settings.renderer == "moderngl" else 600.0)


def scene_tools() -> list[SceneTool]:
    return [scene_validate_tool(), scene_render_tool()]


def agent_tool_pack(settings: Settings) -> list[SceneTool]:
    """This scenario's tools for every agent run: the `mainspring.agent_tools` entry point (pyproject.toml)."""
    return scene_tools()
