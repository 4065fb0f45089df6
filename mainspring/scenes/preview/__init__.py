"""Headless previews: shaded PNG and object-ID buffer (moderngl on EGL, the project's shaders)."""

from mainspring.scenes.preview.context import RenderUnavailable, renderer_name
from mainspring.scenes.preview.frame import Frame
from mainspring.scenes.preview.renderer import Renderer, shared_renderer

__all__ = ["Frame", "RenderUnavailable", "Renderer", "renderer_name", "shared_renderer"]
