"""Which renderer makes a scene's preview, as one typed setting shared by the render job and the
agent's scene_render tool: `moderngl` (the default: EGL on llvmpipe, ~0.1 s a frame) or `blender`
(Cycles on the CPU through the optional bpy package, tens of seconds a frame). The checks always
use the moderngl ID buffer, whichever renderer draws the picture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

RendererName = Literal["moderngl", "blender"]
RENDERERS: tuple[str, ...] = get_args(RendererName)


@dataclass(frozen=True)
class RenderSettings:
    renderer: RendererName = "moderngl"
    width: int = 512
    samples: int = 16  # Cycles samples per pixel (blender only)

    def __post_init__(self) -> None:
        if self.renderer not in RENDERERS:
            raise ValueError(f"renderer must be one of {', '.join(RENDERERS)}, not {self.renderer!r}")
        if not 16 <= self.width <= 4096:
            raise ValueError("width must be between 16 and 4096")
        if not 1 <= self.samples <= 4096:
            raise ValueError("samples must be between 1 and 4096")

    @property
    def sandbox_profile(self) -> str:
        """The sandbox profile a render job with these settings runs under (mainspring/sandbox/profiles.py):
        Cycles needs minutes of CPU where a moderngl frame needs a fraction of a second."""
        return "render_cycles" if self.renderer == "blender" else "render"

    def job_args(self) -> list[str]:
        """The render job's options for these settings (none for the defaults)."""
        args = [] if self.width == 512 else ["--width", str(self.width)]
        if self.renderer != "moderngl":
            args += ["--renderer", self.renderer, "--samples", str(self.samples)]
        return args
