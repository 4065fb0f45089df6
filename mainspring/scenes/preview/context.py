"""One headless OpenGL context per process: EGL, surfaceless, on Mesa's llvmpipe when there is no
GPU. Creating it takes ~0.5 s, so it is made once and kept.

moderngl must be told `backend="egl"`: its default (GLX) needs an X display, which a server or a
sandbox does not have.
"""

from __future__ import annotations

import threading

from mainspring.scenes.errors import SceneError

_lock = threading.Lock()
_context = None
INSTALL_HINT = "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri (Mesa's EGL and llvmpipe)"


class RenderUnavailable(SceneError):
    """No OpenGL 3.3 context could be created (EGL or Mesa missing)."""


def gl_context():
    """The process's moderngl context (created on first use)."""
    global _context
    with _lock:
        if _context is None:
            try:
                import moderngl
            except ImportError as exc:
                raise RenderUnavailable(f"rendering needs the moderngl package: {exc}") from None
            try:
                _context = moderngl.create_standalone_context(backend="egl", require=330)
            except Exception as exc:  # glcontext raises plain Exceptions naming the failed EGL call
                raise RenderUnavailable(f"no headless OpenGL 3.3 context ({exc}); install {INSTALL_HINT}") from None
        return _context


def renderer_name() -> str:
    """The OpenGL renderer string, e.g. 'llvmpipe (LLVM 15.0.6, 256 bits)'."""
    ctx = gl_context()
    with ctx:  # a GL query answers for the context current in this thread
        return ctx.info["GL_RENDERER"]
