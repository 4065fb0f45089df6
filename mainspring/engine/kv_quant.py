"""The cold tier of a layered KV cache: KV blocks that left the recent fp32 window, kept in int8 or int4.

Quantization follows KIVI (arXiv 2402.02750), asymmetric (scale + min) and round-to-nearest:

- KEYS per channel: for each block, KV head and channel, one scale/min over the block's tokens.
  Keys have outlier channels, large in every token (SmolLM2-135M: the largest key channel of a head is
  3-6x the median channel's magnitude; KIVI reports far more in bigger models). A per-token scale
  would be set by those channels and coarsen every other channel of the token; per channel, each
  channel gets a grid of its own size.
- VALUES per token, in groups of `value_group` channels: values have no fixed outlier channels, and
  attention mixes them per token (probability-weighted rows), so a token's error stays its own.

Scales and mins are stored as float16 (the overhead per token is then small next to the payload) and
are rounded *before* the codes are computed (min down, scale up), so the stored grid still covers
[min, max] and the round-trip error is at most half a stored step. float16 tops out at 65504, far
beyond the K/V activations of the models served (|K| < 20, |V| < 14 in SmolLM2); beyond it, quantizing
raises rather than storing NaNs. int4 packs two codes per byte, along the head dimension.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

from mainspring.engine.transfers import upload

_F16 = torch.float16


class Quantized(NamedTuple):
    """Codes (uint8; int4 packs two per byte) with the float16 scale and min of their grid."""

    q: torch.Tensor
    scale: torch.Tensor
    mn: torch.Tensor


def _check_bits(bits: int) -> int:
    if bits not in (8, 4):
        raise ValueError(f"KV cache quantization supports 8 or 4 bits, got {bits!r}")
    return (1 << bits) - 1


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes in [0, 15], last dim 2n -> n bytes: codes [..., :n] in the low nibbles, [..., n:] in the high.

    Halves rather than neighbouring pairs: unpacking is then a concatenation of two contiguous runs,
    where interleaving pairs is a stride-2 write that measured ~3x slower (load() unpacks every step)."""
    n = codes.shape[-1] // 2
    return codes[..., :n] | (codes[..., n:] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4: [..., n] bytes -> [..., 2n] codes."""
    return torch.cat((packed & 0xF, packed >> 4), dim=-1)


def _grid(lo: torch.Tensor, hi: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float16 min and scale whose grid min + [0, qmax] * scale covers [lo, hi] (both fp32).

    The min is rounded down and the scale up, never to nearest, so every value lies on the stored grid's
    span and rounds within half a stored step. To nearest breaks that in two cases real K/V can hit: a
    channel far from zero with a small spread (100.3 +- 0.01: float16 moves the min by up to 0.03, ~500
    steps at int8), and a tiny spread whose step is a float16 subnormal (rounded to zero or to half)."""
    inf = torch.full((), float("inf"), dtype=_F16, device=lo.device)  # filled there: no copy to a GPU
    mn = lo.to(_F16)
    mn = torch.where(mn.float() > lo, torch.nextafter(mn, -inf), mn)
    step = (hi - mn.float()) / qmax
    scale = step.to(_F16)
    scale = torch.where(scale.float() < step, torch.nextafter(scale, inf), scale)
    if not bool(torch.isfinite(mn).all() & torch.isfinite(scale).all()):  # one read of a GPU, not two
        # only values below -65504 or spreads over 65504 steps (float16's max) get here: fail loudly
        # rather than store NaNs
        raise ValueError("KV values beyond the float16 range of the quantization scales")
    # a constant run (zero range) needs no step: any positive scale maps it to code 0 exactly
    scale = torch.where(scale == 0, torch.ones((), dtype=_F16, device=scale.device), scale)
    return mn, scale


def _codes(x: torch.Tensor, mn: torch.Tensor, scale: torch.Tensor, qmax: int) -> torch.Tensor:
    return ((x - mn.float()) / scale.float()).round_().clamp_(0, qmax).to(torch.uint8)


# Dequantization converts the codes to a fresh float tensor and finishes in place in it: one
# output-sized allocation. For keys one fused addcmul (out= the codes) measured ~1.4x faster than
# .mul_().add_() and than addcmul straight on the uint8 codes (a mixed-dtype, unvectorized path).
def _float_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    return (unpack_int4(q) if bits == 4 else q).float()


def quantize_keys(k: torch.Tensor, bits: int) -> Quantized:
    """k [..., block_size, KVH, D] fp32 -> codes of the same shape (int4: D/2 bytes), scale/min [..., KVH, D].

    One grid per (block, head, channel) over the block's tokens: the per-channel layout KIVI uses for
    keys, whose outlier channels would otherwise set every token's scale."""
    qmax = _check_bits(bits)
    k = k.float()
    mn, scale = _grid(k.amin(dim=-3), k.amax(dim=-3), qmax)
    q = _codes(k, mn.unsqueeze(-3), scale.unsqueeze(-3), qmax)
    return Quantized(pack_int4(q) if bits == 4 else q, scale, mn)


def dequantize_keys(q: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of quantize_keys: fp32 [..., block_size, KVH, D]."""
    _check_bits(bits)
    codes = _float_codes(q, bits)
    return torch.addcmul(mn.float().unsqueeze(-3), codes, scale.float().unsqueeze(-3), out=codes)


def _check_group(d: int, group: int) -> None:
    if group <= 0 or group % 2 or d % group:
        raise ValueError(f"value_group must be a positive even divisor of head_dim {d}, got {group}")


def quantize_values(v: torch.Tensor, bits: int, group: int = 32) -> Quantized:
    """v [..., D] fp32 -> codes [..., D] (int4: D/2 bytes), scale/min [..., D/group].

    One grid per token and head for each run of `group` channels (KIVI's per-token value layout)."""
    qmax = _check_bits(bits)
    d = v.shape[-1]
    _check_group(d, group)
    vg = v.float().unflatten(-1, (d // group, group))
    mn, scale = _grid(vg.amin(dim=-1), vg.amax(dim=-1), qmax)
    q = _codes(vg, mn.unsqueeze(-1), scale.unsqueeze(-1), qmax).flatten(-2)
    return Quantized(pack_int4(q) if bits == 4 else q, scale, mn)


def dequantize_values(q: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, bits: int,
                      group: int = 32) -> torch.Tensor:
    """Inverse of quantize_values: fp32 [..., D]."""
    _check_bits(bits)
    codes = _float_codes(q, bits)
    d = codes.shape[-1]
    _check_group(d, group)
    grouped = codes.view(*codes.shape[:-1], d // group, group)
    # mul_ + add_ here, not addcmul: with the scale broadcast along the innermost (group) dim, addcmul
    # takes a slow path that measured ~2x slower than the two in-place passes
    grouped.mul_(scale.float().unsqueeze(-1)).add_(mn.float().unsqueeze(-1))
    return codes


class ColdKVStore:
    """A pool of quantized KV blocks (all layers of a block together), addressed by cold id.

    A block is demoted once, with every layer (store), and read back one layer at a time by the
    attention of each decode step (load), so the pools are laid out [layer, block, ...]: load is one
    index_select per pool and a vectorized dequantization, whatever the number of blocks."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 bits: int, value_group: int = 32, device: torch.device | str = "cpu") -> None:
        """`device`: where the pools live, the hot cache's (a demotion and a load never cross to the host)."""
        _check_bits(bits)
        _check_group(head_dim, value_group)
        self.bits, self.num_blocks, self.block_size = bits, num_blocks, block_size
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.value_group = value_group
        payload = head_dim * bits // 8
        shape = (num_layers, num_blocks)
        # torch.empty: a block's pages are only touched (and count as memory) once it is written
        self.k_q = torch.empty(*shape, block_size, num_kv_heads, payload, dtype=torch.uint8, device=device)
        self.k_scale = torch.empty(*shape, num_kv_heads, head_dim, dtype=_F16, device=device)
        self.k_min = torch.empty(*shape, num_kv_heads, head_dim, dtype=_F16, device=device)
        self.v_q = torch.empty(*shape, block_size, num_kv_heads, payload, dtype=torch.uint8, device=device)
        self.v_scale = torch.empty(*shape, block_size, num_kv_heads, head_dim // value_group, dtype=_F16, device=device)
        self.v_min = torch.empty(*shape, block_size, num_kv_heads, head_dim // value_group, dtype=_F16, device=device)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ... first
        self._is_free = [True] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """n cold ids, all or none: a demotion that cannot fit should keep its blocks hot, not half-move."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of cold KV blocks ({n})")
        if n > len(self._free):
            raise RuntimeError(f"cannot allocate {n} cold KV blocks: {len(self._free)} of {self.num_blocks} free")
        ids = [self._free.pop() for _ in range(n)]
        for i in ids:
            self._is_free[i] = False
        return ids

    def free(self, ids: Iterable[int]) -> None:
        """Returns ids to the pool; checks them all first so a bad id frees none (no half-updated state)."""
        ids = [int(i) for i in ids]
        seen: set[int] = set()
        for i in ids:
            if not 0 <= i < self.num_blocks:
                raise ValueError(f"cold block id {i} out of range [0, {self.num_blocks})")
            if self._is_free[i] or i in seen:
                raise ValueError(f"cold block {i} is already free (double free)")
            seen.add(i)
        for i in ids:
            self._is_free[i] = True
        self._free.extend(ids)

    def store(self, cold_ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantizes hot blocks k, v [num_layers, n, block_size, KVH, D] fp32 into cold_ids [n], all layers.

        Whole blocks only: a key grid spans the block's tokens, so a block is demoted once it is full."""
        want = (self.num_layers, cold_ids.numel(), self.block_size, self.num_kv_heads, self.head_dim)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise ValueError(f"store expects k and v of shape {want}, got {tuple(k.shape)} and {tuple(v.shape)}")
        ids = upload(cold_ids, self.k_q.device, torch.long)
        kq = quantize_keys(k, self.bits)
        vq = quantize_values(v, self.bits, self.value_group)
        for pool, part in ((self.k_q, kq.q), (self.k_scale, kq.scale), (self.k_min, kq.mn),
                           (self.v_q, vq.q), (self.v_scale, vq.scale), (self.v_min, vq.mn)):
            pool.index_copy_(1, ids, part)

    def load(self, layer: int, cold_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized fp32 K and V of cold_ids for one layer, each [n * block_size, KVH, D] in block order.

        On the decode hot path (every layer, every step, every cold block of a sequence): one gather
        of the compact codes per pool (no Python loop over blocks), then dequantization in place in
        the one output-sized tensor it allocates per K and V."""
        ids = upload(cold_ids, self.k_q.device, torch.long)
        n = ids.numel() * self.block_size

        def take(pool: torch.Tensor) -> torch.Tensor:
            return pool[layer].index_select(0, ids)

        k = dequantize_keys(take(self.k_q), take(self.k_scale), take(self.k_min), self.bits)
        v = dequantize_values(take(self.v_q), take(self.v_scale), take(self.v_min), self.bits, self.value_group)
        return k.view(n, self.num_kv_heads, self.head_dim), v.view(n, self.num_kv_heads, self.head_dim)

    def bytes_per_token(self) -> float:
        """Stored bytes per token over all layers, K and V: codes plus float16 scale and min."""
        return self.cost_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.bits, self.block_size,
                                   self.value_group)

    @staticmethod
    def cost_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bits: int, block_size: int,
                       value_group: int) -> float:
        """bytes_per_token of a store with these dimensions, without building one (sizing a pool).

        Keys carry 2 x 2 bytes per channel per *block* (amortized over block_size tokens), values
        2 x 2 bytes per group per token."""
        k = head_dim * bits / 8 + 4 * head_dim / block_size
        v = head_dim * bits / 8 + 4 * head_dim / value_group
        return num_layers * num_kv_heads * (k + v)

    @staticmethod
    def fp32_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """The hot tier's cost (fp32 K and V), the baseline for compression ratios."""
        return num_layers * 2 * num_kv_heads * head_dim * 4
