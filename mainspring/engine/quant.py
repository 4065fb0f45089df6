"""Group-wise int4 weight-only linears on torch's packed int4 CPU kernel.

Each row of a weight [N, K] is cut into groups of `group_size` columns; a group stores 4-bit codes q
in 0..15 with its own scale and minimum, w ~= q * scale + min (asymmetric, so a group whose values
are all positive loses no code to the sign). A decode step multiplies 1..k+1 rows by each weight,
a memory-bound GEMV: streaming ~5 bits per weight (codes + a bf16 scale and zero per group of 32)
instead of 32 is where the speed comes from.

The kernel is `torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)`:
  packed            uint8 [N, K/2] from `_convert_weight_to_int4pack_for_cpu(int32 codes [N, K], 1)`,
                    a CPU-specific tile layout (so the disk cache stores the portable form below)
  scales_and_zeros  [K/group, N, 2] in x's dtype; the kernel computes (q - 8) * scale + zero,
                    so zero = min + 8 * scale
On CUDA it is `_weight_int4pack_mm` (gpt-fast's "tinygemm", tensor cores, sm80 and up) over the same
scales_and_zeros in bf16, with bf16 activations only; its packing `_convert_weight_to_int4pack(uint8 [N, K/2],
inner_k_tiles)` takes two codes a byte like the portable form but column 2j in the *high* nibble.
Measured on the development machine (Xeon, AVX512-BF16 + AMX, torch 2.13, 1 thread, loaded):
with bf16 activations the kernel beats fp32 `F.linear` 1.4-3.6x at 1 row and 1.5-4x at 5 rows;
with fp32 activations it is 15-20x *slower* (an unvectorised path). The same holds without native
bf16: torch's AVX2 and AVX-512 builds of the kernel vectorise the bf16 path only, converting bf16 in
software (AMD EPYC capped at AVX2, the embedded model's linears streamed at 1 row: 11.6 ms per step
on bf16 activations, 134.8 on fp32 ones, 29.8 for fp32 weights), hence `default_compute_dtype`. From
~16 rows on (prefill) the kernel loses to a dense GEMM, so a layer may keep a dense copy of the same
dequantized weight for calls above `KERNEL_MAX_ROWS` rows: bf16 where bf16 is native (oneDNN/AMX, 2-5x
faster than fp32), fp32 elsewhere (the -fast engine asks for it: its prefill then costs what the
standard engine's does), or, in place of a copy, another engine's linear that holds exactly that weight
(engine/shared_prefill.py). The kernel computes each row on its own (bit-identical whatever the other rows); the dense
GEMM does not, and bf16 activations turn the last-bit differences that batching already causes in
attention into bf16-ulp ones, so unlike fp32, int4 greedy text can change with what shares a step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache, partial

import torch
import torch.nn.functional as F
from torch import nn

from mainspring.engine.linear_kernel import PackedLinear, choose
from mainspring.engine.shared_prefill import SharedLinear, share_linear

log = logging.getLogger(__name__)

SUPPORTED_GROUP_SIZES = (32, 64, 128, 256)  # the kernel rejects any other group size
# 32, not 64: the embedded model's GGUF holds Q4_1 blocks of 32 (scale + min each), which int4
# g32 reproduces exactly (max |dW| = 0, perplexity 7.70 -> 7.70 on a short text) while g64 must
# re-round them (perplexity 7.70 -> 10.95). The kernel runs g32 as fast as g64.
DEFAULT_GROUP_SIZE = 32
_N_MULTIPLE = 16  # `_convert_weight_to_int4pack_for_cpu`: "expect N to be dividable by 16"
_MID_CODE = 8  # the kernel subtracts 8 from every code before scaling
# Rows per call up to which the int4 kernel beats a dense bf16 GEMM (measured crossover: 8-16
# rows for the 135M model's shapes at 1 thread); speculative verification of k <= 7 drafts stays
# on the kernel.
KERNEL_MAX_ROWS = 8
# Weights are packed and dequantized this many rows at a time, bounding the temporaries (a whole
# two-pass LM head unpacked to int32 is 226 MB). The kernel's layout works in blocks of at most
# 64 rows, so slices pack to the same bytes as the whole (tests check it).
_SLICE_ROWS = 4096


# Linears quantized in two passes by default: the LM head picks the token. One 4-bit pass over the
# embedded model's (Q8_0) head flipped 8% of teacher-forced top-1 tokens and its answer to "What is
# the capital of France?"; two passes keep 99% (as an fp32 head does with int4 layers) at 4.5 ms
# per token vs 2.0 ms for one pass and 10.6 ms for fp32 (1 thread, loaded machine).
DEFAULT_TWO_PASS = ("lm_head",)


@dataclass(frozen=True)
class Int4Weight:
    """The portable quantized form of one [N, K] weight: what the disk cache stores.

    codes: uint8 [N, passes * K / 2], column 2j in the low nibble and 2j+1 in the high nibble
    scales, mins: fp32 [N, passes * K / group_size]; stored column c stands for
        code[n, c] * scales[n, c // g] + mins[n, c // g]
    With passes=2 the second K columns quantize what the first pass's rounding left over (the
    residual, ~16x smaller), so the weight is the sum of both halves: ~8-bit precision from the
    same kernel, fed [x, x].
    """

    codes: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor
    group_size: int
    passes: int = 1

    @property
    def stored_shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 2

    @property
    def shape(self) -> tuple[int, int]:
        """The [out_features, in_features] of the weight it stands for."""
        n, k = self.stored_shape
        return n, k // self.passes

    def rows(self, start: int, stop: int) -> "Int4Weight":
        return Int4Weight(self.codes[start:stop], self.scales[start:stop], self.mins[start:stop], self.group_size,
                          self.passes)

    def to(self, device: torch.device) -> "Int4Weight":
        return Int4Weight(self.codes.to(device), self.scales.to(device), self.mins.to(device), self.group_size,
                          self.passes)


def unsupported_reason(out_features: int, in_features: int, group_size: int) -> str | None:
    """Why the int4 kernel cannot take a [out_features, in_features] weight, or None if it can."""
    if group_size not in SUPPORTED_GROUP_SIZES:
        return f"group size {group_size} is not one of {SUPPORTED_GROUP_SIZES}"
    if in_features % group_size:
        return f"in_features {in_features} is not a multiple of the group size {group_size}"
    if out_features % _N_MULTIPLE:
        return f"out_features {out_features} is not a multiple of {_N_MULTIPLE} (the kernel's packing)"
    return None


@torch.no_grad()
def quantize_int4(weight: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE, passes: int = 1) -> Int4Weight:
    """Asymmetric group-wise 4-bit quantization of a 2-D weight (round to nearest); `passes=2`
    also quantizes the rounding residual (see `Int4Weight`)."""
    n, k = weight.shape
    reason = unsupported_reason(n, k, group_size)
    if reason:
        raise ValueError(f"cannot quantize a {n}x{k} weight to int4: {reason}")
    if passes not in (1, 2):
        raise ValueError(f"int4 passes must be 1 or 2, got {passes}")
    first = _quantize_once(weight.detach().float(), group_size)
    if passes == 1:
        return first
    second = _quantize_once(weight.detach().float() - dequantize_int4(first), group_size)
    return Int4Weight(torch.cat([first.codes, second.codes], 1), torch.cat([first.scales, second.scales], 1),
                      torch.cat([first.mins, second.mins], 1), group_size, passes=2)


def _quantize_once(weight: torch.Tensor, group_size: int) -> Int4Weight:
    n, k = weight.shape
    groups = weight.reshape(n, k // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    # A constant group gets a tiny scale instead of 0 so the division stays finite; its codes are 0.
    scales = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((groups - lo.unsqueeze(-1)) / scales.unsqueeze(-1)).round_().clamp_(0, 15).to(torch.uint8)
    codes = codes.reshape(n, k)
    nibbles = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return Int4Weight(nibbles.contiguous(), scales.contiguous(), lo.contiguous(), group_size)


def unpack_codes(q: Int4Weight) -> torch.Tensor:
    """The stored codes as uint8 [N, passes * K], one per element."""
    n, k = q.stored_shape
    return torch.stack([q.codes & 0xF, q.codes >> 4], dim=-1).reshape(n, k)


def dequantize_int4(q: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight the quantized form stands for, [N, K] (the reference the kernel is tested against)."""
    n, k = q.stored_shape
    g = q.group_size
    codes = unpack_codes(q).reshape(n, k // g, g).float()
    stored = torch.addcmul(q.mins.unsqueeze(-1), codes, q.scales.unsqueeze(-1)).reshape(n, q.passes, k // q.passes)
    return stored.sum(dim=1).to(dtype)


@lru_cache(maxsize=1)
def native_bf16() -> bool:
    """Whether this CPU does bf16 math natively (AVX512-BF16 / AMX): decides the activation dtype
    of the int4 kernel and whether prefill uses a dense bf16 GEMM (see the module docstring)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def default_compute_dtype() -> torch.dtype:
    """bf16 where the kernel's bf16 path is vectorised (native bf16, or an x86 CPU with AVX2: see the module
    docstring), fp32 elsewhere (not measured there)."""
    from mainspring.engine.cpu import detect

    if native_bf16():
        return torch.bfloat16
    f = detect()
    return torch.bfloat16 if f.x86 and "avx2" in f.flags else torch.float32


def dense_prefill_dtype() -> torch.dtype:
    """The dtype of a layer's dense copy for prefill rows: bf16 where bf16 GEMMs are native, else fp32."""
    return torch.bfloat16 if native_bf16() else torch.float32


def pack_for_kernel(q: Int4Weight, slice_rows: int = _SLICE_ROWS) -> torch.Tensor:
    """The kernel's layout of the stored codes for the device they are on: on the CPU uint8 [N, passes * K / 2], on
    CUDA int32 tiles [N / 8, passes * K / (16 * inner_k_tiles), 32, inner_k_tiles / 2]."""
    if q.codes.device.type == "cuda":
        return torch.ops.aten._convert_weight_to_int4pack(high_nibble_first(q.codes), cuda_inner_k_tiles(q))
    slices = []
    for i in range(0, q.stored_shape[0], slice_rows):
        codes = unpack_codes(q.rows(i, i + slice_rows)).to(torch.int32)
        slices.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))  # 1 inner-k tile
    return torch.cat(slices)


def high_nibble_first(codes: torch.Tensor) -> torch.Tensor:
    """The portable codes (column 2j in the low nibble) in the CUDA packing's byte order (column 2j in the high)."""
    return ((codes << 4) | (codes >> 4)).contiguous()


def cuda_inner_k_tiles(q: Int4Weight) -> int:
    """The most 16-column k-tiles (8, 4 or 2) the CUDA kernel can load at once that divide the stored K."""
    k = q.stored_shape[1]
    return next(t for t in (8, 4, 2) if k % (16 * t) == 0)  # K is a multiple of the group size, so of 32


def _dequantize_sliced(q: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=dtype, device=q.codes.device)
    for i in range(0, q.shape[0], _SLICE_ROWS):
        out[i : i + _SLICE_ROWS] = dequantize_int4(q.rows(i, i + _SLICE_ROWS), dtype)
    return out


class Int4Linear(nn.Module):
    """y = x @ W^T + b with W held as group-wise int4; a drop-in for `nn.Linear` in inference.

    Calls with at most `kernel_max_rows` rows run the int4 kernel on `compute_dtype` activations;
    larger ones (prefill) run a dense GEMM on `dense_weight` when the layer keeps one (the same
    dequantized weight in bf16), else the kernel too. Input and output dtype stay the caller's.
    """

    # buffers (register_buffer), declared for the type checker
    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    bias: torch.Tensor | None
    dense_weight: torch.Tensor | None

    def __init__(self, q: Int4Weight, bias: torch.Tensor | None = None, compute_dtype: torch.dtype | None = None,
                 dense_prefill: bool | None = None, kernel_max_rows: int = KERNEL_MAX_ROWS,
                 shared: SharedLinear | None = None, device: torch.device | str | None = None) -> None:
        """`device`: where the layer runs (default: where `q` is); its buffers are packed for that device's kernel.
        `shared` is a linear on the CPU (its probe runs there): the engine passes none on CUDA."""
        super().__init__()
        device = torch.device(device) if device is not None else q.codes.device
        q = q.to(device)
        on_cuda = device.type == "cuda"
        if on_cuda and compute_dtype not in (None, torch.bfloat16):
            raise ValueError(f"the CUDA int4 kernel takes bf16 activations, not {compute_dtype}")
        self.out_features, self.in_features = q.shape
        self.group_size = q.group_size
        self.passes = q.passes
        self.compute_dtype = torch.bfloat16 if on_cuda else compute_dtype or default_compute_dtype()
        self.kernel_max_rows = kernel_max_rows
        self.register_buffer("packed", pack_for_kernel(q))
        zeros = q.mins + _MID_CODE * q.scales  # the kernel's zero point for code 8
        sz = torch.stack([q.scales, zeros], dim=-1).transpose(0, 1).contiguous()  # [K/g, N, 2]
        self.register_buffer("scales_and_zeros", sz.to(self.compute_dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().float().to(device, copy=True))
        if dense_prefill is None:  # by default only where it costs half the fp32 bytes (bf16 native)
            dense_prefill = native_bf16() and not on_cuda
        # another engine's linear over the same weight runs the prefill rows (shared_prefill.py): no copy of its own
        self.shared = shared
        dense_dtype = torch.bfloat16 if on_cuda else dense_prefill_dtype()
        dense = _dequantize_sliced(q, dense_dtype) if dense_prefill and self.shared is None else None
        # an fp32 copy runs on oneDNN prepacked where that is the faster (MKL takes a slow path on AMD: 2.6x at
        # prefill sizes, engine/linear_kernel.py); MKL's own packing gains only at a few rows, which prefill never is
        self.dense_packed: PackedLinear | None = None
        if dense is not None and dense.dtype == torch.float32 and choose("auto", [q.shape], kernels=("onednn",)) \
                == "onednn":
            self.dense_packed, dense = PackedLinear(dense), None
        self.register_buffer("dense_weight", dense)
        self._mm = torch.ops.aten._weight_int4pack_mm if on_cuda else torch.ops.aten._weight_int4pack_mm_for_cpu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        shared = self.shared.get() if self.shared is not None and x2.shape[0] > self.kernel_max_rows else None
        if shared is not None:  # its own bias included
            return shared(x2.to(dense_prefill_dtype())).to(x.dtype).reshape(*lead, self.out_features)
        if self.dense_packed is not None and x2.shape[0] > self.kernel_max_rows:
            y = self.dense_packed(x2.float())
        elif self.dense_weight is not None and x2.shape[0] > self.kernel_max_rows:
            y = F.linear(x2.to(self.dense_weight.dtype), self.dense_weight)
        else:
            xc = x2.to(self.compute_dtype)
            if self.passes == 2:  # [x, x] @ [W1, W2]^T = x @ (W1 + W2)^T in one kernel call
                xc = torch.cat([xc, xc], dim=1)
            y = self._mm(xc.contiguous(), self.packed, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"passes={self.passes}, compute_dtype={self.compute_dtype}, "
                f"dense_prefill={self.dense_weight is not None or self.dense_packed is not None}, "
                f"shared_prefill={self.shared is not None}")


@dataclass
class QuantReport:
    """What `quantize_model` did: which linears are int4, which stayed fp32 and why."""

    group_size: int
    quantized: list[str] = field(default_factory=list)
    kept_fp32: dict[str, str] = field(default_factory=dict)  # module name -> reason
    num_quantized_now: int = 0  # weights quantized by this call (the rest came from `weights`)
    shared_prefill: list[str] = field(default_factory=list)  # layers whose prefill runs another engine's linear
    from_cache: bool = False
    cache_file: str | None = None
    seconds: float = 0.0


def quantizable_linears(model: nn.Module, include_lm_head: bool = True) -> dict[str, nn.Linear | PackedLinear]:
    """Every fp32 linear of the model by module name (the fused qkv / gate_up, o / down, and the LM
    head unless excluded; `nn.Linear`, or oneDNN-packed: both have .weight and .bias). Embeddings are
    not linears: they stay fp32, even when tied."""
    return {name: m for name, m in model.named_modules()
            if (isinstance(m, nn.Linear) or (isinstance(m, PackedLinear) and m.dtype == torch.float32))
            and (include_lm_head or name != "lm_head")}


@torch.no_grad()
def quantize_model(model: nn.Module, group_size: int = DEFAULT_GROUP_SIZE, include_lm_head: bool = True,
                   two_pass: tuple[str, ...] = DEFAULT_TWO_PASS, weights: dict[str, Int4Weight] | None = None,
                   compute_dtype: torch.dtype | None = None,
                   dense_prefill: bool | None = None, shared: Mapping[str, nn.Module] | None = None,
                   device: torch.device | None = None) -> tuple[QuantReport, dict[str, Int4Weight]]:
    """Replace the model's linears by `Int4Linear`s, in place; those named in `two_pass` get two
    int4 passes (~8-bit, see `Int4Weight`). A layer that would keep a dense copy for prefill runs another
    engine's linear of the same name from `shared` instead where that computes the same weight (shared_prefill.py).
    `device`: where the int4 layers run (default: where each linear's weight is).

    `weights` are already-quantized forms by module name (from the disk cache); missing ones are
    quantized here. Linears whose shape the kernel cannot take stay fp32, with the reason logged
    and reported. Returns the report and the quantized forms (what a cache would store). Already
    quantized modules are not `nn.Linear`s, so a second call changes nothing.
    """
    start = time.perf_counter()
    report = QuantReport(group_size)
    forms: dict[str, Int4Weight] = {}
    linears = quantizable_linears(model, include_lm_head)
    while linears:  # popped, so each replaced fp32 weight can be freed before the next is quantized
        name = next(iter(linears))
        linear = linears.pop(name)
        reason = unsupported_reason(linear.out_features, linear.in_features, group_size)
        if reason:
            report.kept_fp32[name] = reason
            continue
        passes = 2 if name in two_pass else 1
        q = (weights or {}).get(name)
        if q is None or (q.group_size, q.passes, q.shape) != (group_size, passes, tuple(linear.weight.shape)):
            q = quantize_int4(linear.weight, group_size, passes)
            report.num_quantized_now += 1
        forms[name] = q
        keeps_copy = native_bf16() if dense_prefill is None else dense_prefill
        share = share_linear(shared, name, linear.weight, partial(_dequantize_sliced, q, torch.float32), linear.bias,
                             dense_prefill_dtype()) if shared and keeps_copy else None
        if share is not None:
            report.shared_prefill.append(name)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, Int4Linear(q, linear.bias, compute_dtype, dense_prefill,
                                                              shared=share, device=device or linear.weight.device))
        report.quantized.append(name)
    _log_kept(report.kept_fp32)
    report.seconds = time.perf_counter() - start
    return report, forms


def _log_kept(kept: dict[str, str]) -> None:
    by_reason: dict[str, list[str]] = {}
    for name, reason in kept.items():
        by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        log.info("int4: %d linear(s) stay fp32 (%s): %s", len(names), reason,
                 ", ".join(names[:3]) + (", ..." if len(names) > 3 else ""))
