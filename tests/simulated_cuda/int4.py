"""torch's CUDA int4 kernels emulated from their contract (see the package docstring)."""

from __future__ import annotations

import torch


def int4pack(codes: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise RuntimeError("_convert_weight_to_int4pack: expected a 2D uint8 tensor [N, K/2]")
    if inner_k_tiles not in (2, 4, 8):
        raise RuntimeError("_convert_weight_to_int4pack: innerKTiles must be 2, 4, or 8")
    n, k = codes.shape[0], codes.shape[1] * 2
    if n % 8 or k % (16 * inner_k_tiles):
        raise RuntimeError(f"_convert_weight_to_int4pack: N={n} must divide 8, K={k} must divide {16 * inner_k_tiles}")
    # the kernel's shape; the emulation keeps the bytes in its own order (the high-nibble-first codes as given)
    return codes.contiguous().view(torch.int32).reshape(n // 8, k // (16 * inner_k_tiles), 32, inner_k_tiles // 2)


def int4pack_mm(x: torch.Tensor, packed: torch.Tensor, group_size: int, sz: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.bfloat16:
        raise RuntimeError(f"_weight_int4pack_mm: expected x to be bf16, got {x.dtype}")
    if group_size not in (32, 64, 128, 256):
        raise RuntimeError("_weight_int4pack_mm: qGroupSize must be 32, 64, 128 or 256")
    n = packed.shape[0] * 8
    k = packed.shape[1] * 16 * packed.shape[3] * 2
    if x.dim() != 2 or x.shape[1] != k or not x.is_contiguous():
        raise RuntimeError(f"_weight_int4pack_mm: expected a contiguous x of shape [M, {k}], got {tuple(x.shape)}")
    if sz.dtype != torch.bfloat16 or tuple(sz.shape) != (k // group_size, n, 2):
        raise RuntimeError(f"_weight_int4pack_mm: expected qScaleAndZeros bf16 [{k // group_size}, {n}, 2], got "
                           f"{sz.dtype} {tuple(sz.shape)}")
    codes = packed.reshape(-1).view(torch.uint8).reshape(n, k // 2)
    q = torch.stack([codes >> 4, codes & 15], dim=-1).reshape(n, k).float()  # column 2j in the high nibble
    scale = sz[..., 0].float().t().repeat_interleave(group_size, dim=1)
    zero = sz[..., 1].float().t().repeat_interleave(group_size, dim=1)
    w = (q - 8) * scale + zero
    return (x.float() @ w.t()).to(torch.bfloat16)
