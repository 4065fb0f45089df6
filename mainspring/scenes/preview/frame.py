"""A rendered frame: the shaded preview and the object-ID buffer, with their image encodings."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np


@dataclass
class Frame:
    color: np.ndarray  # (height, width, 3) uint8 sRGB, row 0 at the top
    ids: np.ndarray  # (height, width) uint32: 0 = background, k = the scene's k-th object (1-based)
    object_ids: list[str]  # scene.objects order: object_ids[k - 1] is the id behind value k

    def pixel_counts(self) -> dict[str, int]:
        """Visible pixels of every object (0 for hidden ones)."""
        counts = np.bincount(self.ids.ravel(), minlength=len(self.object_ids) + 1)
        return {oid: int(counts[i + 1]) for i, oid in enumerate(self.object_ids)}

    def visible(self) -> set[str]:
        return {oid for oid, n in self.pixel_counts().items() if n > 0}

    def png(self) -> bytes:
        return _png(self.color)

    def ids_png(self) -> bytes:
        """The ID buffer in false colour, for people: each object its own hue, background black."""
        palette = _palette(len(self.object_ids) + 1)
        return _png(palette[self.ids])


def _palette(n: int) -> np.ndarray:
    # golden-ratio hues: neighbouring ids get clearly different colours
    hues = (np.arange(n) * 0.618033988749895) % 1.0
    k = (np.array([5.0, 3.0, 1.0])[None, :] + hues[:, None] * 6) % 6
    rgb = 1 - 0.75 * np.clip(np.minimum(k, 4 - k), 0, 1)
    out = (rgb * 255).astype(np.uint8)
    out[0] = 0
    return out


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels), "RGB").save(buf, format="PNG", optimize=False)
    return buf.getvalue()
