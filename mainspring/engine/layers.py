"""Building blocks of Llama-family decoders: RMSNorm and rotary position embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from mainspring.engine.errors import UnsupportedModelError

if TYPE_CHECKING:
    from mainspring.engine.native_ops import FusedOps


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused: FusedOps | None = None  # the engine's compiled kernels for few-row steps (engine/native_ops.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) * weight, as one call: a decode step runs 61 of these on one row each,
        # where dispatching each small op costs more than its arithmetic
        if self.fused is not None and self.fused.fits(x, self.weight):
            return self.fused.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, this norm of it): a layer's residual add and the norm after it, in one kernel where the
        engine has fused ones. Forward hooks on this module do not see this call."""
        if self.fused is not None and self.fused.fits(x, self.weight) and self.fused.fits(residual) \
                and residual.shape == x.shape:
            return self.fused.add_rms_norm(x, residual, self.weight, self.eps)
        total = x + residual
        return total, self(total)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies, adjusted for the HF `rope_scaling` types we support."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv_freq.float()
    assert scaling is not None  # without scaling the kind is "default"
    factor = float(scaling["factor"])
    if kind == "linear":
        return (inv_freq / factor).float()
    if kind == "llama3":
        # Llama 3.1: leave high frequencies, divide low ones by `factor`, blend in between
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(mid, blended, out).float()
    raise UnsupportedModelError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


@dataclass
class Rotation:
    """RoPE's angles at one forward's positions, looked up once and shared by every layer.

    `signed_sin` is sin with the first half negated, so that rotate_half(x) * sin == x.roll(D/2) * signed_sin:
    the rotation is three ops (mul, roll, addcmul), applied to a layer's queries and keys together."""

    cos: torch.Tensor  # [T, 1, D]
    signed_sin: torch.Tensor  # [T, 1, D]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, D] -> rotated, a new tensor."""
        return torch.addcmul(x * self.cos, x.roll(x.shape[-1] // 2, -1), self.signed_sin)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (the Hugging Face layout) with a precomputed cos/sin table."""

    # buffers (register_buffer), declared for the type checker
    inv_freq: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    signed_sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.register_buffer("signed_sin", _signed(self.sin), persistent=False)

    def ensure(self, positions: torch.Tensor | int) -> None:
        """Positions past the trained context (a sliding-window sequence may run beyond it): grow
        the table, doubling, computing the new angles in float64 so large positions stay exact.
        Called once per forward, not per layer, with the largest position where the caller knows it on the host
        (reading it off a GPU's positions would make the host wait for the device every step)."""
        if isinstance(positions, torch.Tensor):
            if not positions.numel():
                return
            positions = int(positions.max())
        if positions < self.cos.shape[0]:
            return
        old = self.cos.shape[0]
        new = max(positions + 1, 2 * old)
        freqs = torch.outer(torch.arange(old, new, dtype=torch.float64, device=self.inv_freq.device),
                            self.inv_freq.double())
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = torch.cat([self.cos, emb.cos().float()])
        self.sin = torch.cat([self.sin, emb.sin().float()])
        self.signed_sin = _signed(self.sin)

    def at(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> Rotation:
        """The angles at `positions` [T] (after `ensure`), for `Rotation.apply` on [T, heads, D] of `dtype`."""
        return Rotation(self.cos[positions].unsqueeze(1).to(dtype), self.signed_sin[positions].unsqueeze(1).to(dtype))

    def forward(self, positions: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, D]
        sin = self.sin[positions].unsqueeze(1)
        return tuple(x * cos + _rotate_half(x) * sin for x in xs)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _signed(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
