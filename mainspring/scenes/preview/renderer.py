"""The headless preview: a shaded image and an object-ID buffer of a placed scene, from the scene's
own camera, with the project's shaders (preview/shaders.py) on moderngl.

Passes: shadow depth from the first directional light; colour with 4x MSAA (opaque objects, then
transparent ones back to front); object ids without MSAA, so each pixel holds exactly one id.
Meshes are uploaded once per tessellation and kept (LRU), so a warm frame costs only the draws.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np

from mainspring.scenes.camera import PREVIEW_WIDTH, View, camera_view
from mainspring.scenes.preview import shaders
from mainspring.scenes.preview.context import gl_context
from mainspring.scenes.preview.frame import Frame
from mainspring.scenes.transforms import look_at_rotation
from mainspring.scenes.world import Placed, World

# Preview exposure: irradiance is divided by this many lux, so a 3-lux sun (a common glTF value)
# lights a white surface facing it to about white. glTF carries physical units; each renderer
# needs its own calibration (see ../shared/notes/scenes.md, pitfall 3).
REFERENCE_LUX = 3.0
SKY = (0.62, 0.66, 0.72)  # background, and the ambient term from above
AMBIENT_SKY, AMBIENT_GROUND = (0.30, 0.31, 0.33), (0.14, 0.13, 0.12)
DEFAULT_SUN = {"type": "directional", "intensity": 3.0, "color": (1.0, 1.0, 1.0),
               "position": (3.0, 6.0, 4.0), "target": (0.0, 0.0, 0.0)}
_TYPES = {"directional": 0, "point": 1, "spot": 2}
_MESH_CACHE = 256


class Renderer:
    def __init__(self, shadow_size: int = 1024, samples: int = 4) -> None:
        self.ctx = ctx = gl_context()
        with ctx:  # current in this thread, whichever made the context
            self.shaded = ctx.program(vertex_shader=shaders.SHADED_VERTEX, fragment_shader=shaders.SHADED_FRAGMENT)
            self.depth = ctx.program(vertex_shader=shaders.DEPTH_VERTEX, fragment_shader=shaders.DEPTH_FRAGMENT)
            self.ids = ctx.program(vertex_shader=shaders.DEPTH_VERTEX, fragment_shader=shaders.ID_FRAGMENT)
            self.shadow_map = ctx.depth_texture((shadow_size, shadow_size))
            self.shadow_map.compare_func = ""  # read raw depth; the shader compares (with PCF)
            # clamp, not wrap: PCF taps past the map's edge would read the opposite edge's depth
            self.shadow_map.repeat_x = self.shadow_map.repeat_y = False
            self.shadow_fbo = ctx.framebuffer(depth_attachment=self.shadow_map)
        self.samples = samples
        self._meshes: OrderedDict[int, tuple] = OrderedDict()
        self._targets: dict[tuple[int, int], tuple] = {}
        self._lock = threading.Lock()

    def render(self, world: World, width: int = PREVIEW_WIDTH) -> Frame:
        # An OpenGL context is current in one thread at a time: a call from another thread (a tool
        # run by a worker) must make it current there, or its draws silently go nowhere.
        with self._lock, self.ctx:
            return self._render(world, width)

    def _render(self, world: World, width: int) -> Frame:
        import moderngl

        ctx = self.ctx
        view = camera_view(world.scene.camera, width)
        lights = [light.model_dump() for light in world.scene.lights] or [DEFAULT_SUN]
        shadow_index = next((i for i, li in enumerate(lights) if li["type"] == "directional"), -1)
        light_vp = self._shadow_pass(world, lights[shadow_index]) if shadow_index >= 0 else np.eye(4)

        msaa, resolved, id_fbo = self._target(view.width, view.height)
        ctx.enable(moderngl.DEPTH_TEST)
        ctx.disable(moderngl.CULL_FACE)  # planes and open meshes are seen from both sides
        msaa.use()
        msaa.clear(*SKY, 1.0, depth=1.0)
        self._set_frame_uniforms(view, lights, shadow_index, light_vp)
        self.shadow_map.use(location=0)
        opaque = [p for p in world.placed if p.material.opacity >= 1.0]
        clear = sorted((p for p in world.placed if p.material.opacity < 1.0),
                       key=lambda p: -float(np.linalg.norm(p.centre - view.position)))
        for placed in opaque:
            self._draw_shaded(placed)
        if clear:
            ctx.enable(moderngl.BLEND)
            ctx.blend_func = moderngl.SRC_ALPHA, moderngl.ONE_MINUS_SRC_ALPHA
            msaa.depth_mask = False
            for placed in clear:
                self._draw_shaded(placed)
            msaa.depth_mask = True
            ctx.disable(moderngl.BLEND)
        ctx.copy_framebuffer(resolved, msaa)
        color = np.frombuffer(resolved.read(components=3), np.uint8).reshape(view.height, view.width, 3)

        id_fbo.use()
        id_fbo.clear(0.0, 0.0, 0.0, 0.0, depth=1.0)
        self.ids["u_view_projection"].write(_mat(view.view_projection))
        for placed in world.placed:
            self.ids["u_id"].value = placed.index + 1
            self.ids["u_model"].write(_mat(placed.matrix))
            self._vao(placed, self.ids).render()
        raw = np.frombuffer(id_fbo.read(components=3), np.uint8).reshape(view.height, view.width, 3)
        ids = raw[..., 0].astype(np.uint32) | raw[..., 1].astype(np.uint32) << 8 | raw[..., 2].astype(np.uint32) << 16
        # OpenGL's rows run bottom-up; images run top-down
        return Frame(np.ascontiguousarray(color[::-1]), np.ascontiguousarray(ids[::-1]), [p.id for p in world.placed])

    def _shadow_pass(self, world: World, sun: dict) -> np.ndarray:
        import moderngl

        casters = [p for p in world.placed if p.obj.shape != "plane"] or world.placed
        lo = np.min([p.lo for p in casters], axis=0)
        hi = np.max([p.hi for p in casters], axis=0)
        centre, radius = (lo + hi) / 2, max(float(np.linalg.norm(hi - lo)) / 2, 0.05) * 1.05
        direction = np.asarray(sun["target"], float) - np.asarray(sun["position"], float)
        direction /= np.linalg.norm(direction)
        eye = centre - direction * 2 * radius
        rot = look_at_rotation(eye, centre)
        light_view = np.eye(4)
        light_view[:3, :3] = rot.T
        light_view[:3, 3] = -rot.T @ eye
        near, far = 0.0, 4 * radius
        ortho = np.diag([1 / radius, 1 / radius, -2 / (far - near), 1.0])
        ortho[2, 3] = -(far + near) / (far - near)
        light_vp = ortho @ light_view
        self.ctx.enable(moderngl.DEPTH_TEST)
        self.shadow_fbo.use()
        self.shadow_fbo.clear(depth=1.0)
        self.depth["u_view_projection"].write(_mat(light_vp))
        for placed in world.placed:
            self.depth["u_model"].write(_mat(placed.matrix))
            self._vao(placed, self.depth).render()
        return light_vp

    def _set_frame_uniforms(self, view: View, lights: list[dict], shadow_index: int, light_vp: np.ndarray) -> None:
        n = shaders.MAX_LIGHTS
        kinds, radiance, positions, directions, ranges, cones = [], [], [], [], [], []
        for li in lights[:n]:
            kinds.append(_TYPES[li["type"]])
            radiance.append(tuple(c * li["intensity"] / REFERENCE_LUX for c in li["color"]))
            positions.append(tuple(li["position"]))
            d = np.asarray(li["target"], float) - np.asarray(li["position"], float)
            directions.append(tuple(d / max(np.linalg.norm(d), 1e-12)))
            ranges.append(li.get("range") or 0.0)
            outer = math.radians(li.get("outer_cone_deg") or 45.0)
            inner = math.radians(li.get("inner_cone_deg") or 0.0)
            cones.append((math.cos(outer), math.cos(inner)))
        pad = n - len(kinds)
        values = {
            "u_light_count": len(kinds), "u_light_type": kinds + [0] * pad,
            "u_light_radiance": radiance + [(0.0, 0.0, 0.0)] * pad,
            "u_light_position": positions + [(0.0, 0.0, 0.0)] * pad,
            "u_light_direction": directions + [(0.0, -1.0, 0.0)] * pad,
            "u_light_range": ranges + [0.0] * pad, "u_light_cone": cones + [(0.0, 1.0)] * pad,
            "u_shadow_light": shadow_index, "u_shadow_map": 0, "u_eye": tuple(view.position),
            "u_sky": AMBIENT_SKY, "u_ground": AMBIENT_GROUND,
        }
        for name, value in values.items():
            if self.shaded.get(name, None) is not None:  # GLSL drops uniforms a shader does not use
                self.shaded[name].value = value
        self.shaded["u_view_projection"].write(_mat(view.view_projection))
        self.shaded["u_light_view_projection"].write(_mat(light_vp))

    def _draw_shaded(self, placed: Placed) -> None:
        m, prog = placed.material, self.shaded
        prog["u_model"].write(_mat(placed.matrix))
        normal = np.linalg.inv(placed.matrix[:3, :3]).T  # keeps normals perpendicular under scale
        prog["u_normal_matrix"].write(normal.T.astype("f4").tobytes())
        prog["u_albedo"].value = tuple(m.color)
        prog["u_opacity"].value = m.opacity
        prog["u_metallic"].value = m.metallic
        prog["u_roughness"].value = m.roughness
        prog["u_emissive"].value = tuple(m.emissive or (0.0, 0.0, 0.0))
        self._vao(placed, prog).render()

    def _vao(self, placed: Placed, program):
        surface = placed.mesh.surface
        key = id(surface)
        entry = self._meshes.get(key)
        if entry is None or entry[0] is not surface:
            data = np.hstack([surface.vertices, surface.vertex_normals]).astype("f4")
            vbo = self.ctx.buffer(data.tobytes())
            ibo = self.ctx.buffer(np.asarray(surface.faces, dtype="u4").tobytes())
            entry = (surface, vbo, ibo, {})
            self._meshes[key] = entry
            while len(self._meshes) > _MESH_CACHE:
                _, (_, old_vbo, old_ibo, vaos) = self._meshes.popitem(last=False)
                for vao in vaos.values():
                    vao.release()
                old_vbo.release()
                old_ibo.release()
        self._meshes.move_to_end(key)
        _, vbo, ibo, vaos = entry
        if program.glo not in vaos:
            with_normals = program.get("in_normal", None) is not None
            layout = "3f 3f" if with_normals else "3f 12x"
            names = ["in_position", "in_normal"] if with_normals else ["in_position"]
            vaos[program.glo] = self.ctx.vertex_array(program, [(vbo, layout, *names)], ibo)
        return vaos[program.glo]

    def _target(self, width: int, height: int) -> tuple:
        if (width, height) not in self._targets:
            ctx, size = self.ctx, (width, height)
            msaa = ctx.framebuffer(ctx.renderbuffer(size, 4, samples=self.samples),
                                   ctx.depth_renderbuffer(size, samples=self.samples))
            resolved = ctx.framebuffer(ctx.renderbuffer(size, 4))
            ids = ctx.framebuffer(ctx.renderbuffer(size, 4), ctx.depth_renderbuffer(size))
            self._targets[(width, height)] = (msaa, resolved, ids)
        return self._targets[(width, height)]


def _mat(m: np.ndarray) -> bytes:
    return np.asarray(m, dtype="f4").T.tobytes()  # GLSL matrices are column-major


_shared: Renderer | None = None
_shared_lock = threading.Lock()


def shared_renderer() -> Renderer:
    """One renderer per process (its context, programs and uploaded meshes are reused)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Renderer()
        return _shared
